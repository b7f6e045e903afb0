"""Quantize an ONNX model with NVIDIA ModelOpt's ONNX PTQ (pip install "nvidia-modelopt[onnx]"; runs on the CPU):
int8, max calibration on the images of a .npy file, as tests/data/modelopt_int8_resnet18_*.stripped.onnx were made
(nvidia-modelopt 0.47.0, from `trtfuse models resnet18 -o r18f.onnx --image-size 64 --opset 17 --fold-bn` and 8
default calibration images saved with numpy.save).

    python scripts/quantize_modelopt.py IN.onnx OUT.onnx CALIB.npy [fp32|fp16]

The last argument is ModelOpt's high_precision_dtype: its default, fp16, also converts the float parts of the
model to float16 (the rewrite fuses it too, its float16 scales upcast: docs/passes.md, "Quantized (Q/DQ) models").
"""

import sys

import numpy as np
import onnx
from modelopt.onnx.quantization import quantize

src, dst, calib = sys.argv[1], sys.argv[2], sys.argv[3]
precision = sys.argv[4] if len(sys.argv) > 4 else "fp16"
model = onnx.load(src)
quantize(onnx_path=src, quantize_mode="int8", calibration_data={model.graph.input[0].name: np.load(calib)},
         calibration_method="max", calibration_eps=["cpu"], output_path=dst, high_precision_dtype=precision)
