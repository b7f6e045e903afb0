"""Golden reference of the fused INT8 convolution op (docs/ops.md), exact and in numpy.

The convolution is computed in float64 on integer values: every product and partial sum is an
integer below 2^53 (|acc| <= 128 * 128 * KG, KG <= 2^20 here), so float64 BLAS is exact and fast.
The epilogue then runs in float32, one IEEE-rounded operation at a time, in the order docs/ops.md
fixes; a GPU kernel that does the same operations without FMA contraction matches bit for bit.
"""

from __future__ import annotations

import numpy as np

from .layout import conv_output_hw, unpack_weight


def conv_int8_accumulate(x: np.ndarray, w: np.ndarray, strides=(1, 1), pads=(0, 0, 0, 0)) -> np.ndarray:
    """int8 x [N, C, H, W] (*) int8 w [K, C, R, S] -> int32-valued accumulators [N, K, OH, OW] (int64)."""
    n, c, h, wd = x.shape
    k, c2, r, s = w.shape
    if c != c2:
        raise ValueError(f"input has {c} channels, weight expects {c2}")
    oh, ow = conv_output_hw(h, wd, (r, s), strides, pads)
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), dtype=np.float64)
    xp[:, :, pads[0] : pads[0] + h, pads[1] : pads[1] + wd] = x
    sh, sw = strides
    # im2col as a strided view: [N, OH, OW, C, R, S]
    st = xp.strides
    cols = np.lib.stride_tricks.as_strided(
        xp, shape=(n, oh, ow, c, r, s), strides=(st[0], st[2] * sh, st[3] * sw, st[1], st[2], st[3]), writeable=False
    )
    acc = cols.reshape(n * oh * ow, c * r * s) @ w.reshape(k, c * r * s).astype(np.float64).T
    return acc.reshape(n, oh, ow, k).transpose(0, 3, 1, 2).astype(np.int64)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add, correctly rounded (one rounding of the exact a*b + c), elementwise.

    a*b of two float32 is exact in float64; the float64 sum p + c is rounded *to odd* (TwoSum gives its
    exact error; an inexact sum with an even last bit moves one ulp toward the error), and a round-to-odd
    result with 29 spare bits rounds to float32 exactly as the exact value would (Boldo & Melquiond)."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bp = s - p
    err = (p - (s - bp)) + (c - bp)  # exact: s + err == p + c
    bits = s.view(np.int64)
    inexact_even = (err != 0) & ((bits & 1) == 0)
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where(inexact_even, np.nextafter(s, toward), s)
    return s.astype(np.float32)


def folded_scales(scale: np.ndarray, bias: np.ndarray, out_scale: float, residual_scale: float | None):
    """docs/ops.md step 2: per channel a = scale / out_scale, b = bias / out_scale, and rs =
    residual_scale / out_scale, each one correctly rounded float32 division."""
    f32 = np.float32
    out = f32(out_scale)
    a = np.asarray(scale, f32) / out
    b = np.asarray(bias, f32) / out
    rs = None if residual_scale is None else f32(f32(residual_scale) / out)
    return a, b, rs


def requantize_epilogue(
    acc: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    out_scale: float,
    residual: np.ndarray | None = None,
    residual_scale: float | None = None,
    relu: bool = True,
) -> np.ndarray:
    """acc [N, K, OH, OW] -> int8 (docs/ops.md): with a, b, rs = folded_scales(...),
    v = fma(float(acc), a[k], b[k]); v = fma(float(residual), rs, v); ReLU; round half to even; saturate."""
    k = acc.shape[1]
    a, b, rs = folded_scales(scale[:k], bias[:k], out_scale, residual_scale if residual is not None else None)
    shape = (1, k, 1, 1)
    y = fma_f32(acc.astype(np.float32), a.reshape(shape), b.reshape(shape))
    if residual is not None:
        y = fma_f32(residual.astype(np.float32), rs, y)
    if relu:
        y = np.maximum(y, np.float32(0))
    return np.clip(np.rint(y), -128, 127).astype(np.int8)


def fused_conv_int8(
    x: np.ndarray,
    weight_packed: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    out_scale,
    residual: np.ndarray | None = None,
    residual_scale=None,
    *,
    in_channels: int,
    out_channels: int,
    kernel_shape,
    strides,
    pads,
    relu: int,
) -> np.ndarray:
    """The op as its ONNX node states it: logical NCHW int8 in, logical NCHW int8 out."""
    w = unpack_weight(weight_packed, out_channels, in_channels, kernel_shape)
    acc = conv_int8_accumulate(x, w, tuple(strides), tuple(pads))
    return requantize_epilogue(
        acc,
        np.asarray(scale, np.float32),
        np.asarray(bias, np.float32),
        float(np.asarray(out_scale).reshape(-1)[0]),
        residual,
        None if residual_scale is None else float(np.asarray(residual_scale).reshape(-1)[0]),
        bool(relu),
    )


# ---- network ops around the fused convs (docs/ops.md, "Network ops") ----

def quantize(x: np.ndarray, scale) -> np.ndarray:
    """fp32 -> int8: saturate(rint(x / scale)), as ONNX QuantizeLinear with zero point 0."""
    return np.clip(np.rint(x.astype(np.float32) / np.float32(scale)), -128, 127).astype(np.int8)


def maxpool_int8(x: np.ndarray, kernel: int, stride: int, pad: int) -> np.ndarray:
    """int8 [N, C, H, W] max-pool over a square window; padded positions never win."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    xp = np.full((n, c, h + 2 * pad, w + 2 * pad), -128, dtype=np.int8)
    xp[:, :, pad : pad + h, pad : pad + w] = x
    out = np.full((n, c, oh, ow), -128, dtype=np.int8)
    for r in range(kernel):
        for s in range(kernel):
            out = np.maximum(out, xp[:, :, r : r + stride * oh : stride, s : s + stride * ow : stride])
    return out


def global_avgpool_int8(x: np.ndarray, in_scale, out_scale) -> np.ndarray:
    """int8 [N, C, H, W] -> int8 [N, C]: exact int sum, then in fp32 (sum / HW) * in_scale / out_scale."""
    n, c, h, w = x.shape
    total = x.astype(np.int64).sum(axis=(2, 3)).astype(np.float32)
    mean = total / np.float32(h * w)
    return np.clip(np.rint((mean * np.float32(in_scale)) / np.float32(out_scale)), -128, 127).astype(np.int8)


def gemm_int8_f32out(x: np.ndarray, w: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The classifier: int8 x [M, K] . int8 w [N, K]^T -> fp32 [M, N] = float(acc) * scale[n] + bias[n]."""
    acc = x.astype(np.float64) @ w.astype(np.float64).T  # exact: integers below 2^53
    n = w.shape[0]
    return acc.astype(np.float32) * scale[:n].astype(np.float32) + bias[:n].astype(np.float32)


LINEAR_K_STEP = 32  # trtfuse_linear_f32 stages K 32 at a time, zero past K


def linear_f32(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """fp32 x [M, K] . w [N, K]^T + bias [N] with the bits of the GPU's trtfuse_linear_f32: per output
    acc = 0; acc = fma(x[m, k], w[n, k], acc) for k ascending over K zero-padded to a multiple of 32;
    y = acc + bias[n]. Vectorized over (M, N), one step per k: slow for long K on big outputs."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x [M, K] and w [N, K], got {x.shape} and {w.shape}")
    k_total = x.shape[1]
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(k_total):
        acc = fma_f32(x[:, k, None], w[None, :, k], acc)
    if k_total % LINEAR_K_STEP:
        # The zero steps: fma(0, 0, acc) == acc except that -0 becomes +0; the first does all there is.
        acc = fma_f32(np.float32(0), np.float32(0), acc)
    return acc + np.asarray(bias, np.float32).reshape(1, -1)
