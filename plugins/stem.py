"""The stem conv (7x7, stride 2, 3 input channels) as a stride-1 conv on a space-to-depth input.

A stride-2 conv over C channels equals a stride-1 conv over the input's 2x2 pixel blocks folded into
4C channels (NVIDIA's MLPerf ResNet-50 engines do the same): with r - pad_top = 2q + a (a = 0 or 1),
input row 2*oh + r - pad_top is row oh + q of the folded image, sub-row a. For ResNet's stem (R = 7,
pad 3) q runs over -2..1: a 4x4 kernel with padding 2 on top/left, over [N, 12 -> 16, H/2, W/2].

Why: the CHW4 stem gathers 4 bytes per tap (49 taps of 4 channels: 3/4 of the bytes useful, one
4-byte cp.async per tap and row), which made it the slowest layer of the network (0.78 ms at batch
256 on an H200, 8x its memory floor). Folded to 16 channels (12 used), every tap is one 16-byte
CHW16 vector: 16 taps, 16-byte gathers, the same GEMM-K (256 vs 224 bytes per output pixel).

The result is exactly the 7x7 conv's (integer products and sums, only reordered), so the golden
reference of the original node is the reference of this path. It is our runner's execution detail:
the ONNX node and the TensorRT contract still describe the 7x7 conv on CHW4 (TensorRT has no INT8
CHW16 format). `quantize_s2d` in plugins/kernels/network_ops.cu writes the folded input directly
from the fp32 image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import round_up
from .tactics import ConvShape

S2D_VEC = 16  # folded channels are padded to one 16-byte vector


def applies(shape: ConvShape) -> bool:
    """A stride-2 conv whose folded input still fits one 16-channel vector (C <= 4)."""
    return shape.stride == (2, 2) and 4 * shape.c <= S2D_VEC and shape.in_vec == 0


@dataclass(frozen=True)
class FoldedConv:
    """How one stride-2 conv maps onto its space-to-depth form."""

    original: ConvShape
    shape: ConvShape  # the stride-1 conv the kernel runs, on the CHW16 folded input
    q_top: int  # first row offset q of the folded kernel (negative: it reaches above the output row)
    q_left: int


def fold(shape: ConvShape) -> FoldedConv:
    if not applies(shape):
        raise ValueError(f"space-to-depth needs stride 2 and C <= 4, got {shape}")
    pt, pl = shape.pads[0], shape.pads[1]
    q_top, q_bottom = (-pt) // 2, (shape.r - 1 - pt) // 2
    q_left, q_right = (-pl) // 2, (shape.s - 1 - pl) // 2
    r2, s2 = q_bottom - q_top + 1, q_right - q_left + 1
    h2, w2 = (shape.h + 1) // 2, (shape.w + 1) // 2
    oh, ow = shape.out_hw
    # Bottom/right padding chosen so the folded conv has exactly the original output size.
    pb, pr = oh - 1 - h2 - (-q_top) + r2, ow - 1 - w2 - (-q_left) + s2
    folded = ConvShape(shape.n, 4 * shape.c, h2, w2, shape.k, r2, s2, (1, 1), (-q_top, -q_left, pb, pr), in_vec=S2D_VEC,
                       residual=shape.residual)
    assert folded.out_hw == (oh, ow), (folded, shape)
    return FoldedConv(shape, folded, q_top, q_left)


def fold_input(x: np.ndarray) -> np.ndarray:
    """[N, C, H, W] -> [N, 4C, ceil(H/2), ceil(W/2)]: channel (2a + b) * C + c holds pixel (2i + a, 2j + b)."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, round_up(h, 2), round_up(w, 2)), dtype=x.dtype)
    padded[:, :, :h, :w] = x
    blocks = padded.reshape(n, c, padded.shape[2] // 2, 2, padded.shape[3] // 2, 2)  # n c i a j b
    return np.ascontiguousarray(blocks.transpose(0, 3, 5, 1, 2, 4).reshape(n, 4 * c, padded.shape[2] // 2, padded.shape[3] // 2))


def fold_weight(w: np.ndarray, fc: FoldedConv) -> np.ndarray:
    """[K, C, R, S] -> [K, 4C, R', S']: tap (r', s') of folded channel (2a + b) * C + c is the original tap
    (2(r' + q_top) + a + pad_top, 2(s' + q_left) + b + pad_left), or 0 where that falls outside R x S."""
    k, c, r, s = w.shape
    sh = fc.shape
    out = np.zeros((k, 4 * c, sh.r, sh.s), dtype=w.dtype)
    pt, pl = fc.original.pads[0], fc.original.pads[1]
    for r2 in range(sh.r):
        for a in range(2):
            ro = 2 * (r2 + fc.q_top) + a + pt
            if not 0 <= ro < r:
                continue
            for s2 in range(sh.s):
                for b in range(2):
                    so = 2 * (s2 + fc.q_left) + b + pl
                    if 0 <= so < s:
                        out[:, (2 * a + b) * c:(2 * a + b + 1) * c, r2, s2] = w[:, :, ro, so]
    return out


# ---- the stem with its max-pool: plugins/kernels/stem_pool.cu ----------------------------------------------

POOL_SOURCE = "stem_pool.cu"
POOL_ENTRY = "trtfuse_stem_pool"
ROWS_SOURCE = "stem_pool_rows.cu"
ROWS_ENTRY = "trtfuse_stem_pool_rows"
POOL_WINDOW = (3, 2, 1)  # (kernel, stride, padding): the one max-pool the kernels' tiles are built for
POOL_TILE = (8, 14)  # the default tile: pooled rows x columns per CTA (stem_pool.cu's TPH, TPW)
# stem_pool.cu's tiles (a conv tile staged in shared memory, then pooled): larger tiles recompute less halo (8x14:
# 10 %) but fit fewer CTAs per SM.
GRID_TILES = ((8, 14), (4, 28), (8, 7), (14, 14))
# stem_pool_rows.cu's (sm_90a only): TPH pooled rows x 63 pooled columns walked a row at a time, the pool taken on the
# accumulators; 4 conv blocks of 64 columns per pooled row plus 2 per tile for the row above it.
ROW_TILES = ((8, 63), (4, 63))
# The tiles autotune and `bench kernels` time (pool_tiles: those a GPU runs).
POOL_TILES = GRID_TILES + ROW_TILES
POOL_THREADS = 256
ROWS_THREADS = 128
ROWS_PATCH_COLUMNS = 2 * (64 - 1) + 2 + 3  # stem_pool_rows.cu's IC: 64 columns' left and middle conv columns + the 4x4's 3


def tile_name(tile: tuple[int, int]) -> str:
    """"8x14" (stem_pool.cu) or "rows8" (stem_pool_rows.cu's 8 pooled rows): how plan names, records and test ids
    name a tile."""
    return f"rows{tile[0]}" if tile in ROW_TILES else f"{tile[0]}x{tile[1]}"


def tile_from_name(text: str) -> tuple[int, int]:
    """The tile of POOL_TILES that `text` (tile_name's form) names; ValueError for any other."""
    for tile in POOL_TILES:
        if tile_name(tile) == text:
            return tile
    raise ValueError(f"{text!r} is not a stem tile of the stem + max-pool kernels; tiles: {', '.join(map(tile_name, POOL_TILES))}")


def default_tile(arch: str) -> tuple[int, int]:
    """The tile a runner takes without autotune or plans: rows8 where wgmma runs (0.155 against 0.231 ms for 8x14 at
    batch 256 on the H200, docs/PERF.md), else 8x14."""
    return ROW_TILES[0] if arch == "sm_90" else POOL_TILE


def pool_tiles(arch: str, use_wgmma: bool | None = None) -> tuple[tuple[int, int], ...]:
    """The tiles the stem + max-pool kernels run on a GPU of compute capability `arch` (pool_variant's use_wgmma):
    the row tiles need wgmma."""
    return POOL_TILES if arch == "sm_90" and use_wgmma is not False else GRID_TILES


def pool_smem_bytes(tile: tuple[int, int], wgmma: bool, conv1: bool = False) -> int:
    """The dynamic shared memory of a tile's kernel (each checks it at compile time). stem_pool.cu: two input patches,
    the conv tile (rows of 64 channels + 16 bytes, whole m16 tiles), the per-channel factors, and on sm_90a the weights
    as wgmma's B. stem_pool_rows.cu: two input patches of 2 TPH + 1 conv rows (+ 3) by 131 columns and the factors
    (its weights are wgmma's A, in registers); conv1: with the next 1x1 conv inside, two pooled rows as that conv's B
    and its factors too."""
    k, s, _ = POOL_WINDOW
    weights, factors = 8 * 64 * 32, 2 * 64 * 4
    if tile in ROW_TILES:
        patch = (2 * tile[0] + 1 + 3) * -(-ROWS_PATCH_COLUMNS // 2) * 2 * 16
        return 2 * patch + factors + (2 * 64 * 64 + factors if conv1 else 0)
    conv_rows, conv_cols = (tile[0] - 1) * s + k, (tile[1] - 1) * s + k
    patch = (conv_rows + 3) * (conv_cols + 3) * 16  # the folded 4x4 conv reads 3 more rows and columns
    conv = -(-conv_rows * conv_cols // 16) * 16 * 80
    return (weights if wgmma else 0) + 2 * patch + conv + factors


def pool_variant(arch: str, use_wgmma: bool | None = None, tile: tuple[int, int] = POOL_TILE,
                 conv1: bool = False) -> tuple[str, dict, int]:
    """(NVRTC arch, defines, dynamic shared bytes) of the stem + max-pool kernel on a GPU of compute capability `arch`:
    wgmma (sm_90a) on Hopper, mma.sync elsewhere; use_wgmma=False picks mma.sync on Hopper too (the tests run both).
    A row tile (ROW_TILES) is stem_pool_rows.cu, wgmma only: ValueError elsewhere. conv1: the build that also runs the
    next 1x1 conv on the pooled rows (conv1_refusal), row tiles only."""
    wgmma = arch == "sm_90" and use_wgmma is not False
    if conv1 and tile not in ROW_TILES:
        raise ValueError(f"the next conv runs inside the row tiles' kernel only, not tile {tile_name(tile)}")
    smem = pool_smem_bytes(tile, wgmma, conv1)
    if tile in ROW_TILES:
        if not wgmma:
            raise ValueError(f"stem tile {tile_name(tile)} runs on Hopper's wgmma only (sm_90a)")
        defines = {"STEM_POOL_ROWS": 1, "STEM_POOL_ROWS_TPH": tile[0], "STEM_POOL_ROWS_SMEM": smem}
        return "sm_90a", {**defines, "STEM_POOL_ROWS_CONV1": 1} if conv1 else defines, smem
    defines = {"STEM_POOL_TPH": tile[0], "STEM_POOL_TPW": tile[1], "STEM_POOL_SMEM": smem}
    if wgmma:
        return "sm_90a", {"STEM_POOL_WGMMA": 1, **defines}, smem
    return arch, defines, smem


def pool_source(tile: tuple[int, int]) -> tuple[str, str, int]:
    """(kernel source, entry, threads per CTA) of a tile's kernel."""
    return (ROWS_SOURCE, ROWS_ENTRY, ROWS_THREADS) if tile in ROW_TILES else (POOL_SOURCE, POOL_ENTRY, POOL_THREADS)


def _pool_function(use_wgmma: bool | None = None, tile: tuple[int, int] = POOL_TILE, conv1: bool = False):
    from . import cuda_driver as cd

    arch, defines, smem = pool_variant(cd.compute_capability(cd.current_device()), use_wgmma, tile, conv1)
    source, entry, _ = pool_source(tile)
    return cd.kernel_module(source, defines, arch=arch).function(entry, smem), smem


def pool_refusal(shape: ConvShape, pool: tuple[int, int, int]) -> str | None:
    """Why the stem conv `shape` (the original, unfolded) followed by max-pool (kernel, stride, pad) cannot run as
    one stem_pool kernel, or None if it can: the kernel is built for the folded 4x4 conv of a 7x7/2 stem with 64
    output channels and the 3x3/2 pad-1 pool (ResNet's), its tile sizes fixed at compile time."""
    if not applies(shape):
        return "the conv is not a space-to-depth stem (stride 2, at most 4 input channels)"
    folded = fold(shape).shape
    if (folded.r, folded.s) != (4, 4):
        return f"the folded conv is {folded.r}x{folded.s}, the kernel runs 4x4 (a 7x7 or 8x8 stem)"
    if shape.k != 64:
        return f"the conv has {shape.k} output channels, the kernel computes 64"
    if tuple(pool) != POOL_WINDOW:
        return f"the max-pool is kernel {pool[0]} stride {pool[1]} pad {pool[2]}, the kernel pools 3x3/2 pad 1"
    return None


def conv1_refusal(shape: ConvShape, conv1: ConvShape, tile: tuple[int, int]) -> str | None:
    """Why the conv `conv1` reading the pooled output of the stem `shape` (unfolded) cannot run inside the stem + max-pool
    kernel of `tile`, or None if it can: the row tiles' kernel computes a 1x1, stride-1, unpadded 64 -> 64 conv without
    a residual (ResNet's res2 first conv1) on each pooled row it has just written."""
    if tile not in ROW_TILES:
        return f"the stem runs tile {tile_name(tile)}; the next conv runs inside the row tiles only"
    if (conv1.n, conv1.c, conv1.h, conv1.w) != (shape.n, shape.k, *pooled_hw(shape)):
        return f"the conv reads {conv1.n}x{conv1.c}x{conv1.h}x{conv1.w}, not the pooled output"
    if (conv1.r, conv1.s, conv1.stride, tuple(conv1.pads)) != (1, 1, (1, 1), (0, 0, 0, 0)):
        return f"the conv is {conv1.r}x{conv1.s} stride {conv1.stride[0]}, the kernel runs a 1x1 stride 1 unpadded"
    if conv1.k != 64:
        return f"the conv has {conv1.k} output channels, the kernel computes 64"
    if conv1.residual:  # (ConvShape's default: a conv not known to have none)
        return "the conv may add a residual"
    return None


def pooled_hw(shape: ConvShape) -> tuple[int, int]:
    k, s, p = POOL_WINDOW
    oh, ow = shape.out_hw
    return (oh + 2 * p - k) // s + 1, (ow + 2 * p - k) // s + 1


def launch_stem_pool(shape: ConvShape, x: int, folded_weight: int, scale: int, bias: int, out_scale: int, y: int,
                     *, relu: bool = True, stream=None, use_wgmma: bool | None = None,
                     tile: tuple[int, int] = POOL_TILE, image_index: int = 0, conv1: tuple | None = None) -> None:
    """The stem conv `shape` (unfolded; its input x already folded by quantize_s2d, weight by fold_weight and
    pack_weight) + requantize (+ ReLU) + the 3x3/2 max-pool into y: int8 CHW32 [N, 64, PH, PW]. use_wgmma: see
    pool_variant; tile: one of POOL_TILES. image_index: 0, or a device int64 [N] array: image n of the batch is then
    image image_index[n] of x (a library of folded images), read in place instead of gathered first. conv1: (its
    ConvShape, packed weight, scale, bias, out_scale, y1, relu) of the 1x1 conv on the pooled output computed inside
    (conv1_refusal), written to y1: int8 CHW32 [N, 64, PH, PW]; y is written as well."""
    import ctypes

    from . import cuda_driver as cd
    from .conv_params import ConvParamsStruct

    why = pool_refusal(shape, POOL_WINDOW)
    if why:
        raise ValueError(why)
    f = fold(shape).shape
    oh, ow = f.out_hw
    ph, pw = pooled_hw(shape)
    p = ConvParamsStruct(x=x, w=folded_weight, scale=scale, bias=bias, out_scale=out_scale, y=y, N=f.n, C=f.c, H=f.h,
                         W=f.w, K=f.k, OH=oh, OW=ow, R=f.r, S=f.s, stride_h=1, stride_w=1, pad_top=f.pads[0],
                         pad_left=f.pads[1], relu=int(relu), splits=1)
    tile = tuple(tile)
    p1 = ConvParamsStruct()  # the row tiles' kernel takes it always, reads it in its conv1 build only
    if conv1 is not None:
        shape1, w1, scale1, bias1, out_scale1, y1, relu1 = conv1
        why = conv1_refusal(shape, shape1, tile)
        if why:
            raise ValueError(why)
        p1 = ConvParamsStruct(x=y, w=w1, scale=scale1, bias=bias1, out_scale=out_scale1, y=y1, N=f.n, C=64, H=ph, W=pw,
                              K=64, OH=ph, OW=pw, R=1, S=1, stride_h=1, stride_w=1, relu=int(relu1), splits=1)
    fn, smem = _pool_function(use_wgmma, tile, conv1 is not None)
    threads = pool_source(tile)[2]
    tiles = f.n * -(-ph // tile[0]) * -(-pw // tile[1])
    resident = cd.max_active_blocks(fn, threads, smem) * cd.device_attribute("MULTIPROCESSOR_COUNT")
    args = [p, ctypes.c_int32(ph), ctypes.c_int32(pw), ctypes.c_uint64(image_index)] + ([p1] if tile in ROW_TILES else [])
    cd.launch(fn, (min(tiles, max(1, resident)), 1, 1), (threads, 1, 1), smem, stream,
              [ctypes.addressof(a) for a in args])
