"""`--backend trt` (runtime/trt_runner.py) without an engine: which engine I/O is accepted (plan_io, plain
Python), how the engine's tensor list is read, and the one-line exit-2 errors of `trtfuse run` and
`trtfuse offline` where TensorRT or a GPU is missing. Running a real engine needs TensorRT's builder to
make one, which does not install here (docs/tensorrt.md).
"""

import subprocess
import sys
import types

import pytest

from trtfuse.errors import TrtfuseError
from trtfuse.runtime.trt_runner import IOTensor, batch_for, engine_io, plan_io, resolved_shape

X_STATIC = IOTensor("images", True, "FLOAT", (8, 3, 224, 224), False, (8, 8))
X_DYNAMIC = IOTensor("images", True, "FLOAT", (-1, 3, 224, 224), False, (1, 256))
LOGITS = IOTensor("logits", False, "FLOAT", (-1, 1000), False)


def test_plan_for_a_static_and_a_dynamic_batch():
    assert plan_io([X_STATIC, LOGITS], 8).input_shape == (8, 3, 224, 224)
    plan = plan_io([LOGITS, X_DYNAMIC], 37)  # the input need not come first
    assert plan.input_shape == (37, 3, 224, 224) and plan.outputs == (LOGITS,)
    assert batch_for(X_DYNAMIC, 8) == 8 and batch_for(X_DYNAMIC, 1000) == 256 and batch_for(X_STATIC, 3) == 8
    assert batch_for(IOTensor("x", True, "FLOAT", (-1, 3, 8, 8), False, (4, 16)), 2) == 4


@pytest.mark.parametrize("tensors,batch,message", [
    ([X_STATIC, LOGITS], 4, "fixed at 8"),
    ([X_DYNAMIC, LOGITS], 257, r"outside the engine's profile \(1..256\)"),
    ([X_DYNAMIC, X_STATIC, LOGITS], 8, "2 inputs"),
    ([X_DYNAMIC], 8, "no outputs"),
    ([IOTensor("x", True, "HALF", (-1, 3, 224, 224), False, (1, 8)), LOGITS], 8, "HALF"),
    ([IOTensor("x", True, "FLOAT", (-1, 3, 224, 224), True, (1, 8)), LOGITS], 8, "vectorized"),
    ([IOTensor("x", True, "FLOAT", (-1, 3, -1, -1), False, (1, 8)), LOGITS], 8, "dynamic non-batch"),
    ([IOTensor("x", True, "FLOAT", (-1, 150528), False, (1, 8)), LOGITS], 8, r"\[N, C, H, W\]"),
    ([X_DYNAMIC, IOTensor("y", False, "BF16", (-1, 1000), False)], 8, "BF16"),
    ([X_DYNAMIC, IOTensor("y", False, "INT8", (-1, 1000, 1, 1), True)], 8, "vectorized"),
])
def test_engines_it_cannot_run_are_refused_in_one_line(tensors, batch, message):
    with pytest.raises(TrtfuseError, match=message) as info:
        plan_io(tensors, batch)
    assert "\n" not in str(info.value)


def test_output_shapes_must_resolve():
    assert resolved_shape("y", (8, 1000)) == (8, 1000)
    with pytest.raises(TrtfuseError, match="data-dependent"):
        resolved_shape("y", (8, -1))


def test_engine_io_reads_modes_types_shapes_vectorization_and_profile():
    from trtfuse.plugins.tensorrt.v3 import import_trt

    try:
        trt, _ = import_trt()
    except TrtfuseError as exc:
        pytest.skip(str(exc))
    specs = {  # name: (mode, dtype, shape, vectorized dim, profile)
        "images": (trt.TensorIOMode.INPUT, trt.DataType.FLOAT, [-1, 3, 64, 64], -1, ([1, 3, 64, 64], [8, 3, 64, 64], [32, 3, 64, 64])),
        "feat": (trt.TensorIOMode.OUTPUT, trt.DataType.INT8, [-1, 64, 8, 8], 1, None),
        "logits": (trt.TensorIOMode.OUTPUT, trt.DataType.FLOAT, [-1, 1000], -1, None),
    }
    names = list(specs)
    engine = types.SimpleNamespace(
        num_io_tensors=3, num_optimization_profiles=1, get_tensor_name=lambda i: names[i],
        get_tensor_mode=lambda n: specs[n][0], get_tensor_dtype=lambda n: specs[n][1],
        get_tensor_shape=lambda n: specs[n][2], get_tensor_vectorized_dim=lambda n: specs[n][3],
        get_tensor_profile_shape=lambda n, p: specs[n][4])
    got = engine_io(trt, engine)
    assert got == [IOTensor("images", True, "FLOAT", (-1, 3, 64, 64), False, (1, 32)),
                   IOTensor("feat", False, "INT8", (-1, 64, 8, 8), True, None),
                   IOTensor("logits", False, "FLOAT", (-1, 1000), False, None)]
    with pytest.raises(TrtfuseError, match="vectorized"):
        plan_io(got, 8)
    assert plan_io([got[0], got[2]], 32).input_shape == (32, 3, 64, 64)


# ---- the CLI's one-line errors ----
_HIDE_TRT = "import sys\nfor m in ('tensorrt', 'tensorrt_lean', 'tensorrt_lean_bindings'): sys.modules[m] = None\n"


def _cli(args, hide_trt=False):
    code = (_HIDE_TRT if hide_trt else "") + f"from trtfuse.cli import main\nsys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True)


@pytest.fixture()
def engine_file(tmp_path):
    path = tmp_path / "m.engine"
    path.write_bytes(b"not really an engine")
    return path


def test_run_trt_without_tensorrt_is_one_line_exit_2(engine_file):
    r = _cli(["run", str(engine_file), "--backend", "trt"], hide_trt=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("trtfuse: error: no TensorRT runtime imports") and "trtfuse[lean]" in r.stderr


def test_offline_trt_without_tensorrt_is_one_line_exit_2(engine_file, tmp_path):
    pytest.importorskip("mlperf_loadgen")
    r = _cli(["offline", "--model", str(engine_file), "--backend", "trt", "--log-dir", str(tmp_path / "logs")], hide_trt=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no TensorRT runtime imports" in r.stderr, r.stderr


def test_run_trt_errors_for_missing_and_onnx_files(tmp_path):
    r = _cli(["run", str(tmp_path / "absent.engine"), "--backend", "trt"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot read engine" in r.stderr, r.stderr
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(b"x")
    r = _cli(["run", str(onnx_path), "--backend", "trt"])
    assert r.returncode == 2 and "is an ONNX model" in r.stderr and "trtfuse build" in r.stderr, r.stderr


def test_run_trt_without_a_gpu_is_one_line_exit_2(engine_file):
    from trtfuse.plugins.cuda_driver import gpu_available
    from trtfuse.plugins.tensorrt.v3 import import_trt

    if gpu_available()[0]:
        pytest.skip("a GPU is present: the no-GPU path cannot be shown")
    try:
        import_trt()
    except TrtfuseError as exc:
        pytest.skip(f"needs a TensorRT module to get past the import: {exc}")
    r = _cli(["run", str(engine_file), "--backend", "trt"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs an NVIDIA GPU" in r.stderr, r.stderr


def test_top1_runs_on_the_device_only_over_per_image_logits():
    """TrtRunner ends its forward with our argmax kernel where the first output is per-image fp32/fp16
    logits; elsewhere it has no top-1 (and `trtfuse offline` refuses the engine in one line)."""
    from trtfuse.runtime.trt_runner import logits_classes

    assert logits_classes((8, 1000), "float32", 8) == 1000
    assert logits_classes((8, 1000, 1, 1), "float16", 8) == 1000
    assert logits_classes((8, 1, 1000), "float32", 8) == 1000
    assert logits_classes((8, 1), "float32", 8) == 1
    assert logits_classes((8, 10, 10), "float32", 8) is None  # a map per image, not a vector
    assert logits_classes((8, 1000), "int8", 8) is None
    assert logits_classes((8,), "float32", 8) is None
    assert logits_classes((4, 1000), "float32", 8) is None


# ---- which plugin flavour an engine needs: recorded by `trtfuse build` next to it ----

def test_the_build_record_names_the_plugin_flavour(tmp_path):
    from trtfuse.runtime.trt_build import engine_plugin_flavour, sidecar_path

    engine = str(tmp_path / "m.engine")
    assert sidecar_path(engine).name == "m.engine.trtfuse.json"
    assert engine_plugin_flavour(engine) is None  # built elsewhere: the runner picks as before
    for flavour in ("qdp", "v3"):
        sidecar_path(engine).write_text(f'{{"plugins": "{flavour}", "tensorrt": "10.13"}}')
        assert engine_plugin_flavour(engine) == flavour
    for bad, message in (("{", "not a trtfuse build record"), ("[1]", "not a trtfuse build record"),
                         ('{"plugins": "v2"}', "names plugin flavour 'v2'")):
        sidecar_path(engine).write_text(bad)
        with pytest.raises(TrtfuseError, match=message):
            engine_plugin_flavour(engine)


def test_a_broken_build_record_is_one_line_exit_2(engine_file):
    (engine_file.parent / (engine_file.name + ".trtfuse.json")).write_text('{"plugins": "v9"}')
    r = _cli(["run", str(engine_file), "--backend", "trt"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "names plugin flavour 'v9'" in r.stderr, r.stderr


def test_an_aot_engine_registers_nothing_and_v3_failures_are_one_line():
    import types

    from trtfuse.runtime.trt_runner import register_plugins

    # QDP engines run their embedded AOT kernels: no tensorrt.plugin, no Python registration at all
    assert register_plugins(object(), "tensorrt", {"plugins": "qdp", "version_compatible": False}) == "none"
    # a registry that fails is one TrtfuseError line, not a traceback
    with pytest.raises(TrtfuseError, match="registering trtfuse's IPluginV3 creators in tensorrt failed: AttributeError"):
        register_plugins(types.SimpleNamespace(__name__="tensorrt"), "tensorrt", {"plugins": "v3"})


def test_the_lean_runtime_takes_only_version_compatible_engines():
    from trtfuse.plugins.tensorrt.v3 import import_trt
    from trtfuse.runtime.trt_runner import register_plugins

    try:
        trt, name = import_trt(("tensorrt_lean", "tensorrt_lean_bindings"))
    except TrtfuseError as exc:
        pytest.skip(f"needs the lean TensorRT module: {exc}")
    for flavour in ("qdp", "v3"):
        with pytest.raises(TrtfuseError, match="rebuild with `trtfuse build --version-compatible`"):
            register_plugins(trt, name, {"plugins": flavour, "version_compatible": False})
    assert register_plugins(trt, name, {"plugins": "qdp", "version_compatible": True}) == "none"
    assert register_plugins(trt, name, {"plugins": "v3", "version_compatible": True}) == "v3" == register_plugins(trt, name, {})


def test_build_refuses_an_unknown_plugin_flavour(tmp_path):
    from trtfuse.runtime.trt_build import build_engine

    with pytest.raises(TrtfuseError, match="--plugins takes qdp or v3"):
        build_engine(str(tmp_path / "m.onnx"), str(tmp_path / "m.engine"), (1, 1, 1), plugins="v2")
