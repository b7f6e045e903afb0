"""The GPU runner's classifier tail, planned from the graph alone (no GPU): which nodes after the last
dequantized feature map make the pool + classifier, and the one fp32 linear layer they amount to.

Accepted, as exporters write a ResNet's head (the dequantized [N, C, H, W] feature map `t`):

    pool:     GlobalAveragePool(t)                       -> [N, C, 1, 1]
              ReduceMean(t, axes H and W, keepdims 1|0)  -> [N, C, 1, 1] | [N, C]   (axes attribute or input)
    flatten:  Flatten(axis 1) | Reshape(to [N|0|-1, C|-1]) | Squeeze(axes 2, 3)   (none after a keepdims-0 mean)
    linear:   Gemm(transA 0; transB 0|1; alpha, beta folded into the weight and bias)
              MatMul(x, W [C, classes]) [-> Add(bias [classes] | [1, classes], either input order)]
    output:   [-> Softmax(axis -1 or 1)] -> the graph output

every node read by exactly the next one, every weight and bias a constant initializer. Anything else
raises one line naming the node and its op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import TrtfuseError


@dataclass
class ClassifierPlan:
    pool_op: str  # "GlobalAveragePool" or "ReduceMean"
    weight: np.ndarray  # fp32 [classes, C]: linear_f32's w (alpha folded in)
    bias: np.ndarray  # fp32 [classes] (beta folded in; zeros without one)
    logits: str  # tensor name of the fp32 logits
    softmax: str | None  # tensor name of the Softmax output, when there is one
    nodes: list = field(default_factory=list)  # every NodeProto consumed, pool first

    @property
    def output(self) -> str:
        return self.softmax or self.logits

    @property
    def classes(self) -> int:
        return int(self.weight.shape[0])


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _name(node) -> str:
    return node.name or node.op_type


def _fail(node, why: str):
    raise TrtfuseError(f"--backend cuda cannot run node {_name(node)} ({node.op_type}) in the classifier: {why}")


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.consumers: dict[str, list] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}

    def only_reader(self, tensor: str, after):
        users = self.consumers.get(tensor, [])
        if len(users) != 1:
            raise TrtfuseError(f"--backend cuda: {_name(after)} ({after.op_type}) output {tensor} must feed exactly one "
                               f"node (found {[u.op_type for u in users] or 'none'})")
        return users[0]

    def const(self, name: str, node) -> np.ndarray:
        if name not in self.inits:
            _fail(node, f"{name} is not a constant initializer")
        return np.asarray(self.inits[name])


def _mean_axes(node, g: _Graph) -> list[int]:
    a = _attrs(node)
    if "axes" in a:
        return [int(v) % 4 for v in a["axes"]]
    if len(node.input) > 1 and node.input[1]:
        return [int(v) % 4 for v in g.const(node.input[1], node).reshape(-1)]
    return [0, 1, 2, 3]  # no axes: every axis (not a pool over H, W)


def plan_classifier(model: onnx.ModelProto, features: str, channels: int) -> ClassifierPlan:
    """Plan the tail that reads the dequantized feature map `features` ([N, channels, H, W])."""
    g = _Graph(model)
    pool = g.only_reader(features, _FeatureSource(features))
    nodes = [pool]
    if pool.op_type == "GlobalAveragePool":
        flat_needed = True
    elif pool.op_type == "ReduceMean":
        if sorted(_mean_axes(pool, g)) != [2, 3]:
            _fail(pool, f"must reduce H and W (axes 2, 3), reduces {_mean_axes(pool, g)}")
        flat_needed = bool(_attrs(pool).get("keepdims", 1))
    else:
        _fail(pool, "the feature map must go to GlobalAveragePool or ReduceMean over H, W")
    cur = pool
    nxt = g.only_reader(cur.output[0], cur)
    if nxt.op_type in ("Flatten", "Reshape", "Squeeze"):
        _check_flatten(nxt, g, channels, after_keepdims=flat_needed)
        nodes.append(nxt)
        cur, nxt = nxt, g.only_reader(nxt.output[0], nxt)
    elif flat_needed:
        _fail(nxt, "a [N, C, 1, 1] pool output needs Flatten, Reshape or Squeeze before the classifier")
    if nxt.op_type == "Gemm":
        weight, bias, linear = _gemm(nxt, g, channels), None, nxt
        weight, bias = weight
        nodes.append(nxt)
    elif nxt.op_type == "MatMul":
        if nxt.input[0] != cur.output[0]:
            _fail(nxt, "the pooled features must be MatMul's first input")
        w = g.const(nxt.input[1], nxt).astype(np.float32)
        if w.ndim != 2 or w.shape[0] != channels:
            _fail(nxt, f"weight must be [C={channels}, classes], is {list(w.shape)}")
        weight, bias, linear = np.ascontiguousarray(w.T), np.zeros(w.shape[1], np.float32), nxt
        nodes.append(nxt)
        users = g.consumers.get(nxt.output[0], [])
        if len(users) == 1 and users[0].op_type == "Add" and nxt.output[0] not in g.outputs:
            add = users[0]
            other = add.input[1] if add.input[0] == nxt.output[0] else add.input[0]
            b = g.const(other, add).astype(np.float32)
            if b.size != weight.shape[0] or (b.ndim == 2 and b.shape[0] != 1) or b.ndim > 2:
                _fail(add, f"bias must be [classes] or [1, classes], is {list(b.shape)}")
            bias, linear = b.reshape(-1), add
            nodes.append(add)
    else:
        _fail(nxt, "the classifier must be Gemm, or MatMul (+ Add)")
    logits = linear.output[0]
    softmax = None
    users = g.consumers.get(logits, [])
    if users and logits not in g.outputs:
        sm = g.only_reader(logits, linear)
        if sm.op_type != "Softmax":
            _fail(sm, "after the classifier only a Softmax over the classes may follow")
        if int(_attrs(sm).get("axis", -1)) not in (-1, 1):
            _fail(sm, f"Softmax must be over the classes (axis -1 or 1), is axis {_attrs(sm)['axis']}")
        nodes.append(sm)
        softmax = sm.output[0]
    plan = ClassifierPlan(pool.op_type, weight.astype(np.float32), bias.astype(np.float32), logits, softmax, nodes)
    if plan.output not in g.outputs:
        last = nodes[-1]
        raise TrtfuseError(f"--backend cuda: {_name(last)} ({last.op_type}) output {plan.output} must be the graph output")
    return plan


class _FeatureSource:  # stands in for "the node" in the first message
    op_type = "DequantizeLinear"

    def __init__(self, tensor):
        self.name = f"the dequantize of {tensor}"


def _check_flatten(node, g: _Graph, channels: int, after_keepdims: bool) -> None:
    a = _attrs(node)
    if node.op_type == "Flatten":
        if int(a.get("axis", 1)) != 1:
            _fail(node, f"Flatten must use axis 1, uses {a.get('axis')}")
    elif node.op_type == "Squeeze":
        axes = a.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = g.const(node.input[1], node).reshape(-1).tolist()
        if not after_keepdims or sorted(int(v) % 4 for v in (axes or [])) != [2, 3]:
            _fail(node, "Squeeze must remove axes 2 and 3 of a [N, C, 1, 1] pool output")
    else:  # Reshape to [N, C]: batch as 0, -1 or a number, C as C or -1
        shape = g.const(node.input[1], node).reshape(-1).tolist()
        if len(shape) != 2 or shape[1] not in (channels, -1) or (shape[1] == -1 and shape[0] == -1):
            _fail(node, f"Reshape must give [N, {channels}], its shape is {shape}")


def _gemm(node, g: _Graph, channels: int):
    a = _attrs(node)
    if int(a.get("transA", 0)):
        _fail(node, "transA must be 0")
    w = g.const(node.input[1], node).astype(np.float64)
    if w.ndim != 2:
        _fail(node, f"weight must be 2-D, is {list(w.shape)}")
    if not int(a.get("transB", 0)):
        w = w.T
    if w.shape[1] != channels:
        _fail(node, f"weight must have {channels} input features, has {w.shape[1]}")
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    classes = w.shape[0]
    if len(node.input) > 2 and node.input[2]:
        b = g.const(node.input[2], node).astype(np.float64)
        if b.size not in (1, classes) or (b.ndim == 2 and b.shape[0] != 1) or b.ndim > 2:
            _fail(node, f"bias must be a scalar, [classes] or [1, classes], is {list(b.shape)}")
        b = np.broadcast_to(b.reshape(-1), (classes,))
    else:
        b = np.zeros(classes)
    # alpha 1 and beta 1 (every exporter's Gemm) leave the weight and bias bit for bit
    weight = w if alpha == 1.0 else w * alpha
    bias = b if beta == 1.0 else b * beta
    return np.ascontiguousarray(weight.astype(np.float32)), np.ascontiguousarray(bias.astype(np.float32))


def float16_refusal(model: onnx.ModelProto) -> str | None:
    """Why the GPU runner cannot run a float16 Q/DQ model's rewrite (None: nothing float16 around the fused
    convs), one line naming the first node and its op. Its kernels quantize float32 images and compute the
    pool + classifier in float32: a Cast at the input or the tail, or a (De)QuantizeLinear with a float16
    scale (a float16 tensor before or after the int8 trunk), has no kernel of that type."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        name = node.name or "?"
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            return (f"--backend cuda cannot run node {name} (Cast to {onnx.TensorProto.DataType.Name(to).lower()}): "
                    "its kernels read float32 images and give float32 logits; run this float16 model with --backend cpu")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 1 and node.input[1] in inits:
            if inits[node.input[1]].data_type == onnx.TensorProto.FLOAT16:
                return (f"--backend cuda cannot run node {name} ({node.op_type} with a float16 scale): its kernels "
                        "quantize and dequantize float32 only; run this float16 model with --backend cpu")
    return None
