"""Activation scales for the int8 rewrite: the scales-file format, its loader, and a simple max pass.

Format (`trtfuse-scales-v1`, a JSON object; see docs/passes.md):

    {"format": "trtfuse-scales-v1",
     "activations": {"<tensor name in the ORIGINAL fp32 model>": <scale, float > 0>, ...}}

A real value t is represented by the int8 q = saturate(round_half_to_even(t / scale)). Extra keys in
the object are ignored, so calibrators may add provenance ("method", "images", ...).

Until calibration exists, `max_activation_scales` runs the fp32 model with onnxruntime and takes
max|t| / 127 per tensor over a few images (symmetric max calibration: no clipping, no outlier handling).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from trtfuse.errors import TrtfuseError

SCALES_FORMAT = "trtfuse-scales-v1"
# A scale is stored as float32 and multiplied by weight scales (~1e-3) and its reciprocal taken: keep it, its
# reciprocal and 127 x it comfortably normal float32 numbers (1e-50 would round to 0, 1e39 to inf).
SCALE_MIN, SCALE_MAX = 1e-30, 1e30


def validate_scales(obj, source: str = "scales") -> dict[str, float]:
    if not isinstance(obj, dict) or obj.get("format") != SCALES_FORMAT:
        raise TrtfuseError(f"{source}: not a {SCALES_FORMAT} file (needs \"format\": \"{SCALES_FORMAT}\")")
    acts = obj.get("activations")
    if not isinstance(acts, dict):
        raise TrtfuseError(f"{source}: \"activations\" must be an object of tensor name -> scale")
    out = {}
    for name, value in acts.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise TrtfuseError(f"{source}: scale of {name!r} must be a finite positive number, got {value!r}")
        if not SCALE_MIN <= value <= SCALE_MAX:  # the op stores scales, their products and 1/scale as float32
            raise TrtfuseError(f"{source}: scale of {name!r} is {value!r}, outside the float32 range the int8 op can "
                               f"use [{SCALE_MIN:g}, {SCALE_MAX:g}]")
        out[str(name)] = float(value)
    return out


def load_scales(path: str | Path) -> dict[str, float]:
    from trtfuse.validate import check_input_file

    path = check_input_file(path, "scales")  # missing, a folder, a pipe: each named as such
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrtfuseError(f"{path}: not valid JSON ({exc})") from None
    return validate_scales(obj, str(path))


def scales_document(activations: dict[str, float], **provenance) -> dict:
    return {"format": SCALES_FORMAT, **provenance, "activations": {k: float(v) for k, v in activations.items()}}


def model_input_spec(model) -> tuple[str, list]:
    """(name, shape) of the model's single non-initializer input."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise TrtfuseError(f"expected a model with one image input, found {len(inputs)} inputs")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    return inputs[0].name, dims


def model_images(model, count: int, split: str = "calib", seed: int = 0) -> np.ndarray:
    """`count` default natural images sized for the model's [N, 3, H, W] input."""
    _, dims = model_input_spec(model)
    return input_images(dims, count, split, seed)


def input_images(dims: list, count: int, split: str = "calib", seed: int = 0) -> np.ndarray:
    """`count` default natural images for an input of dims [N, 3, S, S] (an ONNX input's or an engine's)."""
    from trtfuse.calib.data import default_images

    if len(dims) != 4 or dims[1] != 3 or dims[2] is None or dims[3] is None or dims[2] != dims[3]:
        raise TrtfuseError(f"default images need a static square [N, 3, S, S] input, model has {dims}")
    return default_images(count, size=int(dims[2]), seed=seed, split=split)


def run_fp32_batches(model, tensor_names, images: np.ndarray):
    """Yield, per batch, {name: array} for `tensor_names` (exposed as extra outputs) of the fp32 model."""
    import onnx
    import onnxruntime as ort

    from .graph_utils import copy_model

    from .qdq import elem_types, float16_conv_constants, has_float16

    # a stripped float16 Q/DQ model: its convs' float32 weights go float16 to run; its float16 tensors are
    # read as float16 outputs (their peaks are taken in float64 below either way)
    m = copy_model(float16_conv_constants(model))
    types = elem_types(m) if has_float16(m) else {}
    existing = {o.name for o in m.graph.output}
    for name in tensor_names:
        if name not in existing:
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, types.get(name, onnx.TensorProto.FLOAT), None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    input_name, dims = model_input_spec(model)
    batch = dims[0] if dims and dims[0] else len(images)
    if len(images) % batch:
        raise TrtfuseError(f"model has static batch {batch}; image count {len(images)} is not a multiple of it")
    names = list(tensor_names)
    for start in range(0, len(images), batch):
        outs = sess.run(names, {input_name: images[start : start + batch]})
        yield dict(zip(names, outs))


def max_activation_scales(model, tensor_names, images: np.ndarray) -> dict[str, float]:
    """max|t| / 127 per tensor over `images`; a tensor that is zero everywhere gets scale 1/127."""
    peak = {name: 0.0 for name in tensor_names}
    for outs in run_fp32_batches(model, tensor_names, images):
        for name, value in outs.items():
            peak[name] = max(peak[name], float(np.max(np.abs(value.astype(np.float64)))) if value.size else 0.0)
    return {name: (p if p > 0 else 1.0) / 127.0 for name, p in peak.items()}
