"""The host mirror of trtfuse::ConvParams (plugins/kernels/conv_params.cuh), shared by every conv launcher."""

from __future__ import annotations

import ctypes
from functools import lru_cache


class ConvParamsStruct(ctypes.Structure):
    """Mirror of trtfuse::ConvParams (plugins/kernels/conv_params.cuh); same field order."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "w", "scale", "bias", "out_scale", "residual",
                                               "residual_scale", "y", "workspace", "counters", "y_f32")] + [
        (n, ctypes.c_int32) for n in ("N", "C", "H", "W", "K", "OH", "OW", "R", "S", "stride_h", "stride_w",
                                      "pad_top", "pad_left", "relu", "splits")] + [
        (f"{name}_{f}", ctypes.c_uint32) for name in ("div_ohw", "div_ow") for f in ("d", "mul", "shr")]


@lru_cache(maxsize=None)  # launched once per conv per forward outside graphs: compute each divisor's numbers once
def fast_divmod(d: int) -> tuple[int, int, int]:
    """(d, mul, shr) of trtfuse::FastDivmod::make (plugins/kernels/conv_params.cuh), computed here once."""
    if d == 1:
        return 1, 0, 0
    l = (d - 1).bit_length()  # ceil(log2 d)
    return d, ((1 << (31 + l)) + d - 1) // d, l - 1
