"""Real exporters' and quantizers' graphs without their weights: tests/data/*.stripped.onnx.

torchvision_*: ONNX models exported by torch.onnx.export from torchvision (scripts/export_torchvision.py;
torch 2.14.1, torchvision 0.29.1, weights=None). modelopt_*: trtfuse's ResNet-18 quantized by NVIDIA ModelOpt's
ONNX PTQ (scripts/quantize_modelopt.py; nvidia-modelopt 0.47.0). Each with its float initializers' data dropped by
scripts/strip_onnx_weights.py (names, shapes and dtypes kept; small integer tensors and Q/DQ scales and
zero points kept). `load_fixture` refills the dropped data with seeded random values of He-like scale,
so the tests run the exporters' real graph structure (Identity-shared constants, Cast chains, Q/DQ
placement, classifier forms) on the CPU. `save_tiny_rewritten`: trtfuse's own small model as `rewrite --fuse all`
writes it, for the commands that take one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(__file__).parent / "data"
TORCHSCRIPT_R50 = "torchvision_resnet50_torchscript_opset17"
DYNAMO_R50 = "torchvision_resnet50_dynamo_opset18"
QAT_R18 = "torchvision_resnet18_qat_opset17"
QAT_RESQ_R18 = "torchvision_resnet18_qat_resq_opset17"
MODELOPT_R18 = "modelopt_int8_resnet18_fp32"
MODELOPT_FP16_R18 = "modelopt_int8_resnet18_fp16"


def _refill(name, dims, dtype, rng) -> np.ndarray:
    shape = tuple(int(d) for d in dims)
    if len(shape) <= 1:  # biases, BN parameters: positive (the exporter shares one tensor between BN gamma and var)
        values = rng.uniform(0.5, 1.5, size=shape)
    elif len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        values = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)
    return values.astype(dtype)


def load_fixture(name: str, seed: int = 0) -> onnx.ModelProto:
    """The fixture with its dropped data refilled. A weight that a QuantizeLinear quantizes per channel (a QAT
    export) is scaled so each filter's peak is its quantizer's amax (127 * scale), as after QAT training:
    random values at another scale would clip."""
    model = onnx.load(str(DATA / f"{name}.stripped.onnx"))
    rng = np.random.default_rng(seed)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.doc_string != "trtfuse: data stripped"}
    weight_scale = {n.input[0]: n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    for init in model.graph.initializer:
        if init.doc_string != "trtfuse: data stripped":
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        value = _refill(init.name, init.dims, dtype, rng)
        scale = values.get(weight_scale.get(init.name, ""))
        if scale is not None and value.ndim == 4 and scale.size == value.shape[0]:
            peak = np.abs(value).reshape(value.shape[0], -1).max(axis=1)
            value = (value * (127 * scale / peak).reshape(-1, 1, 1, 1)).astype(dtype)
        init.CopyFrom(numpy_helper.from_array(value, init.name))
    return model


def save_tiny_rewritten(path) -> onnx.ModelProto:
    """A ResNet-18 at 32 x 32 rewritten `--fuse all` (4 calibration images), saved at `path`; returns the model."""
    from trtfuse.graph_passes.pipeline import rewrite
    from trtfuse.io import save_model
    from trtfuse.models import build

    model, _ = rewrite(build("resnet18", image_size=32, batch=None), "all",
                       calib_images=np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32))
    save_model(model, path)
    return model
