"""The CPU executor: both engines agree, plugin nodes follow the reference, and `trtfuse run`."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes_nets import input_data, residual_net
from trtfuse.cli import main
from trtfuse.errors import TrtfuseError
from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.plugins import layout
from trtfuse.plugins.reference import fused_conv_int8
from trtfuse.runtime.cpu_executor import CpuExecutor


def single_plugin_model(residual: bool):
    rng = np.random.default_rng(3)
    c, k = 5, 40
    w = rng.integers(-127, 128, (k, c, 3, 3), dtype=np.int8)
    k_pad = layout.round_up(k, 32)
    inits = [
        numpy_helper.from_array(layout.pack_weight(w), "w"),
        numpy_helper.from_array(np.pad(rng.uniform(1e-3, 2e-3, k).astype(np.float32), (0, k_pad - k)), "scale"),
        numpy_helper.from_array(np.pad(rng.normal(0, 1, k).astype(np.float32), (0, k_pad - k)), "bias"),
        numpy_helper.from_array(np.array([0.1], np.float32), "out_scale"),
        numpy_helper.from_array(np.array([0.05], np.float32), "res_scale"),
    ]
    inputs = ["x", "w", "scale", "bias", "out_scale"] + (["r", "res_scale"] if residual else [])
    node = helper.make_node("FusedConvAdd" if residual else "FusedConv", inputs, ["y"], domain="trtfuse",
                            in_channels=c, out_channels=k, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            relu=1, plugin_namespace="trtfuse", aot=1)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.INT8, [2, c, 9, 9])]
    if residual:
        graph_inputs.append(helper.make_tensor_value_info("r", TensorProto.INT8, [2, k, 5, 5]))
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.INT8, [2, k, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("trtfuse", 1)])
    onnx.checker.check_model(model)
    feeds = {"x": rng.integers(-128, 128, (2, c, 9, 9), dtype=np.int8)}
    if residual:
        feeds["r"] = rng.integers(-128, 128, (2, k, 5, 5), dtype=np.int8)
    return model, feeds, w


@pytest.mark.parametrize("engine", ["ort", "reference"])
@pytest.mark.parametrize("residual", [False, True])
def test_plugin_node_runs_the_reference(engine, residual):
    model, feeds, _ = single_plugin_model(residual)
    got = CpuExecutor(model, engine=engine).run(feeds)["y"]
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    want = fused_conv_int8(feeds["x"], arrays["w"], arrays["scale"], arrays["bias"], arrays["out_scale"],
                           feeds.get("r"), arrays["res_scale"] if residual else None, in_channels=5, out_channels=40,
                           kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], relu=1)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def test_plugin_input_dtype_checked():
    model, feeds, _ = single_plugin_model(False)
    feeds["x"] = feeds["x"].astype(np.float32)
    with pytest.raises(TrtfuseError, match="must be int8"):
        CpuExecutor(model).run(feeds)


@pytest.mark.parametrize("mode", ["residual", "all"])
def test_engines_agree_on_rewritten_network(mode):
    model = residual_net(stem=True, blocks=2, projection=True, c_out=16)
    x = input_data(model)
    out, _ = rewrite(model, mode, calib_images=x)
    a = CpuExecutor(out, "ort").run({"input": x})
    b = CpuExecutor(out, "reference").run({"input": x})
    for name in a:
        # fp32 parts differ in summation order, which can flip an int8 rounding: within one output LSB
        np.testing.assert_allclose(a[name], b[name], atol=0.02 * float(np.abs(b[name]).max()))
    if mode == "all":  # no fp32 conv left in front of the plugins: bit-identical
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_unknown_engine_and_missing_input():
    model = residual_net()
    with pytest.raises(TrtfuseError, match="unknown CPU engine"):
        CpuExecutor(model, "gpu")
    with pytest.raises(TrtfuseError, match="missing model input"):
        CpuExecutor(model).run({})


@pytest.mark.parametrize("engine", ["ort", "reference"])
def test_float16_quantize_dequantize_keep_their_scale_type(engine):
    # a float16 Q/DQ model's rewrite: Q of a float16 tensor, DQ with a float16 scale giving float16 (opset 19)
    s = numpy_helper.from_array(np.array(0.0625, np.float16), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "qdq16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])], [s, z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    x = np.array([0.03125, -1.0, 9.0, 0.1], np.float16)
    y = CpuExecutor(model, engine).run({"x": x})["y"]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.array([0.0, -1.0, 7.9375, 0.125], np.float16))  # half to even, saturate 127


def _image_net(tmp_path):
    """A 3-channel 32x32 residual net with a small classifier-like output, saved + rewritten."""
    model = residual_net(stem=True, c_in=8, c_mid=8, c_out=8, h=32, w=32, dynamic_batch=True)
    src = tmp_path / "fp32.onnx"
    onnx.save(model, str(src))
    assert main(["rewrite", str(src), "-o", str(tmp_path / "int8.onnx"), "--calib-images", "2"]) == 0
    return src, tmp_path / "int8.onnx"


def test_cli_run_default_data_with_reference(tmp_path, capsys):
    src, dst = _image_net(tmp_path)
    capsys.readouterr()
    assert main(["run", str(dst), "--backend", "cpu", "--count", "3", "--reference", str(src), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["images"] == 3 and len(out["images"]) == 3
    assert out["summary"]["cosine_min"] > 0.95
    assert all("top1" in r and "reference_top1" in r for r in out["images"])


def test_cli_run_npy_and_errors(tmp_path, capsys):
    src, dst = _image_net(tmp_path)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32))
    capsys.readouterr()
    assert main(["run", str(dst), "--data", str(tmp_path / "x.npy")]) == 0
    assert "top1" in capsys.readouterr().out
    for argv, msg in [
        (["run", str(dst), "--backend", "cuda"], "--backend cuda"),  # no GPU here, or a non --fuse all model
        (["run", str(dst), "--backend", "trt"], "is an ONNX model"),  # trt runs engines (`trtfuse build`)
        (["run", str(dst), "--data", str(tmp_path / "missing.npy")], "cannot read"),
        (["run", str(dst), "--count", "0"], "--count"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err


def test_run_model_returns_intermediate_tensors_and_fused_map():
    from trtfuse.graph_passes.fuse_residual import FUSED_OUTPUTS_KEY
    from trtfuse.runtime.cpu_executor import run_model

    model = residual_net(blocks=2)
    x = input_data(model)
    out, _ = rewrite(model, "residual", calib_images=x)
    fused_map = json.loads(next(p.value for p in out.metadata_props if p.key == FUSED_OUTPUTS_KEY))
    assert sorted(fused_map.values()) == ["block0.relu2.out", "block1.relu2.out"]
    names = [out.graph.output[0].name] + sorted(fused_map)
    values = run_model(out, {"input": x}, names)
    assert [v.dtype for v in values] == [np.float32, np.int8, np.int8]
    again = run_model(out, {"input": x}, names)
    for a, b in zip(values, again):
        np.testing.assert_array_equal(a, b)
