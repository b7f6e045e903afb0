"""Physical layouts of the fused conv op: vectorized-channel activations and the packed weight.

Activations (TensorRT TensorFormat.CHW32 / CHW4): logical [N, C, H, W] is stored as
[N][ceil(C/V)][H][W][V], element (n, c, h, w) at [n][c // V][h][w][c % V]; channels past C are zero.
V = 32 everywhere, except a conv input with C <= 4 (the RGB stem), which is CHW4 so the stem reads
and multiplies 4 channel slots per tap instead of 32.

Weight: the implicit GEMM's B matrix, [K_pad, KG_pad] int8, row k = output channel k, K_pad = K
rounded up to 32. Its GEMM-K index walks the input exactly as the kernel gathers it,
    g = ((cb * R + r) * S + s) * V + cv,    input channel c = cb * V + cv,
so one 32-byte run of g is one tap (r, s) of 32 consecutive channels (V = 32), or 8 taps of 4
channels (V = 4). KG = ceil(C/V) * R * S * V, padded with zero columns to KG_pad, a multiple of 32.
"""

from __future__ import annotations

import numpy as np


def channel_vector(in_channels: int) -> int:
    """Vector width V of an activation with this many channels, as the fused conv reads it."""
    return 4 if in_channels <= 4 else 32


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def pack_nchwv(x: np.ndarray, vec: int = 32) -> np.ndarray:
    """[N, C, H, W] -> [N, ceil(C/vec), H, W, vec], zero padding channels."""
    n, c, h, w = x.shape
    cp = round_up(c, vec)
    padded = np.zeros((n, cp, h, w), dtype=x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, cp // vec, vec, h, w).transpose(0, 1, 3, 4, 2))


def unpack_nchwv(x: np.ndarray, channels: int) -> np.ndarray:
    """[N, C/vec, H, W, vec] -> [N, channels, H, W]."""
    n, cb, h, w, vec = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * vec, h, w)[:, :channels])


def pack_chw32(x: np.ndarray) -> np.ndarray:
    return pack_nchwv(x, 32)


def unpack_chw32(x: np.ndarray, channels: int) -> np.ndarray:
    return unpack_nchwv(x, channels)


def gemm_k(in_channels: int, kernel_shape, vec: int | None = None) -> tuple[int, int]:
    """(KG, KG_pad): the implicit GEMM's reduction length before and after padding to 32.

    `vec` defaults to the op's layout (channel_vector); the space-to-depth stem (plugins/stem.py)
    reads a CHW16 tensor of its own."""
    vec = vec or channel_vector(in_channels)
    r, s = kernel_shape
    kg = round_up(in_channels, vec) * r * s
    return kg, round_up(kg, 32)


def pack_weight(w: np.ndarray, vec: int | None = None) -> np.ndarray:
    """int8 [K, C, R, S] -> packed [K_pad, KG_pad] int8 (see module docstring)."""
    k, c, r, s = w.shape
    vec = vec or channel_vector(c)
    cp = round_up(c, vec)
    kp = round_up(k, 32)
    kg, kg_pad = gemm_k(c, (r, s), vec)
    full = np.zeros((kp, cp, r, s), dtype=np.int8)
    full[:k, :c] = w
    # [K, cb, V, R, S] -> [K, cb, R, S, V]
    b = full.reshape(kp, cp // vec, vec, r, s).transpose(0, 1, 3, 4, 2).reshape(kp, kg)
    out = np.zeros((kp, kg_pad), dtype=np.int8)
    out[:, :kg] = b
    return out


def unpack_weight(packed: np.ndarray, out_channels: int, in_channels: int, kernel_shape) -> np.ndarray:
    """Inverse of pack_weight: packed [K_pad, KG_pad] -> int8 [K, C, R, S]."""
    r, s = kernel_shape
    vec = channel_vector(in_channels)
    cp = round_up(in_channels, vec)
    kg, _ = gemm_k(in_channels, kernel_shape)
    kp = packed.shape[0]
    full = packed[:, :kg].reshape(kp, cp // vec, r, s, vec).transpose(0, 1, 4, 2, 3).reshape(kp, cp, r, s)
    return np.ascontiguousarray(full[:out_channels, :in_channels])


def conv_output_hw(h: int, w: int, kernel_shape, strides, pads) -> tuple[int, int]:
    r, s = kernel_shape
    oh = (h + pads[0] + pads[2] - r) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - s) // strides[1] + 1
    return oh, ow
