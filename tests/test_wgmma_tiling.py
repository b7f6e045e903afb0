"""The wgmma tactic's implicit GEMM, replayed on the CPU: every CTA's TMA boxes (start coordinates,
element strides, out-of-bounds zero fill), the k32 tap order against the packed weight, the pixel-tile
geometry and the epilogue's store mask, exactly as plugins/kernels/wgmma_conv.cu computes them, must
give the exact int32 convolution, each output written once. This checks the tiling and addressing
without a GPU; tests/test_wgmma_gpu.py checks the kernel itself on Hopper."""

import dataclasses
import math

import numpy as np
import pytest

from trtfuse.bench.layers import edge_layers, resnet50_layers
from trtfuse.plugins.layout import pack_nchwv, pack_weight, round_up
from trtfuse.plugins.reference import conv_int8_accumulate
from trtfuse.plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS, ConvShape, candidate_tactics, choose, choose_wgmma


def tma_box(t: np.ndarray, coords, box, elem_strides) -> np.ndarray:
    """A tile-mode TMA load: `t` is indexed [d_{r-1}]...[d_0] (dim 0 innermost, as the tensor map
    lists dims), the box is ceil(box[i] / elem_strides[i]) elements of dim i from coords[i] in steps
    of elem_strides[i]; out-of-bounds elements read 0. Returns the box in the same axis order."""
    rank = len(coords)
    idx = []
    for i in range(rank):
        count = math.ceil(box[i] / elem_strides[i])
        idx.append(coords[i] + elem_strides[i] * np.arange(count))
    shape = t.shape[::-1]  # extent of dim i
    out = np.zeros([len(v) for v in idx[::-1]], dtype=t.dtype)
    valid = [(v >= 0) & (v < shape[i]) for i, v in enumerate(idx)]
    src = [np.clip(v, 0, shape[i] - 1) for i, v in enumerate(idx)]
    gathered = t[np.ix_(*src[::-1])]
    mask = np.ones(out.shape, dtype=bool)
    for axis, i in enumerate(range(rank - 1, -1, -1)):
        shp = [1] * rank
        shp[axis] = -1
        mask &= valid[i].reshape(shp)
    out[mask] = gathered[mask]
    return out


def permuted_weight_view(wp: np.ndarray) -> np.ndarray:
    """The pixel-major weight map (plugins/wgmma.py) as an array indexed [b][jj][q][e][kg]: dims (KGpad, e 2,
    q 4, jj 4, Kpad/32) with row strides (1, 8, 2, 32)."""
    rows, kg = wp.shape
    r = wp.strides[0]
    return np.lib.stride_tricks.as_strided(wp, (rows // 32, 4, 4, 2, kg), (32 * r, 2 * r, 8 * r, r, wp.strides[1]))


def pingpong_weight_view(wp: np.ndarray) -> np.ndarray:
    """The channel-major ping-pong tile's weight map (plugins/wgmma.py) as an array indexed [1][u][h][g][kg]: dims
    (KGpad, g 8, h 2, Kpad/16, 1) with row strides (2, 1, 16)."""
    rows, kg = wp.shape
    r = wp.strides[0]
    return np.lib.stride_tricks.as_strided(wp, (1, rows // 16, 2, 8, kg), (rows * r, 16 * r, r, 2 * r, wp.strides[1]))


def tile_pixel(pos: int, oh: int, ow: int, valid_px: int, wh: int = 0, pitch: int = 0, th: int = 0, quad_half: int = 0):
    """wgmma_conv.cu's tile_pixel: (pixel of tile position pos, a pixel of the tensor?); with a window of width wh
    and images `pitch` columns apart (halo tactics) position y * wh + i * pitch + x is pixel i * oh * ow + y * ow + x
    where x < ow; with stride-2 windows (th given) position (i * th + y) * pitch + x; with quad windows (quad_half = N / 2)
    position e * N / 2 + y * pitch + t is pixel y * ow + 2t + e."""
    if quad_half:
        e, q = divmod(pos, quad_half)
        y, t = divmod(q, pitch)
        pix = y * ow + 2 * t + e
        return pix, 2 * t + e < ow and pix < valid_px
    if not wh:
        return pos, pos < valid_px
    if th:
        row, x = divmod(pos, pitch)
        image, y = divmod(row, th)
        pix = image * oh * ow + y * ow + x
        return pix, x < ow and pix < valid_px
    y, rest = divmod(pos, wh)
    image, x = divmod(rest, pitch)
    pix = image * oh * ow + y * ow + x
    return pix, x < ow and y < oh and pix < valid_px


def row_pixel(m: int, ohw: int, group_images: int = 1, groups: int = 0) -> tuple[int, int]:
    """wgmma_tile.cuh's tile_row_offset: (image, pixel) of row m of the tiles' linear order: the linear output index,
    or (flat tiles of 8-image groups, `groups` per set) row 8q + i is pixel q % groups of image 8 (q // groups) + i,
    a pixel only where that is under ohw."""
    if group_images == 1:
        return divmod(m, ohw)
    q, i = divmod(m, 8)
    image_set, pix = divmod(q, groups)
    return 8 * image_set + i, pix


def load_residual_tile(flat_residual, ch: int, kpad: int, ohw: int, ow: int, m0: int, c0: int, valid_px: int, bm: int = 128,
                       group_images: int = 1, groups: int = 0):
    """wgmma_conv.cu's ResidualSlice::load by every consumer warp of a tile's group: warp w (64 part +
    16 warp = 16 w) copies, lane l, 16-byte half l % 2 of tile pixel 16 w + l / 2, block b, into slice w
    [block][16 pixels][32] (zeros where the pixel or block is outside the tensor); the group's slices are
    consecutive. Copies stay inside their slice and never overlap."""
    tile = np.full(bm * ch, -1000, np.int64)  # bytes nobody copied stay visible
    written = np.zeros(bm * ch, np.int32)
    blocks = (kpad - c0) // 32
    for w in range(bm // 16):
        for lane in range(32):
            px = 16 * w + lane // 2
            for b in range(ch // 32):
                dst = w * 16 * ch + (16 * b + lane // 2) * 32 + 16 * (lane % 2)
                assert w * 16 * ch <= dst and dst + 16 <= (w + 1) * 16 * ch
                n, pix = row_pixel(m0 + px, ohw, group_images, groups)
                if px < valid_px and pix < ohw and b < blocks:
                    src = ((n * (kpad // 32) + c0 // 32 + b) * ohw + pix) * 32 + 16 * (lane % 2)
                    assert src + 16 <= flat_residual.size
                    tile[dst:dst + 16] = flat_residual[src:src + 16]
                else:
                    tile[dst:dst + 16] = 0
                written[dst:dst + 16] += 1
    assert (written == 1).all()
    return tile


def pixel_major_residual_offset(px: int, b: int, q: int, ch: int) -> int:
    """ResidualSlice::read: lane (g, q) of warp px // 16 reads slice pixel px % 16, block b, bytes 8q .. 8q + 7."""
    return (px // 16) * 16 * ch + (16 * b + px % 16) * 32 + 8 * q


def tile_coord(shape: ConvShape, g, tile: int, ch: int):
    """wgmma_conv.cu's TileCoord: (n0, oh0, valid_px, m0, c0) of CTA tile `tile`, channel tile fastest."""
    oh, ow = shape.out_hw
    ohw = oh * ow
    ch_tile, pix_tile = tile % g.ch_tiles, tile // g.ch_tiles
    if g.groups_per_set:  # flat tiles: bm consecutive rows of the tiles' linear order (row_pixel)
        bm = g.box_bytes // 32
        rows = shape.n // g.group_images * g.groups_per_set * 8
        return 0, 0, min(bm, rows - pix_tile * bm), pix_tile * bm, ch_tile * ch
    if g.nb == 1:
        n0 = pix_tile // g.tiles_per_image
        oh0 = (pix_tile - n0 * g.tiles_per_image) * g.th
        valid_px = min(g.th, oh - oh0) * ow
    else:
        n0, oh0 = pix_tile * g.nb, 0
        valid_px = min(g.nb, shape.n - n0) * ohw
    return n0, oh0, valid_px, n0 * ohw + oh0 * ow, ch_tile * ch


def emulate(shape: ConvShape, tactic, x: np.ndarray, w: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
    """int32 accumulators [N, Kpad, OH, OW] as the kernel's CTAs produce and store them (-1 sentinel
    count check: every stored element is written exactly once). For a pixel-major tactic, `residual`
    (int8 [N, K, OH, OW]) is replayed through the residual box and read back at the epilogue's offsets."""
    g = tactic.geometry(shape)
    assert g is not None
    x5 = pack_nchwv(x, 32).astype(np.int64)  # [N][CB][H][W][32] = dims (32, W, H, CB, N)
    wp = pack_weight(w).astype(np.int64)  # [Kpad][KGpad] = dims (KGpad, Kpad)
    oh, ow = shape.out_hw
    ohw, kpad = oh * ow, round_up(shape.k, 32)
    sh, sw = shape.stride
    pt, pl = shape.pads[0], shape.pads[1]
    bn, ch = tactic.bm, tactic.CHANNELS
    box_px = g.box_bytes // 32
    assert g.box_bytes <= (tactic.halo_rows * tactic.window_row_bytes or bn * 32)
    wh = g.wh  # halo tactics: the window's width; tile position n = oh * wh + image * pitch + ow
    x_windows = x5.transpose(1, 2, 0, 3, 4)  # the window map's view (32, W, N, H, CB): [CB][H][N][W][32]
    acc_out = np.zeros((shape.n, kpad, oh, ow), np.int64)
    writes = np.zeros((shape.n, kpad, oh, ow), np.int32)
    grid = min(g.ctas, 132) if tactic.persistent else g.ctas
    order = [tile for cta in range(grid) for tile in range(cta, g.ctas, grid)]  # each CTA's tile loop
    assert sorted(order) == list(range(g.ctas))
    for tile in order:
        n0, oh0, valid_px, m0, c0 = tile_coord(shape, g, tile, ch)
        h0, w0 = oh0 * sh - pt, -pl
        acc = np.zeros((ch, bn), np.int64)  # D = channels x pixels (pixel-major: D^T, columns in box-row order)
        cb = r = s = 0
        for k in range(g.kt):
            if tactic.pixel_major:  # box rows (b, jj, q, e) in order: the weight map's permutation
                a = tma_box(permuted_weight_view(wp), (k // 4 * 128, 0, 0, 0, c0 // 32), (128, 2, 4, 4, ch // 32),
                            (1,) * 5).reshape(ch, 128)[:, k % 4 * 32:k % 4 * 32 + 32]
            elif tactic.stores_by_tma:  # chunks of 4 k32 steps (resident or a ring slot's), box row 16u + 8h + g is channel 16u + 2g + h
                a = tma_box(pingpong_weight_view(wp), (k // 4 * 128, 0, 0, c0 // 16, 0), (128, 8, 2, ch // 16, 1),
                            (1,) * 5).reshape(ch, 128)[:, k % 4 * 32:k % 4 * 32 + 32]
            elif tactic.a_box == 128:  # one box per slot of 4 k32 steps; step k is its columns 32 (k % 4) ..
                a = tma_box(wp, (k // 4 * 128, c0), (128, ch), (1, 1))[:, k % 4 * 32:k % 4 * 32 + 32]
            else:
                a = tma_box(wp, (k * 32, c0), (32, ch), (1, 1))  # [128][32]
            if tactic.halo_rows:  # channel block cb's window (zeros past the box), tap (r, s) its view (WindowCursor)
                row_bytes = tactic.window_row_bytes
                if r == 0 and s == 0:
                    window = np.zeros(tactic.halo_rows * row_bytes, np.int64)
                    if tactic.stride2_windows and g.nb > 1:  # stacked: per tap row r, (64, W/2, H, N, CB) from row r - 1
                        x_rows = x5.reshape(shape.n, x5.shape[1], shape.h, shape.w // 2, 64).transpose(1, 0, 2, 3, 4)
                        box = np.concatenate([tma_box(x_rows, (0, -1, rr - 1, n0, cb), (64, g.pitch, 2 * g.th, g.nb, 1),
                                                      (1, 1, 2, 1, 1)).reshape(-1) for rr in range(3)])
                    elif tactic.stride2_windows:  # the pair (quad) view (64 (128), W/2 (4), H/2, 2, N * CB): [n * CB + cb][ph][h2][pair][64]
                        x_pairs = x5.reshape(shape.n * x5.shape[1], shape.h // 2, 2, shape.w * 32 // row_bytes, row_bytes).transpose(0, 2, 1, 3, 4)
                        box = tma_box(x_pairs, (0, -1, oh0 - 1, 0, n0 * x5.shape[1] + cb), (row_bytes, g.pitch, g.th + 1, 2, 1), (1,) * 5)
                    else:
                        box = tma_box(x_windows, (0, w0, n0, h0, cb), (32, g.pitch, g.nb, g.th + shape.r - 1, 1), (1,) * 5)
                    assert box.size == g.box_bytes
                    window[:box.size] = box.reshape(-1)
                if tactic.stride2_windows and g.nb > 1:  # window r of three: WindowCursor::s2_offset
                    offset = r * (g.box_bytes // 3) + 32 + 32 * s
                elif tactic.stride2_windows:  # phase(r) + row(r) + (1 + s) * 32 (quads: (3 + s) * 32, the odd half 64 on)
                    offset = (((g.th + 1) * g.pitch * row_bytes if r != 1 else 0) + (g.pitch * row_bytes if r != 0 else 0)
                              + (96 if tactic.quad_windows else 32) + 32 * s)
                else:
                    offset = (r * wh + s) * 32
                if tactic.quad_windows:  # two wgmmas of N / 2: the even columns' positions, then the odd ones'
                    views = [(offset + 64 * e, bn // 2) for e in range(2)]
                else:
                    views = [(offset, bn)]
                for start, rows in views:
                    assert start + (rows - 1) * row_bytes + 32 <= window.size, "a view stays inside its window slot"
                b = np.concatenate([np.stack([window[start + n * row_bytes:start + n * row_bytes + 32] for n in range(rows)])
                                    for start, rows in views])
            elif tactic.flat:
                # the slot's boxes of the (32, 8, CB, G, N) view, box_groups groups x 4 blocks each (boxes past the
                # batch load its last), land [group][block][8][32]; step k % 4 is block k % 4 of every group. Maps
                # whose pixels do not come in 8s: the view (32, 8 images, CB, OH * OW, N / 8), a group one pixel of 8 images
                strided = shape.stride != (1, 1)
                if strided:  # the view (32, N, CB, OW, OH) of every other input column and row: [oh][ow][cb][n][32]
                    xf = x5[:, :, ::sh, ::sw][:, :, :oh, :ow].transpose(2, 3, 1, 0, 4)
                elif g.group_images == 8:  # [set][pixel][cb][image][32]
                    xf = x5.reshape(shape.n // 8, 8, x5.shape[1], ohw, 32).transpose(0, 3, 2, 1, 4)
                else:  # [n][group][cb][8][32]
                    xf = x5.reshape(shape.n, -1, g.groups_per_set, 8, 32).transpose(0, 2, 1, 3, 4)
                slot = np.zeros((bn // 8, tactic.ks, 8, 32), np.int64)
                for gi in range(0, bn // 8, g.box_groups):
                    q = min((m0 // 8) + gi, shape.n // g.group_images * g.groups_per_set - g.box_groups)
                    n, rest = divmod(q, g.groups_per_set)
                    coords = (0, 8 * n, k // 4 * 4, rest % ow, rest // ow) if strided else (0, 0, k // 4 * 4, rest, n)
                    slot[gi:gi + g.box_groups] = tma_box(xf, coords, (32, 8, tactic.ks, g.box_groups, 1), (1,) * 5)[0]
                b = slot[:, k % 4].reshape(bn, 32)
            else:
                b = np.zeros((bn, 32), np.int64)
                b[:box_px] = tma_box(x5, (0, w0 + s, h0 + r, cb, n0), (32, ow * sw, g.th * sh, 1, g.nb),
                                     (1, sw, sh, 1, 1)).reshape(-1, 32)
            acc += a @ b.T
            s += 1
            if s == shape.s:
                s = 0
                r += 1
                if r == shape.r:
                    r, cb = 0, cb + 1
        if tactic.pixel_major:
            # wgmma column 32b + 8jj + 2q + e (accumulator 4(4b + jj) + 2h + e of thread class q) is stored as
            # byte 2jj + e of the 8 at channel c0 + 32b + 8q (consume_pixel_major)
            store = {32 * b + 8 * jj + 2 * q + e: 32 * b + 8 * q + 2 * jj + e
                     for b in range(ch // 32) for jj in range(4) for q in range(4) for e in range(2)}
            if residual is not None:
                rtile = load_residual_tile(pack_nchwv(residual, 32).reshape(-1), ch, kpad, ohw, ow, m0, c0, valid_px, bn,
                                           g.group_images, g.groups_per_set)
        elif tactic.stores_by_tma:  # wgmma row 16u + 8h + g holds channel 16u + 2g + h
            store = {16 * u + 8 * h + g: 16 * u + 2 * g + h for u in range(ch // 16) for h in range(2) for g in range(8)}
        else:
            store = {c: c for c in range(ch)}
        # for_each_tile_vector: staging row px is pixel px, or (halo) window position px = oh * wh + ow
        positions = [(px, *tile_pixel(px, oh, ow, valid_px, wh, g.pitch, g.th if tactic.stride2_windows else 0,
                                      bn // 2 if tactic.quad_windows else 0)) for px in range(bn)]
        stored = [(px, pix) for px, pix, ok in positions if ok]
        for px, tile_pix in stored:
            n, pix = row_pixel(m0 + tile_pix, ohw, g.group_images, g.groups_per_set)
            if pix >= ohw:  # 8-image groups: a set's groups past its map (rounded up to whole boxes)
                continue
            for col, c in store.items():
                if c0 + c < kpad:
                    acc_out[n, c0 + c, pix // ow, pix % ow] = acc[col, px]
                    writes[n, c0 + c, pix // ow, pix % ow] += 1
                    if tactic.pixel_major and residual is not None and c0 + c < shape.k:
                        b, q, byte = c // 32, c % 32 // 8, c % 8
                        assert rtile[pixel_major_residual_offset(px, b, q, ch) + byte] == residual[n, c0 + c, pix // ow, pix % ow]
    assert (writes == 1).all(), "every output element is stored exactly once"
    return acc_out


CASES = [
    ConvShape(2, 64, 8, 8, 96, 1, 1),
    ConvShape(2, 40, 13, 11, 40, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvShape(3, 64, 15, 13, 160, 3, 3, (2, 2), (1, 1, 1, 1)),
    ConvShape(9, 64, 7, 7, 64, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvShape(3, 96, 9, 9, 200, 1, 1, (2, 2)),
    ConvShape(2, 64, 10, 12, 64, 3, 3, (1, 1), (0, 1, 2, 1)),
    ConvShape(2, 32, 9, 9, 128, 5, 5, (1, 1), (2, 2, 2, 2)),
    ConvShape(1, 64, 28, 28, 32, 3, 3, (1, 1), (1, 1, 1, 1)),
    ConvShape(1, 32, 1, 1, 32, 1, 1),
    ConvShape(7, 96, 6, 4, 288, 1, 1),  # flat tiles: 3 groups of 8 per image (one-group boxes), the last tile past the batch
    ConvShape(3, 64, 12, 4, 256, 1, 1),  # 6 groups: two-group boxes
    ConvShape(5, 160, 8, 8, 256, 1, 1),  # 8 groups: 8-group boxes; 5 channel blocks: a slot with 3 past CB
    ConvShape(16, 64, 7, 7, 256, 1, 1),  # flat tiles of 8-image groups: 49 pixels in 52 groups (3 not stored), tiles across sets
    ConvShape(8, 96, 6, 6, 256, 1, 1),  # ... 36 pixels: four-group boxes, the last tile past the batch
    ConvShape(24, 64, 5, 5, 160, 1, 1),  # ... 25 pixels in 28 groups, 3 sets
    ConvShape(12, 64, 7, 7, 256, 1, 1),  # ... a batch not in 8s: the per-image tiles
    ConvShape(16, 96, 14, 14, 160, 1, 1, (2, 2)),  # ... at stride 2 (a downsample): 7 x 7 outputs, one-pixel boxes
    ConvShape(8, 64, 28, 28, 96, 1, 1, (2, 2)),  # ... 14 x 14 outputs, boxes of a pixel pair of one row
    ConvShape(8, 160, 13, 11, 64, 1, 1, (2, 2)),  # ... odd input maps: 7 x 6 outputs from every other row and column
    ConvShape(8, 64, 24, 24, 96, 1, 1, (2, 2)),  # ... 12 x 12 outputs, a map in 8s taken in 8-image groups: 4-pixel boxes
    ConvShape(2, 64, 58, 56, 160, 3, 3, (2, 2), (1, 1, 1, 1)),  # stride-2 windows: 29 x 28 outputs, a short last tile per image
    ConvShape(3, 96, 28, 28, 64, 3, 3, (2, 2), (1, 1, 1, 1)),  # ... 14 x 14 outputs
    ConvShape(1, 64, 56, 54, 128, 3, 3, (2, 2), (1, 1, 1, 1)),  # ... 28 x 27 outputs, two channel tiles of 64
    ConvShape(5, 96, 14, 14, 160, 3, 3, (2, 2), (1, 1, 1, 1)),  # ... 7 x 7 outputs: 4 images stacked, then 1
    ConvShape(19, 64, 6, 6, 64, 3, 3, (2, 2), (1, 1, 1, 1)),  # ... 3 x 3: 16 images (whole 1024-byte windows), then 3
    ConvShape(3, 64, 16, 14, 64, 3, 3, (2, 2), (1, 1, 1, 1)),  # ... 8 x 7: 3 images of 64 positions, the batch in one tile
]


@pytest.mark.parametrize("tactic", WGMMA_TACTICS, ids=[t.name for t in WGMMA_TACTICS])
@pytest.mark.parametrize("shape", CASES, ids=[f"{s.c}x{s.h}x{s.w}k{s.k}r{s.r}s{s.stride[0]}" for s in CASES])
def test_tiles_compute_the_exact_convolution(shape, tactic):
    with_residual = tactic.residual_buffers > 0  # a tactic without residual buffers takes the convs without one
    shape = dataclasses.replace(shape, residual=with_residual)
    if tactic.geometry(shape) is None:
        pytest.skip(f"{tactic.name} does not take this shape")
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-127, 128, (shape.k, shape.c, shape.r, shape.s), dtype=np.int8)
    oh, ow = shape.out_hw
    res = rng.integers(-128, 128, (shape.n, shape.k, oh, ow), dtype=np.int8) if with_residual else None
    got = emulate(shape, tactic, x, w, res)
    ref = conv_int8_accumulate(x, w, shape.stride, shape.pads)
    np.testing.assert_array_equal(got[:, : shape.k], ref)
    assert not got[:, shape.k:].any()


def test_stride2_stacked_windows_take_two_images_or_none():
    # The kernel and the tensor map tell the stacked form from the one-image form by NB > 1: a batch of one image, or
    # a count that no whole 1024-byte window holds, must leave the small map to another tactic, not to NB = 1.
    w66 = TACTICS_BY_ID[66]
    for n in range(1, 6):
        for hw in ((16, 14), (14, 14), (6, 6), (10, 10)):
            shape = ConvShape(n, 64, *hw, 64, 3, 3, (2, 2), (1, 1, 1, 1))
            g = w66.geometry(shape)
            oh, ow = shape.out_hw
            if 2 * oh * (ow + 1) <= w66.bm:  # a map the stacked form is for
                assert g is None or (g.nb >= 2 and g.th == oh and g.nb * oh * (ow + 1) % 16 == 0), (n, hw, g)
    assert w66.geometry(ConvShape(1, 64, 16, 14, 64, 3, 3, (2, 2), (1, 1, 1, 1))) is None
    assert w66.geometry(ConvShape(2, 64, 16, 14, 64, 3, 3, (2, 2), (1, 1, 1, 1))).nb == 2


def test_tma_box_model_matches_strided_slicing():
    t = np.arange(2 * 3 * 5 * 7 * 32).reshape(2, 3, 5, 7, 32)
    box = tma_box(t, (0, -1, 1, 2, 1), (32, 6, 4, 1, 1), (1, 2, 2, 1, 1))  # 3 W, 2 H elements
    assert box.shape == (1, 1, 2, 3, 32)
    assert not box[0, 0, :, 0].any()  # w = -1: padding
    np.testing.assert_array_equal(box[0, 0, 0, 1], t[1, 2, 1, 1])
    np.testing.assert_array_equal(box[0, 0, 1, 2], t[1, 2, 3, 3])


def test_geometry_respects_the_hardware_limits():
    for name, shape, _ in resnet50_layers(256) + resnet50_layers(1) + edge_layers():
        for t in WGMMA_TACTICS:
            g = t.geometry(shape)
            if g is None:
                continue
            oh, ow = shape.out_hw
            assert g.box_bytes <= (t.halo_rows * t.window_row_bytes or t.bm * 32) and g.box_bytes % 32 == 0, name  # the box fits its slot
            assert ow * shape.stride[1] <= 256 and g.th * shape.stride[0] <= 256 and g.nb <= 256, name
            if t.stride2_windows and g.nb > 1:  # stacked images: three whole 1024-byte windows, tap (2, 2)'s view inside
                win = g.nb * g.th * g.pitch
                assert g.th == oh and g.pitch == ow + 1 and win % 16 == 0 and g.box_bytes == 3 * win * 64, name
                assert 2 * win + 1 + t.bm <= t.halo_rows and (g.nb * g.th - 1) * g.pitch + ow <= t.bm and 2 * g.th <= 256, name
            elif t.quad_windows:  # the odd half's tap (2, 2) view, the furthest, stays inside the slot; TH rows of one image
                assert (g.th + 2) * g.pitch + 1 + t.bm // 2 <= t.halo_rows and g.pitch == ow // 2 + 1 and shape.w % 4 == 0, name
                assert (g.th - 1) * g.pitch + ow // 2 <= t.bm // 2 and g.th + 1 <= 256, name
            elif t.stride2_windows:  # tap (2, 2)'s view, the furthest, stays inside the slot; TH rows of one image
                assert (g.th + 2) * g.pitch + 1 + t.bm <= t.halo_rows and g.pitch == ow + 1, name
                assert (g.th - 1) * g.pitch + ow <= t.bm and g.th + 1 <= 256, name
            elif t.halo_rows:  # every tap's view of the window stays inside the slot, the window's box within TMA limits
                assert g.wh == g.nb * g.pitch and g.pitch >= shape.w + max(shape.pads[1], shape.pads[3]), name
                assert t.bm + (shape.r - 1) * g.wh + shape.s - 1 <= t.halo_rows and g.pitch <= 256 and g.th + shape.r - 1 <= 256, name
                assert (g.th - 1) * g.wh + (g.nb - 1) * g.pitch + ow <= t.bm, name  # the tile's last pixel is a wgmma position
            assert t.shared_bytes() <= 227 * 1024, t.name  # sm_90 opt-in limit per block


def test_heuristic_with_wgmma_off_or_off_hopper_keeps_the_mma_kernel(monkeypatch):
    monkeypatch.setenv("TRTFUSE_WGMMA", "0")
    for name, shape, _ in resnet50_layers(256):
        assert choose(shape, arch="sm_90")[0].family == "mma", name
        assert choose(shape, arch="sm_80")[0].family == "mma", name
        assert all(t.family == "mma" for t in candidate_tactics(shape, "sm_80"))


def test_heuristic_by_default_takes_wgmma_for_128_channels_and_more_or_flat_tiles(monkeypatch):
    monkeypatch.delenv("TRTFUSE_WGMMA", raising=False)
    shapes = {name: shape for name, shape, _ in resnet50_layers(256)}
    for name in ("res3 conv2 3x3 128", "res4 conv2 3x3 256", "res5 conv2 3x3 512", "res4 conv1 1x1 1024->256"):
        t, splits = choose(shapes[name], arch="sm_90")
        assert t.family == "wgmma" and splits == 1, name
        assert choose_wgmma(shapes[name]) is t
    # stride-1 3x3 convs: the window tiles, on the 7x7 maps the one computing least (4 images side by side in 224
    # positions, not 3 in 208); the stride-2 3x3 convs the stride-2 windows where one fits (res3 first conv2: the
    # 64-channel ping-pong w74, res4 first conv2: the 128-channel w67; res5 first conv2, 7 x 7 outputs: w68's 4 stacked
    # images; both store by TMA, as does res5 conv2's w69)
    assert choose_wgmma(shapes["res3 conv2 3x3 128"]).halo_rows and choose_wgmma(shapes["res4 conv2 3x3 256"]).halo_rows
    # ... the channel-major ping-pong where its resident weights hold the GEMM-K
    assert choose_wgmma(shapes["res3 conv2 3x3 128"]).pingpong and choose_wgmma(shapes["res4 conv2 3x3 256"]).pingpong
    res5 = choose_wgmma(shapes["res5 conv2 3x3 512"])
    assert res5.halo_rows and res5.geometry(shapes["res5 conv2 3x3 512"]).nb == 4 and res5.bm == 224 and res5.stores_by_tma
    assert choose_wgmma(shapes["res3 first conv2 3x3/2 128"]).id == 89 and choose_wgmma(shapes["res4 first conv2 3x3/2 256"]).id == 67
    res5_first = choose_wgmma(shapes["res5 first conv2 3x3/2 512"])
    assert res5_first.id == 68 and res5_first.geometry(shapes["res5 first conv2 3x3/2 512"]).nb == 4
    # GEMM-K under 512 with 256+ channels: the pixel-major tile; res5 conv3 (GEMM-K 512): the flat tile of 8-image groups
    # with 16 k32 steps resident (w57); fewer than 128 output channels stay on mma.sync
    for name in ("res2 conv3 1x1 64->256 +res", "res3 conv3 1x1 128->512 +res", "res4 conv3 1x1 256->1024 +res",
                 "res2 downsample 1x1/1 64->256", "res3 downsample 1x1/2 256->512"):
        assert choose(shapes[name], arch="sm_90")[0].pixel_major, name
    assert not choose(shapes["res3 conv1 1x1 512->128"], arch="sm_90")[0].pixel_major
    # 1x1 stride-1 maps in 8-pixel groups with GEMM-K under 1024: the flat tiles, 64-channel layers included
    # (w52 at 256+ channels with resident weights, w53 where there is no residual; w57 with 16 k32 steps resident;
    # w59's four ring slots for the convs without a residual, w55 past them; w56 below 256); 14 x 14 and 7 x 7 maps
    # too, as 8-image groups (14 x 14 whatever the GEMM-K); strided maps not
    flat = {"res2 first conv1 1x1 64->64": 56, "res2 conv1 1x1 256->64": 56, "res3 first conv1 1x1 256->128": 56,
            "res2 conv3 1x1 64->256 +res": 52, "res3 conv3 1x1 128->512 +res": 52, "res2 downsample 1x1/1 64->256": 53,
            "res4 first conv1 1x1 512->256": 59, "res4 conv3 1x1 256->1024 +res": 52, "res4 conv1 1x1 1024->256": 59,
            "res5 first conv1 1x1 1024->512": 59, "res5 conv3 1x1 512->2048 +res": 57}
    for name, shape in shapes.items():
        t = choose(shape, arch="sm_90")[0]
        assert (t.id if getattr(t, "flat", False) else None) == flat.get(name), name
    # the same convs said to have a residual (a shape that does not know) keep w55, which has the residual buffers
    for name in ("res4 first conv1 1x1 512->256", "res4 conv1 1x1 1024->256", "res5 first conv1 1x1 1024->512"):
        assert choose(dataclasses.replace(shapes[name], residual=True), arch="sm_90")[0].id == 55, name
    # a batch not in 8s leaves 14 x 14 maps to the row tiles (res4 conv3 + residual: the ping-pong w50), one in 8s does not
    for batch, tactic_id in ((12, 50), (16, 52)):
        res4_conv3 = {n: s for n, s, _ in resnet50_layers(batch)}["res4 conv3 1x1 256->1024 +res"]
        assert choose(res4_conv3, arch="sm_90")[0].id == tactic_id, batch
    # res2's 64-channel 3x3: the 64-channel ping-pong window tile (two tiles per CTA at batch 256, not at batch 8)
    assert choose(shapes["res2 first conv2 3x3/1 64"], arch="sm_90")[0].id == 73
    small = {name: shape for name, shape, _ in resnet50_layers(8)}
    assert choose(small["res2 first conv2 3x3/1 64"], arch="sm_90")[0].family == "mma"
    assert choose(shapes["res4 conv2 3x3 256"], arch="sm_86")[0].family == "mma"


def test_tensor_map_arguments_are_within_tma_limits():
    from trtfuse.plugins.wgmma import tensor_map_args

    for name, shape, _ in resnet50_layers(256) + resnet50_layers(1) + edge_layers() + [(str(c), c, 0) for c in CASES]:
        for t in WGMMA_TACTICS:
            g = t.geometry(shape)
            if g is not None:
                args = tensor_map_args(shape, t, g)  # raises outside the limits
                dims, strides, box, es = args["x"]
                if t.flat:  # a slot's boxes bring 4 k32 steps of bm pixels: expect_tx = 4 x box_bytes
                    assert t.bm // 8 // g.box_groups * math.prod(box) == t.ks * g.box_bytes, name
                elif t.stride2_windows and g.nb > 1:  # stacked images: one box per tap row
                    assert 3 * math.prod(math.ceil(b / e) for b, e in zip(box, es)) == g.box_bytes, name
                else:
                    assert math.prod(math.ceil(b / e) for b, e in zip(box, es)) == g.box_bytes, name  # = expect_tx bytes


def test_resident_weight_grids_keep_each_cta_on_one_channel_tile(monkeypatch):
    # resident_kt: a CTA loads its channel tile's weight once, so its tiles (blockIdx.x + i * gridDim.x)
    # must all sit on that channel tile: the grid is a multiple of the channel tiles (or covers every
    # tile once); the kernel traps otherwise.
    from trtfuse.plugins.wgmma import grid

    resident = [t for t in WGMMA_TACTICS if t.resident_kt]
    assert resident
    for cap in (None, "1", "3", "7"):
        if cap:
            monkeypatch.setenv("TRTFUSE_WGMMA_MAX_CTAS", cap)
        for name, shape, _ in resnet50_layers(256) + resnet50_layers(1) + edge_layers() + [(str(c), c, 0) for c in CASES]:
            for t in resident:
                g = t.geometry(shape)
                if g is None:
                    continue
                ctas = grid(shape, t)[0]
                assert ctas >= g.ctas or ctas % g.ch_tiles == 0, (name, t.name, ctas, g)
                assert all(tile % g.ch_tiles == cta % g.ch_tiles for cta in range(ctas) for tile in range(cta, g.ctas, ctas))


def pingpong_issue_order(cta_tiles: int) -> list[int]:
    """The pixel-major ping-pong's turn protocol (consume_pixel_major) run as a schedule: tile group g takes the CTA's tiles
    i = g, g + 2, ...; before tile i > 0 it bar.syncs on barrier kTurn + g (2 groups' worth of threads: its
    own sync plus one arrival), after issuing tile i it bar.arrives on kTurn + 1 - g if tile i + 1 exists.
    Returns the order in which tiles get issued; raises if the groups deadlock or an arrival is left
    pending when both groups have finished (a barrier the next launch would inherit half-complete)."""
    arrivals = [0, 0]  # pending arrivals on each group's turn barrier
    todo = [list(range(g, cta_tiles, 2)) for g in (0, 1)]
    order = []
    while todo[0] or todo[1]:
        progressed = False
        for g in (0, 1):
            if not todo[g]:
                continue
            i = todo[g][0]
            if i > 0:
                if arrivals[g] == 0:
                    continue  # blocked at bar.sync until the other group arrives
                arrivals[g] -= 1
            order.append(i)
            if i + 1 < cta_tiles:
                arrivals[1 - g] += 1
            todo[g].pop(0)
            progressed = True
        if not progressed:
            raise AssertionError(f"ping-pong deadlock with {cta_tiles} tiles: {order}")
    assert arrivals == [0, 0], f"{cta_tiles} tiles leave arrivals pending: {arrivals}"
    return order


@pytest.mark.parametrize("cta_tiles", range(0, 9))
def test_pingpong_turns_issue_the_tiles_in_order(cta_tiles):
    # The producer fills the ring in the CTA's tile order, so the groups must issue in that order too.
    assert pingpong_issue_order(cta_tiles) == list(range(cta_tiles))


def test_pixel_major_tile_groups_keep_their_weight_resident():
    for t in WGMMA_TACTICS:
        if t.pixel_major and t.tile_groups > 1:
            assert t.resident_kt > 0, t.name
    with pytest.raises(AssertionError, match="resident"):  # w46's two groups streaming their weights through the ring
        dataclasses.replace(TACTICS_BY_ID[46], resident_kt=0)
    assert dataclasses.replace(TACTICS_BY_ID[41], stages=3).tile_groups == 1  # one group: streams its weights, as before
    from trtfuse.bench.wgmma_diag import replaced_variant

    with pytest.raises(SystemExit, match="46:resident_kt=0: tile groups"):  # the profiling tool says so in one line
        replaced_variant("46:resident_kt=0")


def test_pingpong_tactics_have_two_tile_groups():
    for t in WGMMA_TACTICS:
        if t.pingpong:  # pixel-major: two tile groups of bm / 64 warpgroups; channel-major: each warpgroup a 64-channel tile
            groups = t.consumers // (t.bm // 64) if t.pixel_major else t.consumers * 64 // t.bn
            assert groups == 2 and "static constexpr bool pingpong = true;" in t.config_header(), t.name
    with pytest.raises(AssertionError):  # 128-pixel tiles on 2 consumer warpgroups: one tile group, no one to alternate with
        type(WGMMA_TACTICS[0])(id=99, bm=128, bn=256, stages=2, ks=4, a_box=128, persistent=True, pixel_major=True,
                               pingpong=True)
    with pytest.raises(AssertionError):  # channel-major ping-pong needs its own 64-channel tile per warpgroup
        type(WGMMA_TACTICS[0])(id=99, bm=208, bn=128, stages=1, ks=4, a_box=128, persistent=True, halo_rows=288, staging=2,
                               resident_kt=36, pingpong=True)


def test_window_thread_only_where_windows_share_the_producer_with_streamed_weights():
    # window_warp gives the windows a producer thread of their own; only the window tiles whose single producer
    # thread also streams weights have one to split off (the ping-pong tiles' thread issues windows only).
    with_thread = {t.id for t in WGMMA_TACTICS if t.window_warp}
    assert with_thread == {65, 66, 67, 68}, "the stride-2 window tiles streaming weights (docs/wgmma.md)"
    for t in WGMMA_TACTICS:
        assert f"static constexpr bool window_warp = {str(t.window_warp).lower()};" in t.config_header(), t.name
        if t.window_warp:
            assert t.halo_rows and not t.pingpong and not t.pixel_major, t.name
    make = type(WGMMA_TACTICS[0])
    with pytest.raises(AssertionError):  # no windows, nothing for the thread to issue
        make(id=99, bm=208, bn=128, stages=4, ks=4, a_box=128, persistent=True, window_warp=True)
    with pytest.raises(AssertionError):  # the ping-pong tile's producer already issues windows only
        make(id=99, bm=208, bn=64, stages=1, ks=4, a_box=128, persistent=True, halo_rows=480, halo_stages=4, staging=2,
             resident_kt=36, pingpong=True, stride2_windows=True, pp_inflight=2, window_warp=True)


def test_programmatic_launch_follows_the_tactic_and_the_knob(monkeypatch):
    # The persistent tiles that wait on griddepcontrol launch programmatically (their `pdl`); TRTFUSE_PDL=0 turns it off.
    from trtfuse.plugins.wgmma import programmatic_launch

    monkeypatch.delenv("TRTFUSE_PDL", raising=False)
    assert programmatic_launch(TACTICS_BY_ID[70]) and programmatic_launch(TACTICS_BY_ID[89])
    assert not programmatic_launch(TACTICS_BY_ID[73])  # no pdl in its table entry
    monkeypatch.setenv("TRTFUSE_PDL", "0")
    assert not programmatic_launch(TACTICS_BY_ID[70])
    assert all(t.persistent for t in WGMMA_TACTICS if t.pdl), "an early grid's CTAs must all be resident"


def test_a_tactic_says_why_it_refuses_a_shape():
    w31, w70, w52 = TACTICS_BY_ID[31], TACTICS_BY_ID[70], TACTICS_BY_ID[52]
    res3_conv2 = ConvShape(256, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1))
    assert w70.can_implement(res3_conv2) == (True, "")
    ok, why = w31.can_implement(ConvShape(256, 64, 56, 56, 96, 3, 3, (1, 1), (1, 1, 1, 1)))  # one 128-channel tile
    assert not ok and "multicast" in why
    ok, why = w52.can_implement(res3_conv2)
    assert not ok and "1x1" in why
    ok, why = w70.can_implement(ConvShape(256, 256, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1)))  # 72 k32 steps of weight
    assert not ok and "resident" in why
    for t in WGMMA_TACTICS:  # geometry and can_implement are one decision
        for shape in (res3_conv2, ConvShape(8, 256, 14, 14, 1024, 1, 1)):
            assert (t.geometry(shape) is not None) == t.can_implement(shape)[0], t.name
    # a tile without residual buffers (w59) takes res4 conv1 only where the shape says it has no residual
    w59, res4_conv1 = TACTICS_BY_ID[59], ConvShape(512, 1024, 14, 14, 256, 1, 1)
    ok, why = w59.can_implement(res4_conv1)
    assert not ok and "residual" in why
    assert w59.can_implement(dataclasses.replace(res4_conv1, residual=False)) == (True, "")


def test_a_plan_for_a_conv_without_a_residual_refuses_one_at_launch():
    # checked before the driver is touched: the kernel would trap on the residual pointer
    from trtfuse.plugins.conv import ConvLaunch

    plan = ConvLaunch(ConvShape(512, 1024, 14, 14, 256, 1, 1, residual=False), TACTICS_BY_ID[59], 1)
    with pytest.raises(ValueError, match="without a residual"):
        plan.launch(1, 2, 3, 4, 5, 6, residual=7, residual_scale=8)


def test_the_kernel_struct_carries_every_field_by_name():
    for t in WGMMA_TACTICS:
        header = t.config_header()
        for f in dataclasses.fields(t):
            if f.name in ("diag", "timeline"):
                continue
            value = getattr(t, f.name)
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            assert f" {f.name} = {text};" in header, (t.name, f.name)
        assert "wgmma_no_profiling.cuh" in header and ("__cluster_dims__(2, 1, 1)" in header) == t.multicast
    profiling = dataclasses.replace(TACTICS_BY_ID[70], diag=3).config_header()
    timeline = dataclasses.replace(TACTICS_BY_ID[70], timeline=1).config_header()
    assert "ProfilingBuild<3>" in profiling and "TimelineBuild<0>" in timeline
