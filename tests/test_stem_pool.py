"""Which stems the fused stem + max-pool kernel takes (plugins/stem.py: pool_refusal) and that it compiles for every
architecture without spills. CPU only."""

import pytest

from trtfuse.plugins import stem
from trtfuse.plugins.nvrtc import compile_kernel
from trtfuse.plugins.tactics import ConvShape

RESNET_STEM = ConvShape(256, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3))


def test_resnet_stem_and_pool_are_taken():
    assert stem.pool_refusal(RESNET_STEM, (3, 2, 1)) is None
    assert stem.pooled_hw(RESNET_STEM) == (56, 56)


@pytest.mark.parametrize("shape,pool,reason", [
    (RESNET_STEM, (2, 2, 0), "pools 3x3/2 pad 1"),
    (ConvShape(1, 3, 224, 224, 32, 7, 7, (2, 2), (3, 3, 3, 3)), (3, 2, 1), "computes 64"),
    (ConvShape(1, 3, 224, 224, 64, 3, 3, (2, 2), (1, 1, 1, 1)), (3, 2, 1), "runs 4x4"),
    (ConvShape(1, 3, 224, 224, 64, 7, 7, (1, 1), (3, 3, 3, 3)), (3, 2, 1), "not a space-to-depth stem"),
    (ConvShape(1, 8, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3)), (3, 2, 1), "not a space-to-depth stem"),
], ids=["pool-2x2", "32-channels", "3x3-stem", "stride-1", "8-input-channels"])
def test_other_stems_are_refused_with_the_reason(shape, pool, reason):
    assert reason in stem.pool_refusal(shape, pool)


@pytest.mark.parametrize("tile", stem.POOL_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("device_arch,use_wgmma", [("sm_80", None), ("sm_90", None), ("sm_90", False)],
                         ids=["sm_80", "sm_90-wgmma", "sm_90-mma-sync"])
def test_stem_pool_compiles_without_spills(device_arch, use_wgmma, tile):
    # the kernel's static_assert holds pool_smem_bytes to its own SMEM_BYTES: a wrong count fails this compile
    arch, defines, smem = stem.pool_variant(device_arch, use_wgmma, tile)
    assert ("STEM_POOL_WGMMA" in defines) == (device_arch == "sm_90" and use_wgmma is None)
    assert smem <= 163 * 1024  # sm_80's per-block limit (Hopper allows 227 KB)
    k = compile_kernel(stem.POOL_SOURCE, defines, arch, "cubin")
    assert set(k.resources) == {stem.POOL_ENTRY}
    assert not k.spills() and all(r["stack"] == 0 for r in k.resources.values())


def test_a_wrong_shared_memory_count_does_not_compile():
    from trtfuse.errors import TrtfuseError

    arch, defines, smem = stem.pool_variant("sm_90", None, (8, 14))
    with pytest.raises((TrtfuseError, RuntimeError), match="pool_smem_bytes"):
        compile_kernel(stem.POOL_SOURCE, {**defines, "STEM_POOL_SMEM": smem - 16}, arch, "cubin", use_cache=False)
