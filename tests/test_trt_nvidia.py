"""trtfuse's Quickly Deployable Plugins under NVIDIA's own `tensorrt.plugin`, TensorRT 10.9, 10.15 and 11.4.

Each version runs in its own process (tests/nvidia_trt.py) over the lean bindings wheel that
scripts/install_trt_envs.sh put in .trt-envs/<version>: `register_all()` goes through NVIDIA's decorators and
their validation, and every plugin node of a rewritten ResNet-50 (`--fuse residual` and `--fuse all`) through
NVIDIA's creator and plugin classes as TensorRT's ONNX parser and builder call them. What comes back is checked
against the model itself: the output shapes the CPU executor produced, the node's attributes, the formats of
op_schema. On a GPU, every (node, tactic) is launched from the PTX, launch parameters and extra arguments NVIDIA's
code returned and compared with the CPU golden output.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtfuse.graph_passes.pipeline import rewrite
from trtfuse.models.cache import load_cached_model
from trtfuse.plugins.tensorrt import contract as tc
from trtfuse.plugins.op_schema import OPS
from trtfuse.plugins.tactics import TACTICS_BY_ID
from trtfuse.plugins.tensorrt.qdp import aot_arch

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "nvidia_trt.py"
VERSIONS = ("10.9", "10.15", "11.4")
ENVS = REPO / ".trt-envs"
ARCH = aot_arch()
# What the harness fakes: only what the C++ builder makes (its docstring says why each one).
FAKED = {"TensorFormat", "ITensor", "IDimensionExpr", "IExprBuilder", "DimsExprs", "ISymExpr", "PluginTensorDesc",
         "DynamicPluginTensorDesc"}


def env_for(version: str) -> Path:
    env = ENVS / version
    if not (env / ".complete").exists():
        why = f"NVIDIA's tensorrt.plugin {version} is not installed in {env} (bash scripts/install_trt_envs.sh)"
        if os.environ.get("CI"):
            pytest.fail(why)  # CI must run every version
        pytest.skip(why)
    return env


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """ResNet-50 (64 x 64 images, batch 2) rewritten with --fuse residual and --fuse all, and its images."""
    root = tmp_path_factory.mktemp("nvidia_trt")
    model = load_cached_model("resnet50", image_size=64, batch=2)
    images = np.random.default_rng(5).normal(size=(2, 3, 64, 64)).astype(np.float32)
    np.save(root / "images.npy", images)
    paths = {}
    for mode in ("residual", "all"):
        out, _ = rewrite(model, mode, calib_images=images)
        paths[mode] = root / f"resnet50-{mode}.onnx"
        onnx.save(out, paths[mode])
    return root, paths


def run_harness(version: str, rewritten, gpu: bool = False) -> dict:
    root, paths = rewritten
    env = env_for(version)
    out = root / f"report-{version}{'-gpu' if gpu else ''}.json"
    ptx_dir = root / f"ptx-{version}"
    cmd = [sys.executable, str(HARNESS), *map(str, paths.values()), "--images", str(root / "images.npy"),
           "--json", str(out), "--ptx-dir", str(ptx_dir)] + (["--gpu"] if gpu else [])
    paths = [str(env), str(REPO / "tests")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"TensorRT {version}: NVIDIA's code failed on our registration:\n{proc.stderr[-4000:]}"
    report = json.loads(out.read_text())
    report["ptx_dir"] = ptx_dir
    return report


@pytest.fixture(scope="module", params=VERSIONS)
def nvidia(request, rewritten):
    return request.param, run_harness(request.param, rewritten), rewritten


def test_nvidia_code_is_what_ran(nvidia):
    version, report, _ = nvidia
    assert report["tensorrt"].startswith(version + ".")
    assert Path(report["plugin_module"]).parts[-3:] == ("tensorrt_lean_bindings", "plugin", "__init__.py")
    assert set(report["faked"]) == FAKED


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_every_plugin_node_goes_through_nvidias_parser_and_builder_path(nvidia):
    version, report, (root, paths) = nvidia
    for mode, path in paths.items():
        model = onnx.load(str(path), load_external_data=False)
        nodes = {n.name: n for n in model.graph.node if n.op_type in OPS}
        records = report["models"][str(path)]["records"]
        assert [r["node"] for r in records] == list(nodes), (version, mode)  # every plugin node, in graph order
        assert len(records) == (16 if mode == "residual" else 53)
        for r in records:
            node, spec = nodes[r["node"]], OPS[r["op"]]
            a = _attrs(node)
            where = (version, mode, r["node"])
            assert r["plugin_kind"] == "_TemplateAOTPlugin", where  # aot=1: strictly the AOT plugin
            assert r["output_types"] == ["INT8"], where
            assert r["output_shapes"] == [r["actual_out_shape"]], where  # NVIDIA's ShapeExprs, evaluated at N=2
            assert r["output_dim0_symbolic"] == [True], where  # the batch stays dynamic through our arithmetic
            (combo,) = r["combinations"]
            x_format = "CHW4" if a["in_channels"] <= 4 else "CHW32"
            want = [("INT8" if t.dtype == "int8" else "FLOAT",
                     {"x": x_format, "residual": "CHW32"}.get(t.name, "LINEAR")) for t in spec.inputs] + [("INT8", "CHW32")]
            assert [tuple(c) for c in combo] == want, where
            assert r["tactics"], where
            n, c, h, w = r["actual_in_shapes"][0]
            _, k, oh, ow = r["actual_out_shape"]
            for tactic, t in r["tactics"].items():
                tac = TACTICS_BY_ID[int(tactic)]
                assert t["kernel"] == tc.AOT_ENTRY[spec.name], where
                # extra arguments: the actual tensors' dims and the node's attributes, as int32
                assert t["extra_args"] == [n, c, h, w, k, oh, ow, *a["kernel_shape"], *a["strides"], a["pads"][0],
                                           a["pads"][1], a["relu"]], (where, tactic)
                assert t["extra_dtypes"] == ["INT32"] * len(tc.EXTRA_ARG_NAMES)
                L = t["launch"]
                k_tiles = -(-(-(-k // 32) * 32) // tac.bn)
                assert L["grid_x"] == -(-n * oh * ow // tac.bm) * k_tiles, (where, tactic)
                assert (L["grid_y"], L["grid_z"], L["block_y"], L["block_z"]) == (1, 1, 1, 1)
                assert L["block_x"] == tac.threads and 0 < L["shared_mem"] <= tc.AOT_SHARED_LIMIT
                # the kernel takes every node input (pointers), the extra int32s, then the output
                assert t["entry_params"] == ["u64"] * len(spec.inputs) + ["u32"] * len(tc.EXTRA_ARG_NAMES) + ["u64"], where
                # the PTX targets the build machine's GPU (sm_80 without one) at the ISA chosen for that target
                assert t["ptx"]["ptx_target"] == ARCH and t["ptx"]["ptx_version"] == tc.AOT_PTX_ISA[ARCH], where


_assembled: set[str] = set()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit) to assemble the PTX")
def test_the_ptx_get_kernel_returns_assembles_at_its_declared_isa(nvidia, tmp_path):
    version, report, _ = nvidia
    images = sorted(report["ptx_dir"].glob("*.ptx"))
    assert images
    for path in images:
        if path.name in _assembled:  # the same image under another TensorRT version
            continue
        data = path.read_bytes().rstrip(b"\0")  # cuModuleLoadData wants the NUL; ptxas does not
        assert b"used_bytes_mask" not in data  # an ISA 8.3 pragma, dropped below that
        target = path.name.split("-")[0]
        src = tmp_path / path.name
        src.write_bytes(data)
        proc = subprocess.run(["ptxas", f"-arch={target}", str(src), "-o", os.devnull], capture_output=True, text=True)
        assert proc.returncode == 0, (version, path.name, proc.stderr[-2000:])
        _assembled.add(path.name)


from trtfuse.plugins.cuda_driver import gpu_available  # noqa: E402

_gpu, _why = gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu, reason=f"needs a CUDA GPU: {_why}")
def test_what_nvidias_code_returns_launches_equal_to_the_golden_reference(rewritten):
    installed = [v for v in VERSIONS if (ENVS / v / ".complete").exists()]
    if not installed:
        pytest.skip(f"no TensorRT lean bindings in {ENVS} (bash scripts/install_trt_envs.sh)")
    report = run_harness(installed[-1], rewritten, gpu=True)
    launched = [g for entry in report["models"].values() for g in entry["gpu"]]
    assert len(launched) >= 16 + 53
    bad = [g for g in launched if not g["ok"]]
    assert not bad, bad[:5]
