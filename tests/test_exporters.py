"""Real exporters' ResNets through the rewrite: torchvision's ResNet-50 from torch.onnx.export (TorchScript-based
exporter, opset 17: BN folded into the convs, constants shared through 47 Identity nodes; dynamo exporter, opset 18:
ReduceMean + Reshape + Gemm classifier) and a QAT-style fake-quant ResNet-18 (Q/DQ pairs, weight Q of fp32
constants, Cast chains on the scales). Weight-stripped graphs refilled with seeded random values
(tests/onnx_fixtures.py)."""

import numpy as np
import pytest

from onnx_fixtures import DYNAMO_R50, MODELOPT_FP16_R18, MODELOPT_R18, QAT_R18, QAT_RESQ_R18, TORCHSCRIPT_R50, load_fixture
from trtfuse.graph_passes.pipeline import PASSES, fold_constants_pass, rewrite, run_pipeline, summary_reason
from trtfuse.graph_passes.report import FUSED, REJECTED
from trtfuse.plugins.op_schema import DOMAIN

pytestmark = pytest.mark.slow


def _images(model, count=1, seed=0):
    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).normal(size=(count, *dims[1:])).astype(np.float32)


def _counts(report):
    blocks = sum(c.status == FUSED and c.kind.startswith("residual") for c in report)
    fused = sum(c.status == FUSED and c.pass_name == "fuse" for c in report)
    return blocks, fused, [c for c in report if c.status == REJECTED]


@pytest.mark.parametrize("name", [TORCHSCRIPT_R50, DYNAMO_R50])
@pytest.mark.parametrize("mode", ["residual", "all"])
def test_torchvision_resnet50_every_block_and_conv_fused(name, mode):
    model = load_fixture(name)
    out, report = rewrite(model, mode, calib_images=_images(model))
    blocks, fused, rejected = _counts(report)
    assert blocks == 16 and not rejected, [c.reason for c in rejected]
    plugins = [n for n in out.graph.node if n.domain == DOMAIN]
    assert len(plugins) == (53 if mode == "all" else 16) == fused
    assert not any(n.op_type in ("Identity", "Constant") for n in out.graph.node)
    assert sum(n.op_type == "Conv" for n in out.graph.node) == (0 if mode == "all" else 53 - 16)


def test_torchscript_export_shares_constants_through_identity_nodes():
    # what the issue reported: without constant folding, the shared biases behind Identity are "not a constant"
    model = load_fixture(TORCHSCRIPT_R50)
    assert sum(n.op_type == "Identity" for n in model.graph.node) == 47
    no_folding = [p for p in PASSES if p is not fold_constants_pass]
    _, ctx = run_pipeline(model, "all", passes=no_folding, calib_images=_images(model))
    blocks, _, rejected = _counts(ctx.report)
    assert blocks < 16 and any(c.reason == "conv bias is not a constant" for c in rejected)
    _, ctx = run_pipeline(model, "all", calib_images=_images(model))
    folded = [c for c in ctx.report if c.pass_name == "fold_constants"]
    assert folded and folded[0].nodes == ["47 nodes"] and folded[0].op == "Identity"


def test_qat_fake_quant_export_fuses_with_its_own_scales():
    from onnx import numpy_helper

    model = load_fixture(QAT_R18)
    images = _images(model)
    out, ctx = run_pipeline(model, "all", calib_images=images)
    blocks, fused, rejected = _counts(ctx.report)
    assert (blocks, fused, rejected) == (8, 20, [])
    assert ctx.qdq is not None and "the model's Q/DQ" in ctx.scales_source
    # every conv input quantizer has amax 4 (scale 4/127); the plugin input Q carries exactly that scale
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    q_in = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input")
    assert float(inits[q_in.input[1]]) == np.float32(4.0 / 127)


def test_qat_residual_quantizer_with_its_own_scale_is_rejected_with_the_reason():
    model = load_fixture(QAT_RESQ_R18)
    _, ctx = run_pipeline(model, "residual", calib_images=_images(model))
    blocks, _, rejected = _counts(ctx.report)
    assert blocks == 0 and len(rejected) == 8
    assert all("quantized with two scales" in c.reason and "requantize" in c.reason for c in rejected)
    assert "two scales" in summary_reason(ctx.report, model, "residual")
    # --requantize discards the model's Q/DQ: every block fuses with calibrated scales
    _, ctx = run_pipeline(model, "residual", options={"requantize": True}, calib_images=_images(model))
    assert _counts(ctx.report)[:2] == (8, 8) and ctx.qdq is None


def test_modelopt_int8_ptq_fuses_with_its_own_scales():
    model = load_fixture(MODELOPT_R18)
    for mode, plugins in (("residual", 8), ("all", 20)):
        out, ctx = run_pipeline(model, mode, calib_images=_images(model))
        blocks, fused, rejected = _counts(ctx.report)
        assert (blocks, fused, rejected) == (8, plugins, [])
        assert ctx.max_pass_tensors == 0 and ctx.scales_source.startswith("the model's Q/DQ")


def _ort_reference(model):
    import onnxruntime as ort

    # graph optimization off: onnxruntime runs the Q/DQ nodes as written instead of fusing them into its own
    # int8 kernels, so the reference is the model's own fake-quantized arithmetic
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_modelopt_float16_ptq_fuses_with_its_own_scales():
    # ModelOpt's default high_precision_dtype="fp16": float16 activations, scales, weights and biases
    model = load_fixture(MODELOPT_FP16_R18)
    for mode, plugins in (("residual", 8), ("all", 20)):
        out, ctx = run_pipeline(model, mode, calib_images=_images(model))
        blocks, fused, rejected = _counts(ctx.report)
        assert (blocks, fused, rejected) == (8, plugins, [])
        assert ctx.max_pass_tensors == 0 and ctx.scales_source.startswith("the model's Q/DQ")


def test_modelopt_float16_weights_scales_and_biases_are_the_models_own():
    import onnx
    from onnx import helper, numpy_helper

    from trtfuse.plugins.layout import unpack_weight

    model = load_fixture(MODELOPT_FP16_R18)
    src = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out, _ = run_pipeline(model, "all", calib_images=_images(model))
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    plugins = {n.name: n for n in out.graph.node if n.domain == DOMAIN}
    # the input stays Cast(float16) -> QuantizeLinear, with the model's float16 scale, bit for bit
    q_in = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input_cast_to_fp16")
    assert inits[q_in.input[1]].dtype == np.float16 and inits[q_in.input[1]] == src["input_scale_1"]
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        node = plugins[f"{conv.name}__fused"]
        wq = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == conv.name + ".weight")
        w16, s16 = src[wq.input[0]], src[wq.input[1]]
        assert w16.dtype == s16.dtype == np.float16
        # onnxruntime's own QuantizeLinear on the float16 weight and scales gives the integers the node holds
        graph = helper.make_graph(
            [helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], axis=0)], "q",
            [], [helper.make_tensor_value_info("q", onnx.TensorProto.INT8, None)],
            [numpy_helper.from_array(w16, "w"), numpy_helper.from_array(s16, "s"),
             numpy_helper.from_array(src[wq.input[2]], "z")])
        q_ort = _ort_reference(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])).run(None, {})[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        packed = inits[node.input[1]]
        q = unpack_weight(packed, attrs["out_channels"], attrs["in_channels"], attrs["kernel_shape"])
        np.testing.assert_array_equal(q, q_ort)
        # the node's float inputs are float32 (op_schema); scale = x_scale * w_scale from the float16 values
        x_dq = next(n for n in model.graph.node if n.output[0] == conv.input[0])
        x_scale = src[x_dq.input[1]]
        k = w16.shape[0]
        scale, bias = inits[node.input[2]], inits[node.input[3]]
        assert scale.dtype == bias.dtype == np.float32
        want = (np.float64(x_scale) * s16.astype(np.float64)).astype(np.float32)
        np.testing.assert_array_equal(scale[:k], want)
        np.testing.assert_array_equal(bias[:k], src[conv.input[2]].astype(np.float32))


@pytest.mark.parametrize("name, mode, floor", [
    # measured min cosine over these 3 images: fp16 all 0.999995, fp16 residual 0.999980 (its unfused convs
    # run in float16 on the model's float16 weights), fp32 all 0.999997, fp32 residual 0.999791 (its unfused
    # convs run in float32 without the model's fake quantization); top-1 agrees on every image
    (MODELOPT_FP16_R18, "all", 0.999), (MODELOPT_FP16_R18, "residual", 0.999),
    (MODELOPT_R18, "all", 0.999), (MODELOPT_R18, "residual", 0.998),
])
def test_modelopt_rewrite_runs_on_the_cpu_executor_like_onnxruntime_runs_the_qdq_model(name, mode, floor):
    import onnx

    from trtfuse.runtime.cpu_executor import CpuExecutor

    model = load_fixture(name)
    out, _ = run_pipeline(model, mode, calib_images=_images(model))
    onnx.checker.check_model(out)
    typed = onnx.shape_inference.infer_shapes(out)
    elem = {v.name: v.type.tensor_type.elem_type for v in list(typed.graph.value_info) + list(typed.graph.output)}
    assert elem["logits"] == onnx.TensorProto.FLOAT
    if name == MODELOPT_FP16_R18:  # the tail DequantizeLinear (float16 scale) feeds the float16 pool
        assert elem["layer4.1.relu2.out"] == onnx.TensorProto.FLOAT16
    ref, ours = _ort_reference(model), CpuExecutor(out)
    cosines = []
    for image in _images(model, count=3, seed=1):
        image = image[None]
        cosines.append(_cosine(ref.run(None, {"input": image})[0], ours.run({"input": image})["logits"]))
    assert min(cosines) >= floor, cosines


def test_modelopt_float16_requantized_scales_are_float16_on_both_sides_of_the_boundary():
    # --requantize calibrates the stripped float16 model (its convs run in float16 in the max pass); each
    # calibrated scale of a float16 tensor is rounded to float16, and the plugin node uses that same value
    from onnx import numpy_helper

    from trtfuse.runtime.cpu_executor import CpuExecutor

    model = load_fixture(MODELOPT_FP16_R18)
    out, ctx = run_pipeline(model, "all", options={"requantize": True}, calib_images=_images(model, count=2))
    assert _counts(ctx.report)[:2] == (8, 20) and ctx.qdq is None
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    plugin_out = {n.output[0]: n for n in out.graph.node if n.domain == DOMAIN}
    dqs = [n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in plugin_out]
    assert dqs
    for dq in dqs:
        scale = inits[dq.input[1]]
        assert scale.dtype == np.float16
        assert inits[plugin_out[dq.input[0]].input[4]] == np.float32(scale)  # the node's out_scale
    assert np.isfinite(CpuExecutor(out).run({"input": _images(model)})["logits"]).all()


def test_gpu_runner_refuses_a_float16_rewrite_naming_the_node():
    from trtfuse.runtime.classifier_plan import float16_refusal

    model = load_fixture(MODELOPT_FP16_R18)
    out, _ = run_pipeline(model, "all", calib_images=_images(model))
    reason = float16_refusal(out)
    assert reason.startswith("--backend cuda cannot run node input_cast_to_fp16 (Cast to float16)") and "\n" not in reason
    without_cast = [n for n in out.graph.node if n.op_type != "Cast"]
    del out.graph.node[:]
    out.graph.node.extend(without_cast)
    assert "QuantizeLinear with a float16 scale" in float16_refusal(out)
    assert float16_refusal(run_pipeline(load_fixture(MODELOPT_R18), "all", calib_images=_images(model))[0]) is None
