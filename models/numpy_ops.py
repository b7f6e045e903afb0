"""The few fp32 CPU ops the weight synthesis needs, on NHWC arrays.

NHWC (channels last) keeps every convolution one BLAS GEMM: a 1x1 conv is `x.reshape(-1, C) @ W`, a KxK
conv gathers its K*K shifted views side by side (im2col) first. Images are processed in chunks so the
im2col matrix of the 7x7 stem stays around 100 MB however many images feed the BN statistics.
"""

from __future__ import annotations

import numpy as np

# Upper bound on the im2col matrix of one chunk, in float32 elements (~128 MB).
_IM2COL_BUDGET = 32 * 1024 * 1024


def conv2d_nhwc(x: np.ndarray, weight_kcrs: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Convolution without bias. x: [N, H, W, C] float32; weight in ONNX order [K, C, R, S]; returns [N, OH, OW, K]."""
    n, h, w, c = x.shape
    k, wc, r, s = weight_kcrs.shape
    assert wc == c, (wc, c)
    oh = (h + 2 * pad - r) // stride + 1
    ow = (w + 2 * pad - s) // stride + 1
    # Patch columns are ordered (C, R, S) like the ONNX weight, so the GEMM reads the weight through a
    # transposed view: no copy, and BLAS is much faster on it than on a re-laid-out copy when few rows.
    w_mat_t = np.asarray(weight_kcrs, dtype=np.float32).reshape(k, c * r * s).T
    out = np.empty((n, oh, ow, k), dtype=np.float32)

    if r == 1 and s == 1 and pad == 0:
        xs = x[:, ::stride, ::stride, :] if stride != 1 else x
        np.matmul(np.ascontiguousarray(xs).reshape(-1, c), w_mat_t, out=out.reshape(-1, k))
        return out

    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else x
    chunk = max(1, _IM2COL_BUDGET // max(1, oh * ow * r * s * c))
    for start in range(0, n, chunk):
        xc = xp[start : start + chunk]
        m = xc.shape[0]
        patches = np.empty((m, oh, ow, c, r, s), dtype=np.float32)
        for i in range(r):
            for j in range(s):
                patches[..., i, j] = xc[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride, :]
        np.matmul(patches.reshape(-1, c * r * s), w_mat_t, out=out[start : start + m].reshape(-1, k))
    return out


def maxpool_nhwc(x: np.ndarray, kernel: int, stride: int, pad: int) -> np.ndarray:
    """Max pooling; padded positions never win (they read as -inf), as in ONNX MaxPool."""
    n, h, w, c = x.shape
    oh = (h + 2 * pad - kernel) // stride + 1
    ow = (w + 2 * pad - kernel) // stride + 1
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=-np.inf) if pad else x
    out = np.full((n, oh, ow, c), -np.inf, dtype=np.float32)
    for i in range(kernel):
        for j in range(kernel):
            np.maximum(out, xp[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride, :], out=out)
    return out


def channel_stats(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (biased, population) variance of an NHWC tensor, accumulated in float64."""
    flat = y.reshape(-1, y.shape[-1])
    mean = flat.mean(axis=0, dtype=np.float64)
    var = np.square(flat, dtype=np.float64).mean(axis=0) - np.square(mean)
    return mean, np.maximum(var, 0.0)


def batchnorm_nhwc(y: np.ndarray, gamma, beta, mean, var, eps: float) -> np.ndarray:
    """Inference BatchNormalization (the ONNX formula) on the last axis, in place on a float32 copy."""
    scale = (np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps))
    shift = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    out = y * scale.astype(np.float32)
    out += shift.astype(np.float32)
    return out
