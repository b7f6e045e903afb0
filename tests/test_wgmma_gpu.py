"""The Hopper wgmma tactic (plugins/kernels/wgmma_conv.cu) against the golden reference on the GPU:
fresh random data each run, output poisoned first, every wgmma tile on 1x1 / 3x3 / strided / padded /
multi-image / partial-channel-tile shapes, CHW32 padding channels written as 0, and the launch plan
the heuristic makes by default on sm_90. Skips, saying why, without a GPU or on a GPU without wgmma
(anything but compute capability 9.0)."""

import dataclasses

import numpy as np
import pytest

from trtfuse.bench.conv_problem import POISON, ConvProblem, DeviceConv, compare, passes_lsb_rule
from trtfuse.bench.wgmma_check import EDGE_CASES
from trtfuse.plugins.conv import ConvLaunch
from trtfuse.plugins.cuda_driver import gpu_available
from trtfuse.plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS, ConvShape

ok, why = gpu_available()
if ok:
    from trtfuse.plugins.cuda_driver import compute_capability

    arch = compute_capability()
    if arch != "sm_90":
        ok, why = False, f"the wgmma tactic needs an sm_90 (Hopper) GPU, this one is {arch}"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ok, reason=f"needs a Hopper GPU: {why}")]


def _check(shape, has_res, tactic, relu=True):
    problem = ConvProblem.random(shape, has_res, relu)
    shape = problem.shape  # its `residual` is has_res
    dev = DeviceConv(problem, ConvLaunch(shape, tactic, 1))
    out, raw = dev.run_checked()
    stats = compare(out, problem.golden())
    assert passes_lsb_rule(stats), (shape, tactic.name, stats)
    padded = raw.transpose(0, 1, 4, 2, 3).reshape(shape.n, -1, *raw.shape[2:4])
    assert not padded[:, shape.k:].any(), "CHW32 padding channels must be written as 0"
    return stats


@pytest.mark.parametrize("tactic", WGMMA_TACTICS, ids=[t.name for t in WGMMA_TACTICS])
@pytest.mark.parametrize("label,shape,has_res,relu", EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_wgmma_tactic_matches_golden(label, shape, has_res, relu, tactic):
    shape = dataclasses.replace(shape, residual=has_res)
    if tactic.geometry(shape) is None:
        pytest.skip(f"{tactic.name} does not take {label}")
    _check(shape, has_res, tactic, relu)


def test_wgmma_is_deterministic_and_replays():
    shape = ConvShape(4, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1))
    problem = ConvProblem.random(shape, True)
    dev = DeviceConv(problem, ConvLaunch(shape, WGMMA_TACTICS[2], 1))
    first, _ = dev.run_checked()
    for _ in range(3):
        again, _ = dev.run_checked()
        assert (again == first).all()
    assert passes_lsb_rule(compare(first, problem.golden()))


def test_heuristic_plan_by_default(monkeypatch):
    monkeypatch.delenv("TRTFUSE_WGMMA", raising=False)
    shape = ConvShape(68, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1))  # long K, >= one wave of CTAs: wgmma
    plan = ConvLaunch.plan(shape)
    # choose_wgmma's rule: a wgmma tile only where its grid fills at least one wave of the 132 SMs
    assert plan.tactic.family == "wgmma" and plan.splits == 1 and plan.grid[0] >= 132
    problem = ConvProblem.random(shape, True)
    out, _ = DeviceConv(problem, plan).run_checked()
    assert passes_lsb_rule(compare(out, problem.golden()))


def test_persistent_ctas_walk_several_tiles(monkeypatch):
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "3")  # 3 CTAs for 8 tiles: the ring runs on across tiles
    tactic = next(t for t in WGMMA_TACTICS if t.persistent)
    shape = ConvShape(2, 64, 20, 20, 256, 3, 3, (1, 1), (1, 1, 1, 1))
    assert ConvLaunch(shape, tactic, 1).grid == (3, 1, 1) and tactic.geometry(shape).ctas > 3
    _check(shape, True, tactic)


@pytest.mark.parametrize("tactic_id", [60, 61, 62, 64])
def test_halo_windows_walk_several_tiles(monkeypatch, tactic_id):
    # 3 CTAs for 20 tiles: the window ring's uses and phases run on across tiles (its slot count does not
    # divide a tile's 5 windows), the last tile of each image is short (29 rows in tiles of 6), and the
    # padding is zero-filled.
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "3")
    tactic = TACTICS_BY_ID[tactic_id]
    shape = ConvShape(2, 160, 29, 28, 256, 3, 3, (1, 1), (1, 1, 1, 1))
    geo = tactic.geometry(shape)
    assert geo is not None and geo.ctas > 3 and geo.kt // 9 % tactic.halo_stages != 0 and 29 % geo.th != 0
    _check(shape, True, tactic)


@pytest.mark.parametrize("tactic_id", [60, 64, 70])
def test_windows_hold_several_images_side_by_side(monkeypatch, tactic_id):
    # 7 x 7 maps: NB images side by side in one window (pitch 8, one shared padding column), 11 images so the batch's
    # last tile is short; 2 CTAs walk the tiles, a window ring whose slot count does not divide a tile's 4 windows.
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "2")
    tactic = TACTICS_BY_ID[tactic_id]
    shape = ConvShape(11, 128, 7, 7, 128, 3, 3, (1, 1), (1, 1, 1, 1))
    geo = tactic.geometry(shape)
    assert geo is not None and geo.nb > 1 and 11 % geo.nb != 0 and geo.pitch == 8 and geo.wh == 8 * geo.nb
    assert geo.kt // 9 % tactic.halo_stages != 0 and geo.ctas > 2
    _check(shape, True, tactic)
    _check(shape, False, tactic)


@pytest.mark.parametrize("has_res", [True, False], ids=["residual", "paired-staging"])
@pytest.mark.parametrize("ctas", ["4", "6", ""], ids=["ten-tiles-per-cta", "five-tiles-per-cta", "one-tile-per-cta"])
@pytest.mark.parametrize("tactic_id", [70, 71, 73])
def test_channel_pingpong_walks_several_tiles(monkeypatch, tactic_id, ctas, has_res):
    # Each consumer warpgroup a 64-channel tile of its own, taking turns: 3 channel tiles (the last one 32 channels,
    # K = 160) under resident weights, so each CTA keeps one; 10, 5 (odd: the first warpgroup takes one more) and 1
    # tiles per CTA; a window ring whose slot count does not divide a tile's 4 or 5 windows; short last tiles per image.
    if ctas:
        monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", ctas)
    tactic = TACTICS_BY_ID[tactic_id]
    shape = ConvShape(2, {70: 128, 71: 160, 73: 128}[tactic_id], 29, 28, 160, 3, 3, (1, 1), (1, 1, 1, 1))
    geo = tactic.geometry(shape)
    assert geo is not None and geo.ch_tiles == 3 and geo.kt // 9 % tactic.halo_stages != 0 and 29 % geo.th != 0
    assert ConvLaunch(shape, tactic, 1).grid[0] == {"4": 3, "6": 6, "": 30}[ctas] and geo.ctas == 30
    _check(shape, has_res, tactic)


@pytest.mark.parametrize("has_res", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("tactic_id,c", [(74, 96), (89, 96), (65, 160), (67, 160)])
def test_stride2_windows_walk_several_tiles(monkeypatch, tactic_id, c, has_res):
    # 3x3 stride-2 windows of column pairs: 3 channel tiles of w74 (K = 160, the last one partial) or 2 of w65, 3 or 5
    # channel blocks, 3 CTAs (w74's resident weights: one channel tile each) walking every tile, window rings whose slot
    # count does not divide a tile's windows, a short last tile per image (29 output rows in tiles of 6), and the padding
    # (pair -1, phase row -1) zero-filled by the copy engine.
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "3")
    tactic = TACTICS_BY_ID[tactic_id]
    shape = ConvShape(2, c, 58, 56, 160, 3, 3, (2, 2), (1, 1, 1, 1))
    geo = tactic.geometry(shape)
    oh, _ = shape.out_hw
    assert geo is not None and geo.tiles_per_image > 1 and oh % geo.th != 0 and geo.kt // 9 % tactic.halo_stages != 0
    assert ConvLaunch(shape, tactic, 1).grid[0] == 3 and geo.ctas > 3
    _check(shape, has_res, tactic)


@pytest.mark.parametrize("has_res", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("n,c,hw,k", [(9, 128, 14, 160), (19, 64, 6, 64)], ids=["7x7-4-images", "3x3-16-images"])
@pytest.mark.parametrize("tactic_id", [66, 68])
def test_stride2_stacked_windows_walk_several_tiles(monkeypatch, tactic_id, n, c, hw, k, has_res):
    # Stride-2 windows of stacked images (w66): three windows per channel block, one per tap row; 4 images of 7 x 7 or
    # 16 of 3 x 3 outputs per tile, the batch's last tile short (1 or 3 images, the rest of its windows zero-filled by the
    # copy engine), 2 CTAs walking 6 or 2 tiles, 4 or 2 channel blocks through 3 window slots; w68 stores by TMA.
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "2")
    tactic = TACTICS_BY_ID[tactic_id]
    shape = ConvShape(n, c, hw, hw, k, 3, 3, (2, 2), (1, 1, 1, 1))
    geo = tactic.geometry(shape)
    assert geo is not None and geo.nb > 1 and n % geo.nb != 0 and geo.kt // 9 % tactic.halo_stages != 0
    assert ConvLaunch(shape, tactic, 1).grid[0] == 2 and geo.ctas >= 2
    _check(shape, has_res, tactic)


def test_multicast_pairs_walk_several_tiles(monkeypatch):
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "3")  # rounded down to one cluster of 2 CTAs for 8 tiles
    tactic = next(t for t in WGMMA_TACTICS if t.persistent and t.multicast)
    shape = ConvShape(2, 64, 20, 20, 256, 3, 3, (1, 1), (1, 1, 1, 1))
    assert ConvLaunch(shape, tactic, 1).grid == (2, 1, 1) and tactic.geometry(shape).ctas == 8
    _check(shape, True, tactic)


@pytest.mark.parametrize("ctas", ["4", "3", "1"], ids=["grid-multiple-of-channel-tiles", "rounded-down", "one-cta"])
@pytest.mark.parametrize("tactic_id", [40, 41, 45, 46, 50])
def test_pixel_major_ctas_walk_several_tiles(monkeypatch, tactic_id, ctas):
    # 512 channels = 2 (bn 256) or 4 (bn 128) channel tiles. A grid that is a multiple of them keeps each CTA on
    # one channel tile (its folded factors loaded once); one CTA changes channel tile every tile (the
    # factors are refolded) and alternates its two residual tiles through the producer's mbarriers. With
    # resident weights the grid never goes below the channel tiles (the kernel would trap), and the
    # consumer warpgroups (or groups of two) take the CTA's tiles in turn.
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", ctas)
    tactic = next(t for t in WGMMA_TACTICS if t.id == tactic_id)
    shape = ConvShape(3, 64, 12, 20, 512, 1, 1)
    geo = tactic.geometry(shape)
    grid = ConvLaunch(shape, tactic, 1).grid[0]
    assert geo.ctas > 4 and (grid % geo.ch_tiles == 0 or grid < geo.ch_tiles)
    if tactic.resident_kt:
        assert grid % geo.ch_tiles == 0 and geo.ctas >= 2 * grid, (grid, geo)  # every CTA walks several tiles
    _check(shape, True, tactic)
    _check(shape, False, tactic, relu=False)


FLAT_TACTIC_IDS = [52, 53, 54, 55, 56, 57, 59]  # the flat tactics
FLAT_SHAPES = [
    ConvShape(7, 96, 6, 4, 512, 1, 1),  # 3 groups per image: one-group boxes, tiles across images, the last past the batch
    ConvShape(3, 64, 12, 4, 256, 1, 1),  # 6 groups: two-group boxes
    ConvShape(5, 160, 8, 8, 512, 1, 1),  # 8 groups: 8-group boxes; 5 channel blocks: a second slot with 3 past CB
    ConvShape(16, 64, 7, 7, 512, 1, 1),  # 49 pixels: 8-image groups, 52 a set (3 not stored), tiles across sets
    ConvShape(24, 96, 5, 5, 256, 1, 1),  # 25 pixels: 28 groups a set, three sets
    ConvShape(8, 160, 6, 6, 256, 1, 1),  # 36 pixels: four-group boxes, the last tile past the batch, 3 blocks past CB
    ConvShape(8, 256, 14, 14, 1024, 1, 1),  # res4 conv3's map: 196 pixels, four-group boxes
]


@pytest.mark.parametrize("ctas", ["3", "1", ""], ids=["three-ctas", "one-cta", "every-sm"])
@pytest.mark.parametrize("shape", FLAT_SHAPES, ids=[f"{s.n}x{s.c}x{s.h}x{s.w}" for s in FLAT_SHAPES])
@pytest.mark.parametrize("tactic_id", FLAT_TACTIC_IDS)
def test_flat_tiles_cross_images_and_the_batch_end(monkeypatch, tactic_id, shape, ctas):
    # flat tiles: tiles of consecutive pixels whatever the image, boxes of 1, 2 or 8 eight-pixel groups x a slot's 4
    # channel blocks (those past CB zero-filled), the batch's last tile partly past it (its boxes reload the last
    # one); 256-512 channels = 1-2 channel tiles, each CTA walking several tiles. Maps whose pixels do not come in 8s
    # take a group as one pixel of 8 images: every tile row a pixel, rows scattered over 8 images.
    if ctas:
        monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", ctas)
    tactic = TACTICS_BY_ID[tactic_id]
    no_residual = dataclasses.replace(shape, residual=False)
    assert tactic.geometry(no_residual) is not None
    if not tactic.residual_buffers:  # no residual buffers (w53, w59): convs without a residual only
        assert tactic.geometry(dataclasses.replace(shape, residual=True)) is None
    _check_flat(shape, tactic)


def _check_flat(shape, tactic):
    """A flat tactic on `shape`: with a residual where it keeps residual buffers, else without one; then without a
    residual and without ReLU."""
    _check(shape, bool(tactic.residual_buffers), tactic)
    _check(shape, False, tactic, relu=False)


STRIDE2_FLAT_SHAPES = [
    ConvShape(16, 96, 14, 14, 160, 1, 1, (2, 2)),  # 7 x 7 outputs: one-pixel boxes, 49 groups a set, tiles across sets
    ConvShape(8, 64, 28, 28, 288, 1, 1, (2, 2)),  # 14 x 14 outputs: pixel-pair boxes; 288 channels, a partial channel tile
    ConvShape(24, 160, 13, 11, 64, 1, 1, (2, 2)),  # odd input maps (7 x 6 outputs), 5 channel blocks: 3 past CB in a slot
    ConvShape(8, 512, 28, 28, 256, 1, 1, (2, 2)),  # res4's downsample GEMM-K (16 k32 steps): w57's resident weights, w55
    ConvShape(8, 256, 56, 56, 160, 1, 1, (2, 2)),  # res3's downsample map: 28 x 28 outputs (in 8s) in 8-image groups, 4-pixel boxes
]


@pytest.mark.parametrize("ctas", ["3", ""], ids=["three-ctas", "every-sm"])
@pytest.mark.parametrize("shape", STRIDE2_FLAT_SHAPES, ids=[f"{s.n}x{s.c}x{s.h}x{s.w}k{s.k}" for s in STRIDE2_FLAT_SHAPES])
@pytest.mark.parametrize("tactic_id", FLAT_TACTIC_IDS)
def test_flat_tiles_read_stride2_inputs(monkeypatch, tactic_id, shape, ctas):
    # 1x1 stride-2 convs (the downsamples) on flat tiles of 8-image groups: the input's every other column and row
    # through the strided view (32, N, CB, OW, OH), boxes of 1, 2 or 4 pixels of one output row
    if ctas:
        monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", ctas)
    tactic = TACTICS_BY_ID[tactic_id]
    takes, why = tactic.can_implement(dataclasses.replace(shape, residual=bool(tactic.residual_buffers)))
    if not takes:  # (the tactics whose resident weights hold fewer k32 steps than the shape's GEMM-K)
        pytest.skip(f"{tactic.name} does not take {shape}: {why}")
    _check_flat(shape, tactic)


@pytest.mark.parametrize("channels", [64, 256], ids=["one-k-block", "two-k-blocks"])
@pytest.mark.parametrize("multicast", [False, True], ids=["single", "multicast"])
def test_two_staging_tiles_alternate_across_tiles(monkeypatch, multicast, channels):
    # 2 or 3 CTAs for 8 tiles of a short-K residual layer: each CTA alternates its two staging tiles, and
    # every tile's output is stored during the next tile's first wgmma batch (the last one after the loop).
    monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", "3")
    tactic = next(t for t in WGMMA_TACTICS if t.staging == 2 and t.multicast == multicast)
    shape = ConvShape(2, channels, 20, 20, 256, 1, 1)
    assert tactic.geometry(shape).ctas == 8 and ConvLaunch(shape, tactic, 1).grid[0] in (2, 3)
    _check(shape, True, tactic)
    _check(shape, False, tactic)


def test_a_variant_over_the_shared_memory_limit_fails_by_name():
    # A bench --replace variant (here w70 with 16 window slots, 248 KB) is refused before the driver sees it, naming
    # the tactic and both sizes, instead of the driver's bare CUDA_ERROR_INVALID_VALUE.
    import dataclasses

    from trtfuse.plugins.wgmma import shared_memory_limit

    tactic = dataclasses.replace(TACTICS_BY_ID[70], halo_stages=16)
    shape = ConvShape(2, 128, 29, 28, 160, 3, 3, (1, 1), (1, 1, 1, 1))
    assert tactic.geometry(shape) is not None and tactic.shared_bytes() > shared_memory_limit(0)
    with pytest.raises(ValueError, match=f"{tactic.name} needs {tactic.shared_bytes()} bytes of shared memory"):
        _check(shape, False, tactic)


@pytest.mark.parametrize("ctas", ["2", ""], ids=["two-ctas", "every-sm"])
@pytest.mark.parametrize("pdl", [1, 2, 3], ids=["trigger-at-start", "no-trigger", "trigger-after-last-window"])
@pytest.mark.parametrize("first_id,second_id,n,c,hw", [(74, 70, 2, 128, 56), (89, 70, 2, 128, 56), (67, 69, 2, 256, 28),
                                                      (68, 69, 9, 512, 14)],
                         ids=["w74-then-w70", "w89-then-w70", "w67-then-w69", "w68-then-w69"])
def test_programmatic_launches_wait_for_the_previous_grid(monkeypatch, first_id, second_id, n, c, hw, pdl, ctas):
    # Two layers launched back to back with programmatic dependent launch (pdl): the second may start while the first
    # runs, so it must wait (griddepcontrol.wait) before it reads the first one's output (poisoned before the first
    # launch) and before it stores into the first one's input, which the first may still be reading. With 2 CTAs each
    # CTA walks many tiles and the second grid's CTAs find idle SMs at once.
    import dataclasses

    from trtfuse.plugins import cuda_driver as cd
    from trtfuse.plugins.layout import unpack_chw32

    if ctas:
        monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", ctas)
    first = dataclasses.replace(TACTICS_BY_ID[first_id], pdl=pdl)
    second = dataclasses.replace(TACTICS_BY_ID[second_id], pdl=pdl)
    shape_a = ConvShape(n, c, hw, hw, c, 3, 3, (2, 2), (1, 1, 1, 1))
    shape_b = ConvShape(n, c, hw // 2, hw // 2, c, 3, 3, (1, 1), (1, 1, 1, 1))
    assert first.geometry(shape_a) is not None and second.geometry(shape_b) is not None
    a = DeviceConv(ConvProblem.random(shape_a, False), ConvLaunch(shape_a, first, 1))
    problem_b = ConvProblem.random(shape_b, False)
    b = DeviceConv(problem_b, ConvLaunch(shape_b, second, 1))  # (its own input buffer is not used)
    assert b.y.nbytes <= a.x.nbytes  # the second layer's output goes into the first one's input
    a.y.fill(POISON)
    a.run()
    b.launch_plan.launch(a.y.ptr, b.w.ptr, b.scale.ptr, b.bias.ptr, b.out_scale.ptr, a.x.ptr, relu=True)
    cd.check(cd._driver().cuCtxSynchronize())
    first_out = unpack_chw32(a.y.download(a.y_shape, np.int8), shape_a.k)
    second_out = unpack_chw32(a.x.download(b.y_shape, np.int8), shape_b.k)
    assert passes_lsb_rule(compare(first_out, a.p.golden())), "the first layer's output"
    problem_b.x = first_out  # what the second layer must have read: the first one's output as it was stored
    assert passes_lsb_rule(compare(second_out, problem_b.golden())), "the second layer read its input before it was written"
