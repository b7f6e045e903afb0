"""The tensorrt.plugin layer (plugins/tensorrt/qdp.py) and `trtfuse build`, without TensorRT's builder.

What NVIDIA's `tensorrt.plugin` makes of our registration is tested under NVIDIA's own code in
tests/test_trt_nvidia.py; here, the pieces it rests on (attribute declarations, keyword calls, shape
arithmetic with no int(), the AOT PTX's ISA) and the engine build around a stand-in for the C++ builder (the
one thing that cannot be installed). Tests that need the real TensorRT run where `import tensorrt` works.
"""

import inspect
import subprocess
import sys

import numpy as np
import numpy.typing as npt
import pytest

from trtfuse.plugins.tensorrt import contract as tc
from trtfuse.plugins.tensorrt import qdp
from trtfuse.plugins.op_schema import FUSED_CONV, FUSED_CONV_ADD


def test_every_attribute_is_declared_an_int32_array():
    # TensorRT 10.9-11.1's create_plugin does int(f.data) for an `int` annotation, which NumPy >= 2.4 refuses for
    # the parser's one-element INT32 array; an array annotation is read the same way by every version
    # (tests/test_trt_nvidia.py runs the registration under NVIDIA's code of 10.9, 10.15 and 11.4).
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        params = qdp._attr_params(spec)
        assert [p.name for p in params] == list(spec.attribute_names)
        assert all(p.annotation == npt.NDArray[np.int32] for p in params)


def test_generated_functions_take_positional_and_keyword_arguments():
    seen = []
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int) for n in ("a", "b", "c")]
    fn = qdp._plugin_function("f", params, lambda args: seen.append(dict(args)) or len(seen), float)
    assert str(inspect.signature(fn)) == "(a: int, b: int, c: int) -> float"
    assert fn(1, 2, 3) == 1 and fn(1, c=3, b=2) == 2 and fn(a=1, b=2, c=3) == 3
    assert seen == [{"a": 1, "b": 2, "c": 3}] * 3
    with pytest.raises(TypeError):
        fn(1, 2)


def test_conv_attrs_take_the_arrays_tensorrt_hands_over():
    arrays = {"in_channels": np.array([64], np.int32), "out_channels": np.array([256], np.int32),
              "kernel_shape": np.array([3, 3], np.int32), "strides": np.array([2, 2], np.int32),
              "pads": np.array([1, 1, 1, 1], np.int32), "relu": np.array([1], np.int32)}
    plain = {"in_channels": 64, "out_channels": 256, "kernel_shape": [3, 3], "strides": (2, 2), "pads": [1, 1, 1, 1], "relu": 1}
    assert tc.ConvAttrs.from_dict(arrays) == tc.ConvAttrs.from_dict(plain) == tc.ConvAttrs(64, 256, (3, 3), (2, 2), (1, 1, 1, 1), 1)
    with pytest.raises(ValueError, match="in_channels has 2 values"):
        tc.ConvAttrs.from_dict(dict(arrays, in_channels=np.array([64, 3], np.int32)))


class _Dim:
    """An int-like shape expression with TensorRT's ShapeExpr surface (no __int__), to show no int() is taken."""

    def __init__(self, v, fake=False):
        self.v, self.is_fake = v, fake

    def __add__(self, o):
        return _Dim(self.v + (o.v if isinstance(o, _Dim) else o), self.is_fake)

    def __sub__(self, o):
        return _Dim(self.v - (o.v if isinstance(o, _Dim) else o), self.is_fake)

    def __mul__(self, o):
        return _Dim(self.v * (o.v if isinstance(o, _Dim) else o), self.is_fake)

    def __floordiv__(self, o):
        return _Dim(self.v // (o.v if isinstance(o, _Dim) else o), self.is_fake)

    @property
    def is_constant(self):
        if self.is_fake:
            raise RuntimeError("Not accessible for fake 'ShapeExpr's")
        return True

    def constant_value(self):
        return self.v


def test_output_shape_and_aot_launch_are_shape_expression_arithmetic():
    attrs = tc.ConvAttrs(64, 64, (3, 3), (2, 2), (1, 1, 1, 1), 1)
    for fake in (True, False):  # placeholders in get_output_data_types, real expressions after
        n, k, oh, ow = tc.output_shape((_Dim(8, fake), _Dim(64, fake), _Dim(56, fake), _Dim(56, fake)), attrs)
        assert (n.v, k, oh.v, ow.v) == (8, 64, 28, 28)
    with pytest.raises(ValueError, match="input has 32 channels"):
        tc.output_shape((_Dim(8), _Dim(32), _Dim(56), _Dim(56)), attrs)
    cdiv = lambda a, b: (a + (b - 1)) // b
    tactic = tc.aot_tactics(attrs)[0]
    launch = tc.aot_launch(FUSED_CONV, attrs, (_Dim(8), _Dim(64), _Dim(56), _Dim(56)), tactic.id, cdiv=cdiv)
    ints = tc.aot_launch(FUSED_CONV, attrs, (8, 64, 56, 56), tactic.id)
    assert launch.grid_x.v == ints.grid_x and [getattr(v, "v", v) for v in launch.extra_args] == list(ints.extra_args)


def test_aot_ptx_is_declared_at_the_isa_chosen_for_its_target():
    for arch in ("sm_80", "sm_90"):
        ptx = tc.aot_ptx(4, arch)
        assert tc.ptx_isa(ptx) == tc.AOT_PTX_ISA[arch] and f".target {arch}".encode() in ptx
        assert b"used_bytes_mask" not in ptx and ptx.endswith(b"\0")  # NUL-terminated for cuModuleLoadData
    sample = b"//\n.version 9.5\n.target sm_90\n\t.pragma \"used_bytes_mask 15\";\n\t.pragma \"nounroll\";\n\0"
    assert tc.retarget_ptx(sample, "7.8") == b"//\n.version 7.8\n.target sm_90\n\t.pragma \"nounroll\";\n\0"
    assert tc.retarget_ptx(sample, "8.3") == sample.replace(b"9.5", b"8.3")
    assert tc.retarget_ptx(sample, "9.5") == sample  # never raised above NVRTC's own


def test_build_without_tensorrt_is_one_line_exit_2(tmp_path):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here: the missing-TensorRT path cannot be shown")
    except Exception:
        pass
    from trtfuse.models import build
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(build("resnet18", image_size=32), path)
    r = subprocess.run([sys.executable, "-m", "trtfuse.cli", "build", str(path), "-o", str(tmp_path / "m.engine")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "TensorRT" in r.stderr
    assert not (tmp_path / "m.engine").exists()


@pytest.mark.parametrize("spec,ok", [("8", (8, 8, 8)), ("1,8,32", (1, 8, 32)), ("3,2,1", None), ("x", None)])
def test_batch_profile_parsing(spec, ok):
    import argparse

    from trtfuse.args import batch_range

    if ok:
        assert batch_range(spec) == ok
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            batch_range(spec)


def _have_tensorrt():
    try:
        qdp.import_tensorrt()
        return True, ""
    except Exception as exc:
        return False, str(exc)


_trt_ok, _trt_why = _have_tensorrt()


@pytest.mark.trt
@pytest.mark.skipif(not _trt_ok, reason=f"needs TensorRT >= 10.9: {_trt_why}")
def test_engine_builds_with_plugin_layers(tmp_path):
    from trtfuse.graph_passes.pipeline import rewrite
    from trtfuse.models import build
    from trtfuse.io import save_model
    from trtfuse.runtime.trt_build import build_engine

    model, _ = rewrite(build("resnet18", image_size=64, batch=2), "residual")
    save_model(model, tmp_path / "r.onnx")
    summary = build_engine(str(tmp_path / "r.onnx"), str(tmp_path / "r.engine"), (2, 2, 2))
    assert summary["plugin_layers"] == summary["plugin_nodes_in_onnx"] == 8


# ---- `trtfuse build` around a stand-in for TensorRT's C++ builder (the one piece that cannot be installed) ----

class _Builder:
    """Records what build_engine asks of TensorRT's builder; the network has the model's input dims."""

    def __init__(self, input_dims, fail_build=False):
        import types as _t

        self.calls, dims, rec = [], list(input_dims), self
        self.trt = _t.SimpleNamespace(
            __name__="tensorrt", __version__="10.15.1",
            Logger=type("Logger", (), {"WARNING": 2, "__init__": lambda self, *a: None}),
            NetworkDefinitionCreationFlag=_t.SimpleNamespace(STRONGLY_TYPED=1),
            MemoryPoolType=_t.SimpleNamespace(WORKSPACE="WORKSPACE"),
            BuilderFlag=_t.SimpleNamespace(VERSION_COMPATIBLE="VERSION_COMPATIBLE"),
            LayerType=_t.SimpleNamespace(PLUGIN_V3="PLUGIN_V3", PLUGIN_V2="PLUGIN_V2", PLUGIN="PLUGIN"))

        class Profile:
            def set_shape(self, name, lo, opt, hi):
                rec.calls.append(("profile", name, lo, opt, hi))

        class Config:
            def set_memory_pool_limit(self, pool, size):
                pass

            def set_flag(self, flag):
                rec.calls.append(("flag", flag))

            def add_optimization_profile(self, profile):
                rec.calls.append(("add_profile",))
                return 0

        class Network:
            num_inputs, num_outputs, num_layers = 1, 1, 0

            def get_input(self, i):
                return _t.SimpleNamespace(name="input", shape=dims, dtype=_t.SimpleNamespace(name="FLOAT"))

            def get_output(self, i):
                return _t.SimpleNamespace(name="logits", shape=[dims[0], 1000], dtype=_t.SimpleNamespace(name="FLOAT"))

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                if fail_build:
                    raise RuntimeError("pybind11::error_already_set: CUDA initialization failure\nmore")
                return b"ENGINE"

        class OnnxParser:
            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                return True

        self.trt.Builder, self.trt.OnnxParser = Builder, OnnxParser


@pytest.fixture()
def small_model(tmp_path):
    import onnx

    from trtfuse.models import build

    path = tmp_path / "m.onnx"
    onnx.save(build("resnet18", image_size=32), path)
    return path


def _build_with(monkeypatch, builder, model, **kwargs):
    from trtfuse.runtime import trt_build

    monkeypatch.setattr(qdp, "import_tensorrt", lambda: (builder.trt, None))
    monkeypatch.setattr(qdp, "register_all", lambda: builder.calls.append(("register_all",)))
    out = str(model.parent / "m.engine")
    return trt_build.build_engine(str(model), out, **kwargs), out


def test_build_sets_version_compatible_and_records_it_with_the_ptx_isa(monkeypatch, small_model):
    import json

    from trtfuse.runtime.trt_build import build_record

    builder = _Builder([-1, 3, 32, 32])
    summary, engine = _build_with(monkeypatch, builder, small_model, version_compatible=True)
    assert ("flag", "VERSION_COMPATIBLE") in builder.calls and ("register_all",) in builder.calls
    assert ("profile", "input", [1, 3, 32, 32], [8, 3, 32, 32], [256, 3, 32, 32]) in builder.calls
    record = build_record(engine)
    assert record["version_compatible"] is True and record["plugins"] == "qdp"
    arch = qdp.aot_arch()  # the build machine's GPU, sm_80 without one
    assert record["aot_ptx"] == {"target": arch, "isa": tc.AOT_PTX_ISA[arch]}
    assert summary["version_compatible"] is True and f"PTX ISA {tc.AOT_PTX_ISA[arch]}" in summary["aot_ptx"]
    # the network's I/O and the profile's batch range, for `trtfuse export-triton ENGINE`
    assert record["io"] == [{"name": "input", "is_input": True, "dtype": "FLOAT", "shape": [-1, 3, 32, 32], "vectorized": False},
                            {"name": "logits", "is_input": False, "dtype": "FLOAT", "shape": [-1, 1000], "vectorized": False}]
    assert record["batch_range"] == [1, 256]
    builder = _Builder([-1, 3, 32, 32])
    _build_with(monkeypatch, builder, small_model)
    assert not [c for c in builder.calls if c[0] == "flag"] and json.loads(open(engine + ".trtfuse.json").read())["version_compatible"] is False


def test_a_static_batch_model_keeps_its_batch(monkeypatch, small_model):
    from trtfuse.errors import TrtfuseError

    builder = _Builder([1, 3, 32, 32])
    summary, _ = _build_with(monkeypatch, builder, small_model)
    assert not [c for c in builder.calls if c[0] in ("profile", "add_profile")]  # static: no profile to contradict it
    _build_with(monkeypatch, _Builder([1, 3, 32, 32]), small_model, batch=(1, 1, 1))
    with pytest.raises(TrtfuseError, match="static batch of 1, so --batch 1,8,256 cannot apply"):
        _build_with(monkeypatch, _Builder([1, 3, 32, 32]), small_model, batch=(1, 8, 256))
    with pytest.raises(TrtfuseError, match="dynamic non-batch dims"):
        _build_with(monkeypatch, _Builder([-1, 3, -1, 32]), small_model)


def test_tensorrt_failures_during_the_build_are_one_line(monkeypatch, small_model):
    from trtfuse.errors import TrtfuseError

    with pytest.raises(TrtfuseError, match=r"^TensorRT failed while building .*RuntimeError: pybind11::error_already_set: CUDA initialization failure$"):
        _build_with(monkeypatch, _Builder([-1, 3, 32, 32], fail_build=True), small_model)
    assert not (small_model.parent / "m.engine").exists()


def test_build_cli_offers_version_compatible():
    r = subprocess.run([sys.executable, "-m", "trtfuse.cli", "build", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--version-compatible" in r.stdout


def test_qdp_build_of_a_chained_model_is_refused_in_one_line(tmp_path):
    """The QDP plugins embed one AOT kernel per node and have none for FusedConvAddConv: `build --plugins qdp` says so
    before TensorRT is involved (whether or not it is installed), and points at --plugins v3."""
    import onnx
    from onnx import TensorProto, helper

    from trtfuse.plugins.op_schema import DOMAIN, FUSED_CONV_ADD_CONV, NAMESPACE, OPSET_VERSION

    names = list(FUSED_CONV_ADD_CONV.input_names)
    node = helper.make_node(FUSED_CONV_ADD_CONV.name, names, ["y", "next_y"], name="pair", domain=DOMAIN,
                            plugin_namespace=NAMESPACE, aot=0, in_channels=64, out_channels=256, next_out_channels=64,
                            relu=1, next_relu=1)
    def value(name, channels):
        return helper.make_tensor_value_info(name, TensorProto.INT8, [1, channels, 8, 8])

    consts = [helper.make_tensor(n, TensorProto.INT8 if t.dtype == "int8" else TensorProto.FLOAT, [1], [0])
              for n, t in zip(names, FUSED_CONV_ADD_CONV.inputs) if n not in ("x", "residual")]
    graph = helper.make_graph([node], "g", [value("x", 64), value("residual", 256)], [value("y", 256), value("next_y", 64)],
                              consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)])
    path = tmp_path / "chained.onnx"
    onnx.save(model, path)
    r = subprocess.run([sys.executable, "-m", "trtfuse.cli", "build", str(path), "-o", str(tmp_path / "m.engine"),
                        "--plugins", "qdp"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "1 FusedConvAddConv nodes" in r.stderr and "--plugins v3" in r.stderr
    assert not (tmp_path / "m.engine").exists()
