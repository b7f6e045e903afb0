"""Launchers for plugins/kernels/elementwise.cu."""

from __future__ import annotations

import ctypes

from . import cuda_driver as cd


def _fn(name: str):
    return cd.kernel_module("elementwise.cu").function(name)


def add_relu_requant(a: int, a_scale: int, r: int, r_scale: int, out_scale: int, relu: bool, nbytes: int, y: int,
                     stream=None) -> None:
    """y = requant(relu?(a * a_scale + r * r_scale) / out_scale) over nbytes int8 (a multiple of 16)."""
    if nbytes % 16:
        raise ValueError("CHW32 tensors are a multiple of 16 bytes")
    threads = 256
    blocks = max(1, min((nbytes // 16 + threads - 1) // threads, 132 * 16))
    args = [ctypes.c_uint64(a), ctypes.c_uint64(a_scale), ctypes.c_uint64(r), ctypes.c_uint64(r_scale),
            ctypes.c_uint64(out_scale), ctypes.c_int32(int(relu)), ctypes.c_int64(nbytes), ctypes.c_uint64(y)]
    cd.launch(_fn("trtfuse_add_relu_requant"), (blocks, 1, 1), (threads, 1, 1), 0, stream,
              [ctypes.addressof(v) for v in args])
