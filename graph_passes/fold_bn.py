"""Fold BatchNormalization into the preceding Conv.

Pattern: Conv(x, W[, b]) -> BatchNormalization(scale, B, mean, var, epsilon), inference mode.
Result:  Conv(x, W * a[k], (b - mean) * a + B) with a = scale / sqrt(var + epsilon), computed in
float64 and stored as float32, so the function is preserved up to fp32 rounding. The folded Conv
takes over the BN's output tensor, so tensor names a user (or a scales file) knows stay valid.

Rejected (the BN stays, the reason is reported):
  * the Conv output has another reader or is a graph output (folding would change that reader's value);
  * W, the conv bias or any BN parameter is not a constant (nothing to fold at rewrite time);
  * the BN runs in training mode or has its optional running-statistics outputs;
  * the weight is not at least 3-D (no per-output-channel axis to scale).
BatchNormalization not fed by a Conv is not a candidate and is left alone.
"""

from __future__ import annotations

import numpy as np

from .graph_utils import constant_array, export_graph, has_single_consumer, import_graph, optional_input, producer
from .report import FOLDED, REJECTED, Candidate


def _reject_reason(graph, conv, bn) -> str | None:
    if not has_single_consumer(graph, conv.outputs[0], bn):
        return "conv output has other readers besides the BatchNormalization"
    if int(bn.attrs.get("training_mode", 0)) != 0 or len(bn.outputs) > 1:
        return "BatchNormalization in training mode"
    if constant_array(conv.inputs[1]) is None:
        return "conv weight is not a constant"
    if optional_input(conv, 2) is not None and constant_array(conv.inputs[2]) is None:
        return "conv bias is not a constant"
    if any(constant_array(t) is None for t in bn.inputs[1:5]):
        return "BatchNormalization parameters are not constants"
    if constant_array(conv.inputs[1]).ndim < 3:
        return "conv weight is not at least 3-D"
    return None


def fold_batchnorm(model, report: list | None = None):
    """Return a copy of `model` with every foldable Conv -> BatchNormalization folded."""
    import onnx_graphsurgeon as gs

    graph = import_graph(model, infer_shapes=False)
    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        conv = producer(bn.inputs[0])
        if conv is None or conv.op != "Conv":
            continue
        names = [conv.name, bn.name]
        reason = _reject_reason(graph, conv, bn)
        if reason:
            if report is not None:
                report.append(Candidate("fold_bn", "conv+bn", names, REJECTED, reason))
            continue
        weight = constant_array(conv.inputs[1]).astype(np.float64)
        k = weight.shape[0]
        bias_t = optional_input(conv, 2)
        bias = constant_array(bias_t).astype(np.float64) if bias_t is not None else np.zeros(k)
        gamma, beta, mean, var = (constant_array(t).astype(np.float64).reshape(-1) for t in bn.inputs[1:5])
        eps = float(bn.attrs.get("epsilon", 1e-5))
        a = gamma / np.sqrt(var + eps)
        new_w = (weight * a.reshape((k,) + (1,) * (weight.ndim - 1))).astype(np.float32)
        new_b = ((bias - mean) * a + beta).astype(np.float32)
        w_const = gs.Constant(f"{conv.name or conv.outputs[0].name}.folded_weight", new_w)
        b_const = gs.Constant(f"{conv.name or conv.outputs[0].name}.folded_bias", new_b)
        out, x = bn.outputs[0], conv.inputs[0]
        bn.inputs.clear()
        bn.outputs.clear()
        conv.inputs.clear()
        conv.inputs.extend([x, w_const, b_const])
        conv.outputs.clear()
        conv.outputs.append(out)
        if report is not None:
            report.append(Candidate("fold_bn", "conv+bn", names, FOLDED))
    return export_graph(graph, template=model)
