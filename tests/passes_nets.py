"""Small residual networks built with onnx.helper, for the graph-pass tests.

`residual_net(...)` builds   x -> Conv1 [BN] -> Relu -> Conv2 [BN] -> Add(., shortcut) -> Relu -> y
with an identity or projection (Conv 1x1 [BN]) shortcut, either Add input order, and switches for the
patterns the fusion must reject (group conv, dilation, broadcasting Add, extra reader of Conv2's output).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, rng):
        self.rng = rng
        self.nodes, self.inits = [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def conv(self, name, x, c_in, c_out, k, stride=1, group=1, dilation=1, bn=True, bias=True):
        fan_in = c_in // group * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), (c_out, c_in // group, k, k))
        pad = dilation * (k // 2)
        inputs = [x, self.const(f"{name}.w", w)]
        if bias:
            inputs.append(self.const(f"{name}.b", self.rng.normal(0, 0.1, c_out)))
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if group != 1:
            attrs["group"] = group
        if dilation != 1:
            attrs["dilations"] = [dilation, dilation]
        out = f"{name}.out"
        self.nodes.append(helper.make_node("Conv", inputs, [out], name=name, **attrs))
        if not bn:
            return out
        r = self.rng
        params = [r.uniform(0.5, 1.5, c_out), r.normal(0, 0.1, c_out), r.normal(0, 0.1, c_out), r.uniform(0.5, 2.0, c_out)]
        names = [self.const(f"{name}.bn.{p}", v) for p, v in zip(("scale", "bias", "mean", "var"), params)]
        bn_out = f"{name}.bn.out"
        self.nodes.append(helper.make_node("BatchNormalization", [out] + names, [bn_out], name=f"{name}.bn", epsilon=1e-5))
        return bn_out

    def node(self, op, inputs, name, **attrs):
        out = f"{name}.out"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out


def residual_net(
    seed=0, c_in=8, c_mid=8, c_out=8, h=8, w=8, stride=1, k=3, projection=False, add_order=0, bn=True,
    batch=2, group=1, dilation=1, broadcast=False, extra_reader=False, opset=17, dynamic_batch=False,
    dynamic_spatial=False, stem=False, blocks=1,
):
    """A small residual network; returns the onnx.ModelProto (checker-valid)."""
    b = _Builder(np.random.default_rng(seed))
    x = "input"
    cur, c_input = x, (3 if stem else c_in)
    if stem:  # a 3-channel 7x7 stem like ResNet's (its input is CHW4 in the op)
        cur = b.node("Relu", [b.conv("stem", cur, 3, c_in, 7, bn=bn)], "stem.relu")
    outputs = []
    for i in range(blocks):
        p = f"block{i}"
        s = stride if i == 0 else 1
        co = c_out
        ci = c_in if i == 0 else c_out
        proj = projection if i == 0 else False
        y = b.node("Relu", [b.conv(f"{p}.conv1", cur, ci, c_mid, k, stride=s, bn=bn)], f"{p}.relu1")
        main = b.conv(f"{p}.conv2", y, c_mid, co, k, group=group if i == 0 else 1, dilation=dilation if i == 0 else 1, bn=bn)
        if extra_reader and i == 0:  # the conv (after BN) output also leaves the block
            outputs.append(b.node("Identity", [main], f"{p}.extra"))
        if proj or ci != co or s != 1:
            shortcut = b.conv(f"{p}.proj", cur, ci, co, 1, stride=s, bn=bn)
        else:
            shortcut = cur
        if broadcast and i == 0:  # a per-channel [N, C, 1, 1] shortcut: broadcasting Add
            shortcut = b.node("GlobalAveragePool", [shortcut], f"{p}.pool")
        pair = [main, shortcut] if add_order == 0 else [shortcut, main]
        cur = b.node("Relu", [b.node("Add", pair, f"{p}.add")], f"{p}.relu2")
    batch_dim = "N" if dynamic_batch else batch
    spatial = ["H", "W"] if dynamic_spatial else [h, w]
    graph = helper.make_graph(
        b.nodes, "residual_net",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch_dim, c_input] + spatial)],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)]
        + [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model


def input_data(model, seed=1, batch=None):
    """Random positive-ish input for the model's single input (dynamic dims get `batch` / 8)."""
    dims = [d.dim_value if d.HasField("dim_value") else None for d in model.graph.input[0].type.tensor_type.shape.dim]
    shape = [batch or 2 if d is None and i == 0 else (d or 8) for i, d in enumerate(dims)]
    return np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)
