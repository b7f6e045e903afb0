"""Graph passes on small hand-built residual networks: BN folding, fusion, schema, boundaries, scales, CLI."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from passes_nets import input_data, residual_net
from trtfuse.cli import main
from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.fold_bn import fold_batchnorm
from trtfuse.graph_passes.fuse_residual import required_activation_tensors
from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.graph_passes.plugin_node import quantize_weight
from trtfuse.graph_passes.scales import SCALES_FORMAT, load_scales, validate_scales
from trtfuse.plugins import layout
from trtfuse.plugins.op_schema import DOMAIN, FUSED_CONV_ADD, NAMESPACE, OPS
from trtfuse.runtime.cpu_executor import CpuExecutor


def ort_run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})


def calib(model, n=4):
    return np.concatenate([input_data(model, seed=100 + i) for i in range(n)])


def fused(report):
    return [c for c in report if c.pass_name == "fuse" and c.status == "fused"]


def test_fold_bn_preserves_function_and_names():
    model = residual_net(projection=True, stride=2, c_out=16)
    folded = fold_batchnorm(model)
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    assert {o.name for o in folded.graph.output} == {o.name for o in model.graph.output}
    x = input_data(model)
    np.testing.assert_allclose(ort_run(folded, x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-5)
    # the caller's model is untouched
    assert sum(n.op_type == "BatchNormalization" for n in model.graph.node) == 3


def test_fold_bn_rejects_shared_conv_output():
    model = residual_net(bn=True)
    # give conv1's pre-BN output a second reader
    model.graph.node.append(helper.make_node("Identity", ["block0.conv1.out"], ["extra"], name="extra"))
    model.graph.output.append(helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    report = []
    folded = fold_batchnorm(model, report)
    rejected = [c for c in report if c.status == "rejected"]
    assert len(rejected) == 1 and "other readers" in rejected[0].reason and rejected[0].nodes[0] == "block0.conv1"
    assert sum(n.op_type == "BatchNormalization" for n in folded.graph.node) == 1


@pytest.mark.parametrize("add_order", [0, 1])
@pytest.mark.parametrize("projection", [False, True])
def test_residual_block_fused_either_order(add_order, projection):
    model = residual_net(projection=projection, add_order=add_order, c_out=16 if projection else 8)
    out, report = rewrite(model, "residual", calib_images=calib(model)[:2])
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("FusedConvAdd") == 1 and "FusedConv" not in ops
    (cand,) = fused(report)
    assert cand.kind == ("residual-projection" if projection else "residual-identity")
    assert cand.nodes == ["block0.conv2", "block0.add", "block0.relu2"]
    # the projection conv stays fp32 and its output is quantized into the residual input
    assert ops.count("Conv") == (2 if projection else 1)
    x = input_data(model)
    y, y_ref = CpuExecutor(out).run({"input": x})["block0.relu2.out"], ort_run(model, x)[0]
    cos = float(np.dot(y.ravel(), y_ref.ravel()) / np.linalg.norm(y) / np.linalg.norm(y_ref))
    assert cos > 0.99


def test_plugin_nodes_match_schema_exactly():
    model = residual_net(stem=True, blocks=2, projection=True, c_out=16)
    out, _ = rewrite(model, "all", calib_images=calib(model)[:2])
    onnx.checker.check_model(out, full_check=True)
    assert any(o.domain == DOMAIN and o.version == 1 for o in out.opset_import)
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    plugin = [n for n in out.graph.node if n.domain == DOMAIN]
    assert {n.op_type for n in plugin} == {"FusedConv", "FusedConvAdd"}
    assert len(plugin) == 6  # stem + 2 blocks x 2 convs + projection
    for node in plugin:
        spec = OPS[node.op_type]
        attrs = {a.name: a for a in node.attribute}
        assert list(attrs) == list(spec.attribute_names) + ["plugin_namespace", "aot"]
        assert attrs["plugin_namespace"].type == onnx.AttributeProto.STRING and attrs["plugin_namespace"].s == NAMESPACE.encode()
        assert attrs["aot"].type == onnx.AttributeProto.INT and attrs["aot"].i == 1
        for a in spec.attributes:
            assert attrs[a.name].type == getattr(onnx.AttributeProto, a.kind)
        assert len(node.input) == len(spec.inputs) and len(node.output) == 1
        c, k = attrs["in_channels"].i, attrs["out_channels"].i
        r, s = attrs["kernel_shape"].ints
        for name, tspec in zip(node.input, spec.inputs):
            if name in inits:
                assert inits[name].dtype == np.dtype(tspec.dtype), (node.name, tspec.name)
            else:  # activations: int8 from a Q node or another plugin node
                src = producers[name]
                assert src.op_type in ("QuantizeLinear", "FusedConv", "FusedConvAdd"), (node.name, tspec.name)
        named = spec.bind(node.input)
        w = inits[named["weight"]]
        assert w.shape == (layout.round_up(k, 32), layout.gemm_k(c, (r, s))[1])
        for per_channel in ("scale", "bias"):
            v = inits[named[per_channel]]
            assert v.shape == (layout.round_up(k, 32),) and not v[k:].any()
        assert inits[named["out_scale"]].shape == (1,)
        if node.op_type == "FusedConvAdd":
            assert inits[named["residual_scale"]].shape == (1,)


def test_all_mode_chains_int8_and_quantizes_only_at_boundaries():
    model = residual_net(stem=True, blocks=2)
    out, report = rewrite(model, "all", calib_images=calib(model)[:2])
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 1 and "Conv" not in ops
    stem = next(n for n in out.graph.node if n.op_type == "FusedConv" and n.name.startswith("stem"))
    assert [a.i for a in stem.attribute if a.name == "in_channels"] == [3]


def test_residual_from_float_and_from_plugin():
    model = residual_net(blocks=2)
    out, _ = rewrite(model, "residual", calib_images=calib(model)[:2])
    adds = [n for n in out.graph.node if n.op_type == "FusedConvAdd"]
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    # block 0's residual is the float graph input (quantized); block 1's is block 0's int8 output
    assert producers[FUSED_CONV_ADD.bind(adds[0].input)["residual"]] == "QuantizeLinear"
    assert producers[FUSED_CONV_ADD.bind(adds[1].input)["residual"]] == "FusedConvAdd"


@pytest.mark.parametrize("kwargs,reason", [
    (dict(group=2), "group conv"),
    (dict(dilation=2), "dilated conv"),
    (dict(broadcast=True), "broadcasting Add"),
    (dict(extra_reader=True), "conv output has other readers"),
    (dict(dynamic_spatial=True), "dynamic channel/spatial dims"),
])
def test_unsupported_patterns_are_rejected_with_reason(kwargs, reason):
    model = residual_net(**kwargs)
    out, report = rewrite(model, "residual", scales={})
    assert not fused(report)
    assert not any(n.domain == DOMAIN for n in out.graph.node)
    rejected = [c for c in report if c.status == "rejected" and c.pass_name == "fuse"]
    assert rejected and reason in rejected[0].reason


def test_non_constant_weight_rejected():
    model = residual_net(bn=False)
    w = next(i for i in model.graph.initializer if i.name == "block0.conv2.w")
    model.graph.input.append(helper.make_tensor_value_info(w.name, onnx.TensorProto.FLOAT, list(w.dims)))
    model.graph.initializer.remove(w)
    _, report = rewrite(model, "residual", scales={})
    assert [c.reason for c in report if c.status == "rejected"] == ["conv weight is not a constant"]


def test_dynamic_batch_is_fused():
    model = residual_net(dynamic_batch=True)
    out, report = rewrite(model, "residual", calib_images=calib(model))
    assert len(fused(report)) == 1
    y = CpuExecutor(out).run({"input": input_data(model, batch=3)})["block0.relu2.out"]
    assert y.shape[0] == 3


def test_required_activation_tensors_are_original_names():
    model = residual_net(projection=True, c_out=16)
    names = required_activation_tensors(model, "residual")
    assert names == ["block0.relu1.out", "block0.proj.bn.out", "block0.relu2.out"]
    all_names = required_activation_tensors(model, "all")
    assert set(names) < set(all_names) and "input" in all_names
    originals = {o for n in model.graph.node for o in n.output} | {"input"}
    assert set(all_names) <= originals


def test_missing_scale_is_a_clear_error():
    model = residual_net()
    with pytest.raises(TrtfuseError, match="no activation scale"):
        rewrite(model, "residual", scales={"block0.relu1.out": 0.1})


def test_weight_quantization_symmetric_per_channel():
    w = np.array([[[[0.5, -1.0]]], [[[0.0, 0.0]]], [[[2.0, 1.0]]]], np.float32)
    q, s = quantize_weight(w)
    np.testing.assert_allclose(s, [1.0 / 127, 1.0, 2.0 / 127], rtol=1e-6)
    assert q[:, 0, 0].tolist() == [[64, -127], [0, 0], [127, 64]]


def test_scales_file_round_trip_and_validation(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": SCALES_FORMAT, "method": "max", "activations": {"a": 0.5, "b": 1}}))
    assert load_scales(path) == {"a": 0.5, "b": 1.0}
    for bad in ({"activations": {}}, {"format": SCALES_FORMAT, "activations": {"a": 0}},
                {"format": SCALES_FORMAT, "activations": {"a": "x"}}, {"format": SCALES_FORMAT}):
        with pytest.raises(TrtfuseError):
            validate_scales(bad)
    path.write_text("{not json")
    with pytest.raises(TrtfuseError, match="not valid JSON"):
        load_scales(path)


# -- CLI -------------------------------------------------------------------------------------------------


def _save(model, path):
    onnx.save(model, str(path))
    return str(path)


def _one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtfuse: error:") and "\n" not in err
    return err


def test_cli_rewrite_writes_valid_model_and_report(tmp_path, capsys):
    model = residual_net(projection=True, c_out=16)
    src = _save(model, tmp_path / "in.onnx")
    scales = {n: 0.05 for n in required_activation_tensors(model, "all")}
    (tmp_path / "s.json").write_text(json.dumps({"format": SCALES_FORMAT, "activations": scales}))
    before = (open(src, "rb").read(), os.stat(src).st_mtime_ns)
    argv = ["rewrite", src, "-o", str(tmp_path / "out.onnx"), "--fuse", "all", "--scales", str(tmp_path / "s.json"),
            "--report", str(tmp_path / "r.json")]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "residual-projection" in table and "FusedConvAdd" in table
    onnx.checker.check_model(onnx.load(str(tmp_path / "out.onnx")))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["fused_residual_blocks"] == 1 and report["summary"]["plugin_nodes"] == 3
    assert (open(src, "rb").read(), os.stat(src).st_mtime_ns) == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_cli_rewrite_json_default_max_pass(tmp_path, capsys):
    src = _save(residual_net(h=32, w=32, c_in=3, c_mid=8, c_out=8, stem=True), tmp_path / "in.onnx")
    # the default max pass feeds embedded natural images: needs a 3-channel square input
    assert main(["rewrite", src, "-o", str(tmp_path / "out.onnx"), "--json", "--calib-images", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["plugin_nodes"] == 1 and "max pass" in out["summary"]["scales"]


def test_cli_refuses_to_overwrite_input(tmp_path, capsys):
    src = _save(residual_net(), tmp_path / "in.onnx")
    before = open(src, "rb").read()
    err = _one_line_error(capsys, ["rewrite", src, "-o", src, "--scales", "none.json"])
    assert "refusing to overwrite" in err and open(src, "rb").read() == before


def test_cli_truncated_and_missing_initializer(tmp_path, capsys):
    data = residual_net().SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    _one_line_error(capsys, ["rewrite", str(tmp_path / "trunc.onnx"), "-o", str(tmp_path / "o.onnx")])
    model = residual_net()
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "block0.conv2.w"))
    src = _save(model, tmp_path / "missing.onnx")
    _one_line_error(capsys, ["rewrite", src, "-o", str(tmp_path / "o.onnx")])
    _one_line_error(capsys, ["rewrite", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o.onnx")])
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("kwargs", [dict(group=2), dict(dynamic_spatial=True)])
def test_cli_unsupported_reported_not_crashed(tmp_path, capsys, kwargs):
    src = _save(residual_net(**kwargs), tmp_path / "in.onnx")
    assert main(["rewrite", src, "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["plugin_nodes"] == 0
    assert any(c["status"] == "rejected" for c in report["candidates"])
