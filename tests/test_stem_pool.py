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


VARIANTS = [("sm_80", None), ("sm_90", None), ("sm_90", False)]


@pytest.mark.parametrize("device_arch,use_wgmma,tile",
                         [(a, w, t) for a, w in VARIANTS for t in stem.pool_tiles(a, w)],
                         ids=lambda v: v if isinstance(v, str) else stem.tile_name(v) if isinstance(v, tuple)
                         else {None: "default", False: "mma-sync"}[v])
def test_stem_pool_compiles_without_spills(device_arch, use_wgmma, tile):
    # each kernel's static_assert holds pool_smem_bytes to its own SMEM_BYTES: a wrong count fails this compile
    arch, defines, smem = stem.pool_variant(device_arch, use_wgmma, tile)
    wgmma = device_arch == "sm_90" and use_wgmma is None
    assert ("STEM_POOL_WGMMA" in defines or "STEM_POOL_ROWS" in defines) == wgmma
    assert smem <= (227 if wgmma else 163) * 1024  # the per-block limits of Hopper and sm_80
    source, entry, _threads = stem.pool_source(tile)
    k = compile_kernel(source, defines, arch, "cubin")
    assert set(k.resources) == {entry}
    assert not k.spills() and all(r["stack"] == 0 for r in k.resources.values())


def test_row_tiles_are_hopper_only_and_named_apart():
    assert set(stem.ROW_TILES) <= set(stem.pool_tiles("sm_90")) and not set(stem.ROW_TILES) & set(stem.pool_tiles("sm_80"))
    assert not set(stem.ROW_TILES) & set(stem.pool_tiles("sm_90", False))
    with pytest.raises(ValueError, match="wgmma only"):
        stem.pool_variant("sm_80", None, stem.ROW_TILES[0])
    names = [stem.tile_name(t) for t in stem.POOL_TILES]
    assert len(set(names)) == len(names) and "rows8" in names and "8x14" in names
    assert all(stem.tile_from_name(stem.tile_name(t)) == t for t in stem.POOL_TILES)
    with pytest.raises(ValueError, match="not a stem tile"):
        stem.tile_from_name("8x64")


def test_a_wrong_shared_memory_count_does_not_compile():
    from trtfuse.errors import TrtfuseError

    arch, defines, smem = stem.pool_variant("sm_90", None, (8, 14))
    with pytest.raises((TrtfuseError, RuntimeError), match="pool_smem_bytes"):
        compile_kernel(stem.POOL_SOURCE, {**defines, "STEM_POOL_SMEM": smem - 16}, arch, "cubin", use_cache=False)
    arch, defines, smem = stem.pool_variant("sm_90", None, stem.ROW_TILES[0])
    with pytest.raises((TrtfuseError, RuntimeError), match="pool_smem_bytes"):
        compile_kernel(stem.ROWS_SOURCE, {**defines, "STEM_POOL_ROWS_SMEM": smem - 16}, arch, "cubin", use_cache=False)


def test_the_next_conv_runs_inside_the_row_tiles_only():
    s = ConvShape(3, 3, 64, 64, 64, 7, 7, (2, 2), (3, 3, 3, 3))
    ph, pw = stem.pooled_hw(s)
    ok_conv = ConvShape(s.n, 64, ph, pw, 64, 1, 1, residual=False)
    assert stem.conv1_refusal(s, ok_conv, stem.ROW_TILES[0]) is None
    assert "row tiles" in stem.conv1_refusal(s, ok_conv, stem.POOL_TILE)
    assert "computes 64" in stem.conv1_refusal(s, ConvShape(s.n, 64, ph, pw, 256, 1, 1, residual=False), stem.ROW_TILES[0])
    assert "1x1 stride 1" in stem.conv1_refusal(s, ConvShape(s.n, 64, ph, pw, 64, 3, 3, (1, 1), (1, 1, 1, 1), residual=False), stem.ROW_TILES[0])
    assert "pooled output" in stem.conv1_refusal(s, ConvShape(s.n, 64, ph + 1, pw, 64, 1, 1, residual=False), stem.ROW_TILES[0])
    assert "residual" in stem.conv1_refusal(s, ConvShape(s.n, 64, ph, pw, 64, 1, 1), stem.ROW_TILES[0])


@pytest.mark.parametrize("tile", stem.ROW_TILES, ids=stem.tile_name)
def test_the_row_tiles_with_the_next_conv_compile_without_spills(tile):
    arch, defines, smem = stem.pool_variant("sm_90", None, tile, conv1=True)
    assert defines["STEM_POOL_ROWS_CONV1"] == 1 and smem == stem.pool_smem_bytes(tile, True) + 2 * 64 * 64 + 2 * 64 * 4
    assert smem * 2 <= 227 * 1024  # two CTAs an SM, as without it
    k = compile_kernel(stem.ROWS_SOURCE, defines, arch, "cubin")
    assert set(k.resources) == {stem.ROWS_ENTRY}
    assert not k.spills() and k.resources[stem.ROWS_ENTRY]["stack"] == 0, k.log
    wgmma = "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8"
    plain = compile_kernel(stem.ROWS_SOURCE, stem.pool_variant("sm_90", None, tile)[1], arch, "ptx").image.decode(errors="replace")
    ptx = compile_kernel(stem.ROWS_SOURCE, defines, arch, "ptx").image.decode(errors="replace")
    assert ptx.count(wgmma) == plain.count(wgmma) + 2  # the next conv's two k32 steps (64 input channels)
    with pytest.raises(ValueError, match="row tiles"):
        stem.pool_variant("sm_90", None, stem.POOL_TILE, conv1=True)
