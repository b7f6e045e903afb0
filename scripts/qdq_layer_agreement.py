"""Per-layer int8 agreement of a rewritten Q/DQ model with ONNX Runtime executing the Q/DQ model.

For the first N plugin nodes: their int8 outputs (trtfuse's CPU golden executor) against the int8 outputs of the
model's QuantizeLinear of the same tensor (ORT names it `<tensor>_QuantizeLinear_Output`, as quantize_static
writes it), over 8 held-out default images, with ORT's graph optimizations off (the Q/DQ chain as written)
and at ORT's default (its QDQ fusions). Each side runs the whole network prefix: differences accumulate.

    python scripts/qdq_layer_agreement.py MODEL.qdq.onnx MODEL.qdq.all.onnx N
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, TensorProto
from trtfuse.graph_passes.scales import model_images
from trtfuse.runtime.cpu_executor import run_model
qf, rwf, nlayers = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = onnx.load(qf); rw = onnx.load(rwf)
imgs = model_images(q, 8, split="heldout")
plug = [n.output[0] for n in rw.graph.node if n.domain == "trtfuse"][:nlayers]
names = [p[:-len("__int8")] for p in plug]
qouts = [n + "_QuantizeLinear_Output" for n in names]
m = onnx.ModelProto(); m.CopyFrom(q)
for n in qouts: m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.INT8, None))
for lvl, lname in ((ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "none"), (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "all")):
    so = ort.SessionOptions(); so.graph_optimization_level = lvl
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    acc = {n: [] for n in names}
    for i in range(len(imgs)):
        ref = s.run(qouts, {q.graph.input[0].name: imgs[i:i+1]})
        ours = run_model(rw, {rw.graph.input[0].name: imgs[i:i+1]}, plug)
        for n, r, o in zip(names, ref, ours): acc[n].append(np.abs(r.astype(int) - o.astype(int)).ravel())
    for n in names:
        d = np.concatenate(acc[n])
        print(f"ort-{lname} {n:28s} equal {100*(d==0).mean():7.3f}%  1 LSB {100*(d==1).mean():6.3f}%  >1 LSB {100*(d>1).mean():6.3f}%  max {d.max()}")
