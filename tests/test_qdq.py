"""Quantized (Q/DQ) models in: ONNX Runtime's quantize_static (QDQ format, per-channel int8 weights) on a trtfuse
ResNet-18, then the rewrite fuses it with the model's own scales and integers, rejects what the op cannot take
with the reason, and --requantize calibrates anew. Also constant folding on its own."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.fold_constants import fold_constants
from trtfuse.graph_passes.pipeline import run_pipeline, summary_reason
from trtfuse.graph_passes.report import FUSED, REJECTED
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.layout import unpack_weight
from trtfuse.plugins.op_schema import DOMAIN, OPS

SIZE = 32


def _images(count=2, seed=0):
    return np.random.default_rng(seed).normal(size=(count, 3, SIZE, SIZE)).astype(np.float32)


def _quantize(tmp_path, fold_bn=True, symmetric=True, activation="int8", name="q"):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    src = tmp_path / f"{name}.fp32.onnx"
    dst = tmp_path / f"{name}.qdq.onnx"
    model = load_cached_model("resnet18", image_size=SIZE, batch=1, opset=17, fold_bn=fold_bn)
    onnx.save(model, src)
    images = _images(4, seed=1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": images[i : i + 1]} for i in range(len(images))])

        def get_next(self):
            return next(self.it, None)

    act = QuantType.QInt8 if activation == "int8" else QuantType.QUInt8
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=act, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True} if symmetric else {})
    return onnx.load(dst)


@pytest.fixture(scope="module")
def qdq_folded(tmp_path_factory):
    return _quantize(tmp_path_factory.mktemp("qdq"), fold_bn=True)


def _blocks(report):
    return sum(c.status == FUSED and c.kind.startswith("residual") for c in report)


def _inits(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _q_scale_of(model, tensor):
    inits = _inits(model)
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return float(inits[q.input[1]])


@pytest.mark.slow
@pytest.mark.parametrize("fold_bn", [True, False], ids=["bn-folded", "bn-explicit"])
def test_ort_quantize_static_fuses_every_block_with_the_models_own_weights_and_scales(tmp_path, fold_bn):
    q = _quantize(tmp_path, fold_bn=fold_bn)
    out, ctx = run_pipeline(q, "all", calib_images=_images())
    assert _blocks(ctx.report) == 8 and not [c for c in ctx.report if c.status == REJECTED]
    assert ctx.qdq is not None and ctx.max_pass_tensors == 0 and ctx.scales_source.startswith("the model's Q/DQ")
    plugins = [n for n in out.graph.node if n.domain == DOMAIN]
    assert len(plugins) == 20
    qi, oi = _inits(q), _inits(out)
    by_name = {n.name: n for n in q.graph.node}
    dq_of = {n.output[0]: n for n in q.graph.node if n.op_type == "DequantizeLinear"}
    for node in plugins:
        conv = by_name[node.name[: -len("__fused")]]
        dq = dq_of[conv.input[1]]
        w_q, w_s = qi[dq.input[0]], qi[dq.input[1]]
        k, c, r, s = w_q.shape
        named = OPS[node.op_type].bind(node.input)
        got = unpack_weight(oi[named["weight"]], k, c, (r, s))
        # the model's own integers (a BN folded afterwards may flip a channel's sign)
        assert np.array_equal(np.abs(got), np.abs(w_q))
        x_scale = _q_scale_of(q, conv.input[0].replace("_DequantizeLinear_Output", ""))
        scale = oi[named["scale"]][:k]
        if fold_bn:
            assert np.array_equal(got, w_q)
            np.testing.assert_allclose(scale, x_scale * w_s, rtol=2e-7)


@pytest.mark.slow
def test_fused_layers_match_onnxruntime_executing_the_qdq_chain(qdq_folded):
    """The stem and the first block's first conv: bit-equal to ORT running the Q/DQ chain as written (graph
    optimizations off); a residual conv rounds once where ORT's chain rounds the conv output first (within 1 LSB)."""
    import onnxruntime as ort

    from trtfuse.runtime.cpu_executor import run_model

    out, _ = run_pipeline(qdq_folded, "all", calib_images=_images())
    wanted = ["relu.out", "layer1.0.relu1.out"]
    m = onnx.ModelProto()
    m.CopyFrom(qdq_folded)
    for name in wanted:
        m.graph.output.append(helper.make_tensor_value_info(f"{name}_QuantizeLinear_Output", TensorProto.INT8, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    images = _images(1, seed=5)
    ref = sess.run([f"{n}_QuantizeLinear_Output" for n in wanted], {"input": images})
    got = run_model(out, {"input": images}, [f"{n}__int8" for n in wanted])
    for name, r, g in zip(wanted, ref, got):
        assert np.array_equal(r, g), name
    res = [n for n in out.graph.node if n.op_type == "FusedConvAdd"][0]
    m.graph.output.append(helper.make_tensor_value_info(res.output[0].replace("__int8", "_QuantizeLinear_Output"),
                                                        TensorProto.INT8, None))
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    r = sess.run([m.graph.output[-1].name], {"input": images})[0]
    g = run_model(out, {"input": images}, [res.output[0]])[0]
    diff = np.abs(r.astype(np.int32) - g.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("variant,reason", [("asymmetric", "non-zero zero point"), ("uint8", "uint8 activations")])
def test_what_the_op_cannot_take_is_rejected_with_the_reason(tmp_path, variant, reason):
    q = _quantize(tmp_path, symmetric=False, activation="uint8" if variant == "uint8" else "int8", name=variant)
    out, ctx = run_pipeline(q, "residual", calib_images=_images())
    rejected = [c for c in ctx.report if c.status == REJECTED]
    assert _blocks(ctx.report) == 0 and len(rejected) == 8
    assert all(reason in c.reason for c in rejected), [c.reason for c in rejected]
    assert reason in summary_reason(ctx.report, q, "residual")
    # the ReLU ORT folded into the asymmetric Q's clip comes back: the float model computes the same function
    assert sum(n.op_type == "Relu" for n in out.graph.node) >= 17
    # --requantize: the model's Q/DQ discarded, calibrated anew, every block fused
    out, ctx = run_pipeline(q, "residual", options={"requantize": True}, calib_images=_images())
    assert _blocks(ctx.report) == 8 and ctx.qdq is None and ctx.scales_source.startswith("max pass")


@pytest.mark.slow
def test_per_channel_activation_scale_is_rejected(qdq_folded):
    q = onnx.ModelProto()
    q.CopyFrom(qdq_folded)
    inits = {i.name: i for i in q.graph.initializer}
    for node in q.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[0].startswith("relu.out"):
            scale = numpy_helper.to_array(inits[node.input[1]])
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(np.full(64, scale, np.float32), node.input[1]))
            inits[node.input[2]].CopyFrom(numpy_helper.from_array(np.zeros(64, np.int8), node.input[2]))
            node.attribute.append(helper.make_attribute("axis", 1))
    _, ctx = run_pipeline(q, "all", calib_images=_images())
    rejected = [c for c in ctx.report if c.status == REJECTED]
    assert rejected and all("per-channel activation scales" in c.reason for c in rejected)
    assert {c.nodes[0] for c in rejected} == {"conv1", "layer1.0.conv1", "layer1.0.conv2"}


@pytest.mark.slow
def test_scales_file_for_a_qdq_model_needs_requantize(qdq_folded):
    with pytest.raises(TrtfuseError, match="--requantize"):
        run_pipeline(qdq_folded, "residual", scales={"x": 1.0}, calib_images=_images())


@pytest.mark.slow
def test_cli_summary_says_why_nothing_fused(tmp_path, capsys):
    from trtfuse.cli import main

    q = _quantize(tmp_path, symmetric=False, name="asym")
    onnx.save(q, tmp_path / "asym.onnx")
    before = (tmp_path / "asym.onnx").read_bytes()
    assert main(["rewrite", str(tmp_path / "asym.onnx"), "-o", str(tmp_path / "out.onnx"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["plugin_nodes"] == 0 and "non-zero zero point" in summary["why_none_fused"]
    assert (tmp_path / "asym.onnx").read_bytes() == before


def test_constants_behind_identity_cast_and_constant_nodes_are_folded():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "W")
    b16 = numpy_helper.from_array(rng.normal(size=8).astype(np.float16), "B16")
    nodes = [helper.make_node("Identity", ["W"], ["W2"], name="Identity_0"),
             helper.make_node("Cast", ["B16"], ["B"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Constant", [], ["Z"], value=numpy_helper.from_array(np.ones(8, np.float32)), name="cz"),
             helper.make_node("Add", ["B", "Z"], ["B2"], name="badd"),
             helper.make_node("Conv", ["x", "W2", "B2"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b16])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = []
    out = fold_constants(model, report)
    assert [n.op_type for n in out.graph.node] == ["Conv"] and len(model.graph.node) == 5
    inits = _inits(out)
    np.testing.assert_array_equal(inits["B2"], numpy_helper.to_array(b16).astype(np.float32) + 1)
    assert report[0].nodes == ["4 nodes"] and report[0].op == "Add, Cast, Constant, Identity"
    # Q/DQ are never folded: the Q/DQ pass reads the integers behind them
    q = helper.make_node("DequantizeLinear", ["Wq", "s"], ["W3"], name="dq")
    graph = helper.make_graph([q, helper.make_node("Conv", ["x", "W3"], ["y"], name="conv")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((8, 3, 3, 3), np.int8), "Wq"),
                               numpy_helper.from_array(np.float32(0.1), "s")])
    out = fold_constants(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in out.graph.node] == ["DequantizeLinear", "Conv"]
