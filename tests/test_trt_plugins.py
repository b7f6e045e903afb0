"""The tensorrt.plugin layer (plugins/trt_plugins.py) and `trtfuse build`, without TensorRT where possible.

A recording stand-in for `tensorrt.plugin` captures what trtfuse registers: the functions' names,
parameters (which TensorRT reads to learn inputs and attributes) and what they return for real
ResNet-50 shapes. Tests that need the real TensorRT run where `import tensorrt` works.
"""

import inspect
import subprocess
import sys
import types

import numpy as np
import pytest

from trtfuse.plugins import trt_contract as tc
from trtfuse.plugins import trt_plugins
from trtfuse.plugins.op_schema import FUSED_CONV, FUSED_CONV_ADD


class _Recorder:
    """Just enough of tensorrt.plugin's surface to record registrations."""

    def __init__(self):
        self.fns = {}
        rec = self

        class TensorDesc:
            def __init__(self, shape=(1, 1, 1, 1)):
                self.shape_expr = list(shape)

        class AutoTuneCombination:
            def __init__(self, io_types, layouts, tactics=None):
                self.types, self.formats, self.tactic_ids = io_types, layouts, tactics

        class KernelLaunchParams:
            grid_x = block_x = shared_mem = None

        def decorator(kind):
            def outer(name):
                def inner(fn):
                    rec.fns[(kind, name)] = fn
                    return fn
                return inner
            return outer

        self.module = types.SimpleNamespace(
            TensorDesc=TensorDesc, Tensor=type("Tensor", (), {}), AutoTuneCombination=AutoTuneCombination,
            KernelLaunchParams=KernelLaunchParams, register=decorator("register"), autotune=decorator("autotune"),
            aot_impl=decorator("aot_impl"), impl=decorator("impl"), from_shape_expr=lambda shape, dtype: (tuple(shape), dtype),
            cdiv=lambda a, b: -(-a // b), SymInt32=lambda v: v, SymIntExprs=types.SimpleNamespace(from_tuple=tuple))


@pytest.fixture()
def recorded():
    rec = _Recorder()
    trt = types.SimpleNamespace(int8="int8")
    for spec in (FUSED_CONV, FUSED_CONV_ADD):
        trt_plugins._register_conv(spec, trt, rec.module)
    return rec


@pytest.mark.parametrize("spec", [FUSED_CONV, FUSED_CONV_ADD], ids=lambda s: s.name)
def test_signatures_declare_exactly_the_schema(recorded, spec):
    name = tc.qualified_name(spec)
    reg = inspect.signature(recorded.fns[("register", name)])
    assert list(reg.parameters) == list(spec.input_names) + list(spec.attribute_names)
    aot = inspect.signature(recorded.fns[("aot_impl", name)])
    assert list(aot.parameters) == list(spec.input_names) + list(spec.attribute_names) + ["outputs", "tactic"]
    impl = inspect.signature(recorded.fns[("impl", name)])
    assert list(impl.parameters)[-3:] == ["outputs", "stream", "tactic"]
    tune = inspect.signature(recorded.fns[("autotune", name)])
    assert list(tune.parameters) == list(spec.input_names) + list(spec.attribute_names) + ["outputs"]
    ints = [p.annotation for p in reg.parameters.values()][len(spec.inputs):]
    assert ints[0] is int and "ndarray" in str(ints[2]).lower() and "int32" in str(ints[2])  # INT, INTS


def test_register_autotune_aot_for_res3_conv3(recorded, monkeypatch):
    spec = FUSED_CONV_ADD
    name = tc.qualified_name(spec)
    TD = recorded.module.TensorDesc
    x = TD((256, 128, 28, 28))
    tensors = [x] + [TD() for _ in spec.inputs[1:]]
    attrs = [128, 512, np.array([1, 1], np.int32), np.array([1, 1], np.int32), np.array([0, 0, 0, 0], np.int32), 1]
    shape, dtype = recorded.fns[("register", name)](*tensors, *attrs)
    assert shape == (256, 512, 28, 28) and dtype == "int8"
    (combo,) = recorded.fns[("autotune", name)](*tensors, *attrs, ())
    assert combo.formats.startswith("CHW32") and combo.tactic_ids == [4, 9]
    monkeypatch.setattr(tc, "aot_ptx", lambda tactic, arch="sm_90": b"PTX%d" % tactic)
    entry, ptx, params, extra = recorded.fns[("aot_impl", name)](*tensors, *attrs, (), 4)
    assert entry == b"trtfuse_fused_conv_add_aot" and ptx == b"PTX4"
    assert (params.grid_x, params.block_x) == (256 * 28 * 28 // 64 * 8, 128) and params.shared_mem <= 48 * 1024
    assert extra == (256, 128, 28, 28, 512, 28, 28, 1, 1, 1, 1, 0, 0, 1)


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
    from trtfuse.errors import TrtfuseError
    from trtfuse.runtime.trt_build import parse_batch

    if ok:
        assert parse_batch(spec) == ok
    else:
        with pytest.raises(TrtfuseError):
            parse_batch(spec)


def _have_tensorrt():
    try:
        trt_plugins.import_tensorrt()
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
