"""The wgmma kernels' SASS (bench/sass.py): no instruction touches a wgmma's accumulators while it is in flight, and the
stem kernel reads every block's accumulators before the next block on that set overwrites them (the hazard ptxas
produced there, docs/design/stem-pool.md). CPU only: NVRTC compiles, nvdisasm (the test extras) disassembles."""

import pytest

from trtfuse.bench import sass
from trtfuse.plugins import chain_conv, stem, wgmma
from trtfuse.plugins.nvrtc import compile_kernel
from trtfuse.plugins.tactics import WGMMA_TACTICS

needs_nvdisasm = pytest.mark.skipif(sass.nvdisasm() is None, reason="needs nvdisasm: pip install nvidia-cuda-nvdisasm")

# A block pooled in registers, then the next block on the same accumulators (R24..R55): the listing as ptxas first
# scheduled the stem kernel, with the pooling of R25 moved after the next wgmma, and as it should be.
WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
BLOCK = ["WARPGROUP.ARRIVE ;", "IGMMA.64x64x32.S8.S8 R24, R92, gdesc[UR28], R24, UP1 ;",
         "IGMMA.64x64x32.S8.S8 R24, R96, gdesc[UR28], R24, gsb0 ;", WAIT]
POOL = [f"VIMNMX R{100 + r}, R{100 + r}, R{24 + r}, !PT ;" for r in range(32)]


def test_the_rules_find_the_stem_hazard_and_pass_its_fix():
    sound = BLOCK + POOL + BLOCK + POOL
    assert sass.in_flight_uses(sound) == [] and sass.unread_accumulators(sound) == []
    late = BLOCK + POOL[:2] + BLOCK[:2] + POOL[2:3] + BLOCK[2:] + POOL  # R26 read while the second block runs
    assert len(sass.in_flight_uses(late)) == 1 and "VIMNMX R102" in sass.in_flight_uses(late)[0]
    lost = BLOCK + POOL[:2] + BLOCK + POOL  # R26.. of the first block never read: its values are lost
    assert sass.unread_accumulators(lost) == [f"{BLOCK[1]}: 2 of 32 read"]
    # a write to an accumulator register does not count as reading it, a store's operands do
    assert sass.unread_accumulators(BLOCK + ["MOV R24, RZ ;"]) == [f"{BLOCK[1]}: 0 of 32 read"]
    stores = [f"STG.E [R2.64], R{24 + r} ;" for r in range(32)]
    assert sass.unread_accumulators(BLOCK + stores) == []


def _lines(image: bytes) -> list[str]:
    lines = sass.disassemble(image)
    assert sass.wgmma_groups(lines), "no wgmma in the kernel"
    return lines


@needs_nvdisasm
@pytest.mark.parametrize("conv1", [False, True], ids=["stem", "stem-and-next-conv"])
@pytest.mark.parametrize("tile", stem.ROW_TILES, ids=stem.tile_name)
def test_the_stem_reads_every_block_before_its_accumulators_are_written_again(tile, conv1):
    """With the next conv inside (STEM_POOL_ROWS_CONV1), its two wgmma write the first set too, between a pooled row's
    last block and the next row's first: every group's accumulators must still be read before they are written."""
    arch, defines, _ = stem.pool_variant("sm_90", None, tile, conv1)
    source, _, _ = stem.pool_source(tile)
    lines = _lines(compile_kernel(source, defines, arch, "cubin").image)
    assert sass.in_flight_uses(lines) == []
    assert sass.unread_accumulators(lines) == []


WGMMA_BUILDS = ([(f"w{t.id}", lambda t=t: wgmma.compile_tactic(t, "cubin").image) for t in WGMMA_TACTICS]
                + [(f"chain {'-'.join(map(str, key))}", lambda key=key: chain_conv.compile_chain(key, "cubin").image)
                   for key in chain_conv.VARIANTS]
                + [(f"chain {'-'.join(map(str, key))} ds", lambda key=key: chain_conv.compile_chain(key, "cubin", downsample=True).image)
                   for key in chain_conv.DOWNSAMPLE_VARIANTS]
                + [(f"stem {stem.tile_name(t)}", lambda t=t: compile_kernel(
                    stem.pool_source(t)[0], stem.pool_variant("sm_90", None, t)[1], "sm_90a", "cubin").image)
                   for t in stem.pool_tiles("sm_90")]
                + [(f"stem {stem.tile_name(t)} + next conv", lambda t=t: compile_kernel(
                    stem.ROWS_SOURCE, stem.pool_variant("sm_90", None, t, conv1=True)[1], "sm_90a", "cubin").image)
                   for t in stem.ROW_TILES])


@needs_nvdisasm
@pytest.mark.parametrize("build", [b for _, b in WGMMA_BUILDS], ids=[n for n, _ in WGMMA_BUILDS])
def test_no_wgmma_kernel_touches_accumulators_in_flight(build):
    assert sass.in_flight_uses(_lines(build())) == []
