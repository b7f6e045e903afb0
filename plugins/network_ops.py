"""Launchers for plugins/kernels/network_ops.cu: input quantize + CHW32/CHW4 reformat, int8 max-pool,
int8 global average pool, the fp32 classifier GEMM (its row-wise top-1 optionally fused in), row-wise top-1,
the sample gather of the Offline harness. Device pointers in, on a given stream (see plugins/conv.py for the
convs)."""

from __future__ import annotations

import ctypes

from . import cuda_driver as cd
_THREADS = 256


def _fn(name: str):
    return cd.kernel_module("network_ops.cu").function(name)


def _launch(name: str, work_items: int, args: list, stream=None, threads: int = _THREADS) -> None:
    blocks = max(1, min((work_items + threads - 1) // threads, 132 * 32))
    cd.launch(_fn(name), (blocks, 1, 1), (threads, 1, 1), 0, stream, [ctypes.addressof(a) for a in args])


def _p(v: int):
    return ctypes.c_uint64(v)


def _i(v: int):
    return ctypes.c_int32(v)


def quantize(x: int, scale: int, n: int, c: int, h: int, w: int, y: int, vec: int = 32, stream=None) -> None:
    """fp32 NCHW -> int8 CHW32 (vec=32) or CHW4 (vec=4)."""
    cb = (c + vec - 1) // vec
    _launch(f"trtfuse_quantize_chw{vec}", n * cb * h * w, [_p(x), _p(scale), _i(n), _i(c), _i(h), _i(w), _p(y)], stream)


def quantize_s2d(x: int, scale: int, n: int, c: int, h: int, w: int, y: int, stream=None) -> None:
    """fp32 NCHW (C <= 4) -> int8 space-to-depth CHW16 [N, 1, ceil(H/2), ceil(W/2), 16] (plugins/stem.py)."""
    if c > 4:
        raise ValueError("space-to-depth input needs C <= 4")
    _launch("trtfuse_quantize_s2d16", n * ((h + 1) // 2) * ((w + 1) // 2), [_p(x), _p(scale), _i(n), _i(c), _i(h), _i(w), _p(y)], stream)


def maxpool(x: int, n: int, c: int, h: int, w: int, kernel: int, stride: int, pad: int, y: int, stream=None) -> tuple[int, int]:
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    cb = (c + 31) // 32
    threads = min(256, (2 * ow + 31) // 32 * 32)  # a block per output row: a thread per 16-byte half-pixel
    _launch("trtfuse_maxpool_chw32", n * cb * oh * threads,
            [_p(x), _i(n), _i(cb), _i(h), _i(w), _i(oh), _i(ow), _i(kernel), _i(stride), _i(pad), _p(y)], stream,
            threads=threads)
    return oh, ow


def global_avgpool(x: int, in_scale: int, out_scale: int, n: int, c: int, h: int, w: int, y: int, stream=None) -> None:
    """int8 CHW32 [N, C, H, W] -> int8 [N, C_pad] (CHW32 with H = W = 1)."""
    cb = (c + 31) // 32
    _launch("trtfuse_global_avgpool_chw32", n * cb * 2,  # a thread per 16-channel half of a channel block
            [_p(x), _p(in_scale), _p(out_scale), _i(n), _i(cb), _i(h * w), _p(y)], stream)


def global_avgpool_f32(x: int, in_scale: int, n: int, c: int, h: int, w: int, y: int, stream=None) -> None:
    """int8 CHW32 [N, C, H, W] -> fp32 [N, C] dequantized means."""
    cb = (c + 31) // 32
    _launch("trtfuse_global_avgpool_chw32_f32", n * cb * 2,
            [_p(x), _p(in_scale), _i(n), _i(c), _i(cb), _i(h * w), _p(y)], stream)


# The classifier's tiles (plugins/kernels/network_ops.cu): entry -> ((M, N) outputs per CTA, threads per CTA)
LINEAR_TILES = {"narrow": ("trtfuse_linear_f32", (32, 64), 128), "wide": ("trtfuse_linear_f32_wide", (128, 128), 256)}
# The wide tile spends fewer issue slots on shared loads but makes 16x fewer CTAs: it is taken once its grid
# fills this fraction of the SMs in one wave (ResNet-50's 1000 classes: from batch 2048, 128 CTAs on 132 SMs).
LINEAR_WIDE_MIN_FILL = 0.9


def linear_tile(m: int, n: int, sm_count: int | None = None) -> str:
    """The tile linear_f32 runs an [m, n] output with on a GPU of `sm_count` SMs (default: the current one's); both
    give the same bits."""
    if sm_count is None:
        sm_count = cd.device_attribute("MULTIPROCESSOR_COUNT", cd.current_device())
    _, (bm, bn), _ = LINEAR_TILES["wide"]
    return "wide" if -(-m // bm) * -(-n // bn) >= LINEAR_WIDE_MIN_FILL * sm_count else "narrow"


def linear_top1_scratch(m: int) -> tuple[cd.DeviceBuffer, cd.DeviceBuffer]:
    """(top1_keys, row_block_done) for linear_f32's fused top-1 of up to `m` rows on either tile: a uint64 key per row
    and a counter per row block, zeroed here once. Every launch leaves them zeroed again, so they serve every later
    launch (and CUDA graph replay) in stream order; two launches in flight at once need two."""
    row_blocks = -(-m // min(bm for _, (bm, _), _ in LINEAR_TILES.values()))  # the most any tile makes
    keys, row_block_done = cd.DeviceBuffer(8 * m), cd.DeviceBuffer(4 * row_blocks)
    keys.fill(0)
    row_block_done.fill(0)
    return keys, row_block_done


def linear_f32(x: int, w: int, bias: int, m: int, n: int, k: int, y: int, stream=None, tile: str | None = None,
               top1: int | None = None, top1_keys: int | None = None, row_block_done: int | None = None) -> None:
    """fp32 y[M, N] = x[M, K] . w[N, K]^T + bias[N], each output one sequential fmaf chain over k
    (reference.linear_f32 gives the same bits). tile: "narrow" or "wide" (LINEAR_TILES), else linear_tile's.
    top1: also int32 top1[M] = numpy.argmax(y, axis=1) (argmax_rows' answer) in the same launch, through the
    scratch linear_top1_scratch(M) allocates (top1_keys, row_block_done: its two buffers' pointers)."""
    if min(m, n, k) < 1:
        raise ValueError(f"linear_f32 needs M, N, K >= 1, got {m}, {n}, {k}")
    fused_top1 = (top1, top1_keys, row_block_done)
    if any(p is None for p in fused_top1) and any(p is not None for p in fused_top1):
        raise ValueError("linear_f32's top-1 needs top1, top1_keys and row_block_done together")
    entry, (bm, bn), threads = LINEAR_TILES[tile or linear_tile(m, n)]
    args = [_p(x), _p(w), _p(bias), _i(m), _i(n), _i(k), _p(y)] + [_p(p or 0) for p in (top1_keys, row_block_done, top1)]
    cd.launch(_fn(entry), ((n + bn - 1) // bn, (m + bm - 1) // bm, 1), (threads, 1, 1), 0, stream,
              [ctypes.addressof(a) for a in args])


ARGMAX_DTYPES = {"float32": "trtfuse_argmax_rows_f32", "float16": "trtfuse_argmax_rows_f16"}


def argmax_rows(x: int, m: int, n: int, y: int, dtype: str = "float32", stream=None) -> None:
    """int32 y[M] = numpy.argmax(x[M, N], axis=1) for float32 or float16 x: the first index of each row's
    maximum, a NaN counting as the maximum (the first NaN wins)."""
    if dtype not in ARGMAX_DTYPES:
        raise ValueError(f"argmax_rows reads {' or '.join(ARGMAX_DTYPES)}, not {dtype}")
    if m < 1 or n < 1:
        raise ValueError(f"argmax_rows needs M, N >= 1, got {m}, {n}")
    warps_per_cta = _THREADS // 32  # one warp per row
    blocks = min((m + warps_per_cta - 1) // warps_per_cta, 132 * 32)
    args = [_p(x), _i(m), _i(n), _p(y)]
    cd.launch(_fn(ARGMAX_DTYPES[dtype]), (blocks, 1, 1), (_THREADS, 1, 1), 0, stream, [ctypes.addressof(a) for a in args])


def softmax_rows(x: int, m: int, n: int, y: int, stream=None) -> None:
    """fp32 y[M, N] = softmax(x[M, N], axis=1) (a classifier's trailing Softmax); y may be x."""
    if m < 1 or n < 1:
        raise ValueError(f"softmax_rows needs M, N >= 1, got {m}, {n}")
    warps_per_cta = _THREADS // 32  # one warp per row
    blocks = min((m + warps_per_cta - 1) // warps_per_cta, 132 * 32)
    args = [_p(x), _i(m), _i(n), _p(y)]
    cd.launch(_fn("trtfuse_softmax_rows_f32"), (blocks, 1, 1), (_THREADS, 1, 1), 0, stream, [ctypes.addressof(a) for a in args])


def gather_rows(src: int, index: int, row_bytes: int, rows: int, dst: int, stream=None) -> None:
    """dst[i] = src[index[i]] (int64 indices on the device), rows of row_bytes bytes (a multiple of 16)."""
    if row_bytes % 16:
        raise ValueError("rows must be a multiple of 16 bytes")
    args = [_p(src), _p(index), ctypes.c_int64(row_bytes), _i(rows), _p(dst)]
    cd.launch(_fn("trtfuse_gather_rows"), (min(rows, 132 * 8), 1, 1), (256, 1, 1), 0, stream,
              [ctypes.addressof(a) for a in args])
