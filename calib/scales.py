"""The scales file `trtfuse rewrite --scales` consumes, and a TensorRT (<= 10) calibration cache.

scales JSON (format "trtfuse-scales-v1"):
  {"format": "trtfuse-scales-v1",
   "activations": {tensor_name: scale, ...},   # ORIGINAL fp32 model's tensor names; scale = real value
                                                # of one int8 step, symmetric, zero point 0
   "amax": {tensor_name: threshold, ...},       # the clipping threshold, = 127 * scale
   "metadata": {"method": ..., "percentile": ..., "images": ..., "data": ..., "model": ...,
                "model_sha256": ..., "tensors": ..., "selection": ..., "seconds": ..., "trtfuse": ...}}

TensorRT calibration cache (what IInt8Calibrator::writeCalibrationCache produced): a first line
`TRT-<version>-EntropyCalibration2`, then one `tensor_name: <hex>` line per tensor, where <hex> is the
IEEE-754 float32 bit pattern of the scale, big-endian, as 8 lowercase hex digits (TensorRT reads the
dynamic range as scale * 127).
"""

from __future__ import annotations

import hashlib
import os
import struct

from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.scales import SCALES_FORMAT as FORMAT  # one definition, shared with the rewrite

DEFAULT_CACHE_VERSION = "8601"  # TensorRT 8.6.1: the last release where implicit INT8 was not deprecated
CACHE_ALGORITHMS = {"entropy": "EntropyCalibration2", "max": "MinMaxCalibration",
                    "percentile": "EntropyCalibration2", "mse": "EntropyCalibration2"}


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def scales_document(scales: dict[str, float], amax: dict[str, float], metadata: dict) -> dict:
    return {"format": FORMAT, "activations": {k: float(v) for k, v in scales.items()},
            "amax": {k: float(v) for k, v in amax.items()}, "metadata": metadata}


def validate_scales_document(doc) -> dict[str, float]:
    """The activations table of a scales document, checked by the rewrite's own loader (one-line errors)."""
    from trtfuse.graph_passes.scales import validate_scales

    return validate_scales(doc)


def read_scales(path: str | os.PathLike) -> dict[str, float]:
    from trtfuse.graph_passes.scales import load_scales

    return load_scales(path)


def float_to_hex(value: float) -> str:
    return struct.pack(">f", value).hex()


def hex_to_float(text: str) -> float:
    return struct.unpack(">f", bytes.fromhex(text))[0]


def calibration_cache_text(scales: dict[str, float], method: str = "entropy",
                           version: str = DEFAULT_CACHE_VERSION) -> str:
    lines = [f"TRT-{version}-{CACHE_ALGORITHMS.get(method, 'EntropyCalibration2')}"]
    lines += [f"{name}: {float_to_hex(scale)}" for name, scale in scales.items()]
    return "\n".join(lines) + "\n"


def parse_calibration_cache(text: str) -> dict[str, float]:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("TRT-"):
        raise TrtfuseError("not a TensorRT calibration cache (first line must start with 'TRT-')")
    out = {}
    for line in lines[1:]:
        if line.strip():
            name, _, value = line.rpartition(":")
            out[name.strip()] = hex_to_float(value.strip())
    return out
