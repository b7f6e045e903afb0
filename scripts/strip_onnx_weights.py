"""Write a weight-stripped copy of an ONNX model: the graph as the exporter wrote it, initializers kept by
name, shape and dtype, their data dropped (float tensors) or kept (integer tensors up to 64 elements: the
shape constants Reshape and friends read; the scales and zero points of QuantizeLinear/DequantizeLinear). tests/onnx_fixtures.py refills the dropped data with seeded random
values, so the tests run the real exporter's graph structure without shipping its weights.

    python scripts/strip_onnx_weights.py IN.onnx OUT.onnx
"""

import sys

import numpy as np
import onnx
from onnx import numpy_helper

KEEP_INT_ELEMENTS = 64


def strip(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    qparams = {name for n in out.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") for name in n.input[1:]}
    for init in out.graph.initializer:
        arr = numpy_helper.to_array(init)
        if (np.issubdtype(arr.dtype, np.integer) and arr.size <= KEEP_INT_ELEMENTS) or init.name in qparams:
            continue
        dims, dtype, name = list(init.dims), init.data_type, init.name
        init.Clear()
        init.name, init.data_type = name, dtype
        init.dims.extend(dims)
        init.doc_string = "trtfuse: data stripped"
    return out


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    model = onnx.load(src, load_external_data=True)
    onnx.save(strip(model), dst)
