"""The GPU runner's classifier tail, planned on the CPU: every head form that `rewrite --fuse all` leaves
(GlobalAveragePool / ReduceMean keepdims 0|1, Flatten / Reshape / Squeeze, Gemm or MatMul + Add, with or
without Softmax) gives the same fp32 linear layer; anything else is one line naming the node and op."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_fixtures import DYNAMO_R50, TORCHSCRIPT_R50, load_fixture
from trtfuse.errors import TrtfuseError
from trtfuse.runtime.classifier_plan import plan_classifier

C, CLASSES = 16, 10
RNG = np.random.default_rng(0)
W = RNG.normal(size=(CLASSES, C)).astype(np.float32)  # [classes, C]
B = RNG.normal(size=CLASSES).astype(np.float32)


def _head(pool="gap", keepdims=1, flatten="flatten", linear="gemm", softmax=False, batch="N", axes_input=False):
    nodes, inits = [], [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    nodes.append(helper.make_node("DequantizeLinear", ["f8", "s"], ["f"], name="dq"))
    inits += [numpy_helper.from_array(np.float32(0.1), "s")]
    if pool == "gap":
        nodes.append(helper.make_node("GlobalAveragePool", ["f"], ["p"], name="gap"))
    else:
        if axes_input:
            inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
            nodes.append(helper.make_node("ReduceMean", ["f", "axes"], ["p"], name="mean", keepdims=keepdims))
        else:
            nodes.append(helper.make_node("ReduceMean", ["f"], ["p"], name="mean", axes=[-2, -1], keepdims=keepdims))
    x = "p"
    if flatten == "flatten":
        nodes.append(helper.make_node("Flatten", ["p"], ["v"], name="flat", axis=1))
        x = "v"
    elif flatten == "reshape":
        inits.append(numpy_helper.from_array(np.array([-1, C], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["p", "shape"], ["v"], name="view"))
        x = "v"
    elif flatten == "squeeze":
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "sq"))
        nodes.append(helper.make_node("Squeeze", ["p", "sq"], ["v"], name="squeeze"))
        x = "v"
    if linear == "gemm":
        nodes.append(helper.make_node("Gemm", [x, "W", "B"], ["logits"], name="fc", transB=1))
    elif linear == "gemm-alpha":
        inits[0] = numpy_helper.from_array(np.ascontiguousarray(W.T), "W")
        nodes.append(helper.make_node("Gemm", [x, "W", "B"], ["logits"], name="fc", alpha=0.5, beta=2.0))
    else:
        inits[0] = numpy_helper.from_array(np.ascontiguousarray(W.T), "W")
        nodes.append(helper.make_node("MatMul", [x, "W"], ["mm"], name="fc"))
        nodes.append(helper.make_node("Add", ["B", "mm"], ["logits"], name="fc_bias"))
    out = "logits"
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=-1))
        out = "prob"
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("f8", TensorProto.INT8, [batch, C, 4, 4])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, CLASSES])], inits)
    # IR 10: what every ONNX Runtime this runs against reads (a newer onnx would write its own newest IR by default)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18 if axes_input else 17)])  # axes input: opset 18


FORMS = [dict(pool="gap", flatten="flatten"), dict(pool="gap", flatten="reshape"), dict(pool="gap", flatten="squeeze"),
         dict(pool="mean", keepdims=1, flatten="flatten"), dict(pool="mean", keepdims=1, flatten="reshape", axes_input=True),
         dict(pool="mean", keepdims=0, flatten=None), dict(pool="mean", keepdims=0, flatten=None, linear="matmul"),
         dict(pool="gap", flatten="flatten", linear="matmul", softmax=True), dict(pool="gap", flatten="flatten", batch=8),
         dict(pool="gap", flatten="flatten", linear="gemm-alpha")]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_every_head_form_plans_the_same_linear_layer(form):
    model = _head(**form)
    onnx.checker.check_model(model)
    plan = plan_classifier(model, "f", C)
    weight, bias = (W * 0.5, B * 2.0) if form.get("linear") == "gemm-alpha" else (W, B)
    np.testing.assert_array_equal(plan.weight, weight.astype(np.float32))
    np.testing.assert_array_equal(plan.bias, bias.astype(np.float32))
    assert plan.output == ("prob" if form.get("softmax") else "logits")
    assert len(plan.nodes) == len(model.graph.node) - 1  # everything after the DequantizeLinear
    # the plan's linear layer is what onnxruntime computes from the pooled features
    import onnxruntime as ort

    f8 = RNG.integers(-127, 128, size=(8, C, 4, 4), dtype=np.int8)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"f8": f8})[0]
    pooled = f8.astype(np.float32).mean(axis=(2, 3)) * np.float32(0.1)
    got = pooled @ plan.weight.T + plan.bias
    if plan.softmax:
        got = np.exp(got - got.max(1, keepdims=True))
        got /= got.sum(1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change,match", [
    (lambda m: _set_attr(m, "mean", "keepdims", 1, drop_flatten=True), r"node fc \(Gemm\).*needs Flatten"),
    (lambda m: _replace_softmax(m, "Sigmoid"), r"node softmax \(Sigmoid\)"),
    (lambda m: _set_attr(m, "mean", "axes", [1, 2]), r"node mean \(ReduceMean\).*must reduce H and W"),
    (lambda m: _set_attr(m, "fc", "transA", 1), r"node fc \(Gemm\).*transA"),
])
def test_other_heads_are_refused_naming_node_and_op(change, match):
    model = change(_head(pool="mean", keepdims=0, flatten=None, softmax=True))
    with pytest.raises(TrtfuseError, match=match):
        plan_classifier(model, "f", C)


def _set_attr(model, node_name, attr, value, drop_flatten=False):
    node = next(n for n in model.graph.node if n.name == node_name)
    for a in list(node.attribute):
        if a.name == attr:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(attr, value))
    return model


def _replace_softmax(model, op):
    next(n for n in model.graph.node if n.name == "softmax").op_type = op
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", [TORCHSCRIPT_R50, DYNAMO_R50])
def test_torchvision_exports_rewritten_with_fuse_all_plan_their_head(name):
    from trtfuse.graph_passes.pipeline import rewrite

    model = load_fixture(name)
    images = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    out, _ = rewrite(model, "all", calib_images=images)
    last = [n for n in out.graph.node if n.op_type == "DequantizeLinear"][-1]
    plan = plan_classifier(out, last.output[0], 2048)
    fc = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}["fc.weight"]
    assert plan.classes == 1000 and np.array_equal(plan.weight, fc) and plan.output == out.graph.output[0].name
    assert plan.pool_op == ("GlobalAveragePool" if name == TORCHSCRIPT_R50 else "ReduceMean")
