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
    folded = ConvShape(shape.n, 4 * shape.c, h2, w2, shape.k, r2, s2, (1, 1), (-q_top, -q_left, pb, pr), in_vec=S2D_VEC)
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
