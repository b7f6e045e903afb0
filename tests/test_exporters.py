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


def test_modelopt_float16_model_is_rejected_saying_so():
    # ModelOpt's default high_precision_dtype converts the float parts to float16: every conv input is float16
    model = load_fixture(MODELOPT_FP16_R18)
    _, ctx = run_pipeline(model, "all", calib_images=_images(model).astype(np.float16))
    blocks, fused, rejected = _counts(ctx.report)
    assert fused == 0 and len(rejected) == 28 and all("float16" in c.reason for c in rejected)
    assert "float16" in summary_reason(ctx.report, model, "all")
