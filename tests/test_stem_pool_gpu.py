"""The fused stem + max-pool kernel (plugins/kernels/stem_pool.cu) on the GPU: fresh random data, output poisoned
first, against the golden conv then max-pool (plugins/reference.py), and bit-identical to the two kernels it replaces
(the space-to-depth stem conv, then trtfuse_maxpool_chw32). Skips (saying why) where there is no GPU."""

import numpy as np
import pytest

from trtfuse.bench.conv_problem import ConvProblem, DeviceConv, DeviceStemPool, compare, passes_lsb_rule
from trtfuse.plugins import stem
from trtfuse.plugins.conv import ConvLaunch
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.tactics import ConvShape

ok, why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU: {why}")]

# ResNet's stem at 224 (whole tiles), at 64, and odd sizes whose last tiles are partial in both directions
SHAPES = [ConvShape(2, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3)),
          ConvShape(3, 3, 64, 64, 64, 7, 7, (2, 2), (3, 3, 3, 3)),
          ConvShape(2, 3, 70, 45, 64, 7, 7, (2, 2), (3, 3, 3, 3)),
          ConvShape(1, 3, 9, 13, 64, 7, 7, (2, 2), (3, 3, 3, 3))]


@pytest.mark.parametrize("use_wgmma", [None, False], ids=["device-default", "mma-sync"])
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.n}x{s.h}x{s.w}")
def test_stem_pool_equals_golden_and_the_two_kernels(shape, relu, use_wgmma):
    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins import network_ops

    assert stem.pool_refusal(shape, stem.POOL_WINDOW) is None
    problem = ConvProblem.random(shape, False, relu)
    fused = DeviceStemPool(problem, use_wgmma)
    out, raw = fused.run_checked()
    stats = compare(out, fused.golden())
    assert passes_lsb_rule(stats), stats
    assert not raw.transpose(0, 1, 4, 2, 3).reshape(shape.n, -1, *raw.shape[2:4])[:, shape.k:].any()

    folded = problem.folded()
    conv = DeviceConv(folded, ConvLaunch.plan(folded.shape))
    conv.run_checked()
    oh, ow = shape.out_hw
    pooled = cd.DeviceBuffer(raw.nbytes)
    pooled.fill(0x5A)
    network_ops.maxpool(conv.y.ptr, shape.n, shape.k, oh, ow, *stem.POOL_WINDOW, pooled.ptr)
    cd.check(cd._driver().cuCtxSynchronize())
    assert np.array_equal(pooled.download(raw.shape, np.int8), raw), "the fused kernel must equal conv then max-pool bit for bit"


def _device_tiles():
    from trtfuse.plugins import cuda_driver as cd

    return stem.pool_tiles(cd.compute_capability(cd.current_device())) if ok else stem.GRID_TILES


@pytest.mark.parametrize("tile", [t for t in stem.POOL_TILES if t != stem.POOL_TILE], ids=stem.tile_name)
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: f"{s.n}x{s.h}x{s.w}")
def test_every_tile_equals_golden(shape, tile):
    if tile not in _device_tiles():
        pytest.skip(f"stem tile {stem.tile_name(tile)} needs Hopper's wgmma")
    problem = ConvProblem.random(shape, False)
    fused = DeviceStemPool(problem, tile=tile)
    out, _ = fused.run_checked()
    stats = compare(out, fused.golden())
    assert passes_lsb_rule(stats), (tile, stats)


@pytest.mark.parametrize("tile", stem.ROW_TILES, ids=stem.tile_name)
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("shape", SHAPES + [ConvShape(1, 3, 40, 300, 64, 7, 7, (2, 2), (3, 3, 3, 3))],
                         ids=lambda s: f"{s.n}x{s.h}x{s.w}")
def test_row_tiles_pool_the_accumulators_bit_identically(shape, relu, tile):
    """stem_pool_rows.cu pools the int32 accumulators and requantizes once: bit-identical to the golden conv then
    max-pool and to the kernel that requantizes every conv pixel first, with a third of the channels' factors
    negative (their minimum pooled) and one zero; 300 columns make 2 tiles of 64 pooled columns."""
    if tile not in _device_tiles():
        pytest.skip(f"stem tile {stem.tile_name(tile)} needs Hopper's wgmma")
    problem = ConvProblem.random(shape, False, relu)
    problem.scale[: shape.k : 3] *= -1
    problem.scale[1] = 0.0
    rows = DeviceStemPool(problem, tile=tile)
    out, raw = rows.run_checked()
    stats = compare(out, rows.golden())
    assert stats["exact_fraction"] == 1.0, stats
    _, raw_grid = DeviceStemPool(problem).run_checked()
    assert np.array_equal(raw, raw_grid)


def test_stem_pool_replays_give_the_same_bits():
    problem = ConvProblem.random(SHAPES[1], False)
    fused = DeviceStemPool(problem)
    first, _ = fused.run_checked()
    for _ in range(3):
        again, _ = fused.run_checked()
        assert np.array_equal(first, again)


@pytest.mark.parametrize("tile", [stem.POOL_TILE, *stem.ROW_TILES], ids=stem.tile_name)
@pytest.mark.parametrize("shape", SHAPES[1:3], ids=lambda s: f"{s.n}x{s.h}x{s.w}")
def test_images_read_in_place_by_index_equal_the_gathered_batch(shape, tile):
    """image_index: image i of the batch is image index[i] of the library, read where it lies (the Offline harness's
    device samples), with the same bits as that image in a batch of its own."""
    from trtfuse.plugins import cuda_driver as cd

    if tile not in _device_tiles():
        pytest.skip(f"stem tile {stem.tile_name(tile)} needs Hopper's wgmma")
    problem = ConvProblem.random(shape, False)
    fused = DeviceStemPool(problem, tile=tile)
    _, whole = fused.run_checked()  # the library's images in their own order
    order = np.array([shape.n - 1] + list(range(shape.n - 1)), np.int64)
    order[-1] = order[0]  # a permutation with a repeat, as a padded last batch has
    index = cd.DeviceBuffer.from_array(order)
    fused.y.fill(0x5A)
    stem.launch_stem_pool(shape, fused.x.ptr, fused.w.ptr, fused.scale.ptr, fused.bias.ptr, fused.out_scale.ptr, fused.y.ptr,
                          relu=problem.relu, tile=fused.tile, image_index=index.ptr)
    cd.check(cd._driver().cuCtxSynchronize())
    assert np.array_equal(fused.y.download(fused.y_shape, np.int8), whole[order])


@pytest.mark.parametrize("tile", stem.ROW_TILES, ids=stem.tile_name)
@pytest.mark.parametrize("relu", [True, False], ids=["conv1-relu", "conv1-no-relu"])
@pytest.mark.parametrize("shape", SHAPES + [ConvShape(1, 3, 40, 300, 64, 7, 7, (2, 2), (3, 3, 3, 3))],
                         ids=lambda s: f"{s.n}x{s.h}x{s.w}")
def test_the_next_conv_inside_equals_golden_and_its_own_kernel(shape, relu, tile):
    """STEM_POOL_ROWS_CONV1: the 1x1 64 -> 64 conv on the pooled output (ResNet's res2 first conv1) computed from each
    pooled row as it is written: both outputs poisoned first, the pooled one as without it, the conv's equal to its
    golden on the pooled golden and to the conv kernel run on the pooled tensor, bit for bit; a third of its factors
    negative."""
    if tile not in _device_tiles():
        pytest.skip(f"stem tile {stem.tile_name(tile)} needs Hopper's wgmma")
    from dataclasses import replace

    problem = ConvProblem.random(shape, False, True)
    ph, pw = stem.pooled_hw(shape)
    conv1 = ConvProblem.random(ConvShape(shape.n, 64, ph, pw, 64, 1, 1, residual=False), False, relu)
    conv1.scale[::3] *= -1
    assert stem.conv1_refusal(shape, conv1.shape, tile) is None
    fused = DeviceStemPool(problem, tile=tile, conv1=conv1)
    out, raw = fused.run_checked()
    assert compare(out, fused.golden())["exact_fraction"] == 1.0
    _, raw_alone = DeviceStemPool(problem, tile=tile).run_checked()
    assert np.array_equal(raw, raw_alone)
    y1, raw1 = fused.conv1_output()
    stats = compare(y1, fused.conv1.golden())
    assert stats["exact_fraction"] == 1.0, stats
    _, raw_kernel = DeviceConv(fused.conv1, ConvLaunch.plan(fused.conv1.shape)).run_checked()
    assert np.array_equal(raw1, raw_kernel)

