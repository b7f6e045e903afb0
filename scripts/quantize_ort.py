"""Quantize an ONNX model with ONNX Runtime's quantize_static, as a user brings a Q/DQ model: QDQ format,
per-channel int8 weights, symmetric int8 activations, calibrated on the model's first default images
(the calibration split of `trtfuse models`' embedded photos; evaluate's default images are held out from it).

    python scripts/quantize_ort.py IN.onnx OUT.onnx [CALIBRATION_IMAGES]
"""

import sys

import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from trtfuse.graph_passes.scales import model_images

src, dst = sys.argv[1], sys.argv[2]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 8
model = onnx.load(src)
images = model_images(model, count)
input_name = model.graph.input[0].name


class OneImageAtATime(CalibrationDataReader):
    def __init__(self):
        self._feeds = iter([{input_name: images[i:i + 1]} for i in range(len(images))])

    def get_next(self):
        return next(self._feeds, None)


quantize_static(src, dst, OneImageAtATime(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True})
