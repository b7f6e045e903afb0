"""`trtfuse offline` on MLPerf LoadGen: the harness end to end on the CPU (onnxruntime backend, a small
model), LoadGen's logs kept and parsed, accuracy-mode responses scored; the cuda backend on a GPU."""

import json

import numpy as np
import pytest

pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen (pip install 'trtfuse[offline]')")

from trtfuse.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from trtfuse.io import save_model
    from trtfuse.models import build

    path = tmp_path_factory.mktemp("m") / "r18.onnx"
    save_model(build("resnet18", image_size=32, batch=None), path)
    return path


@pytest.mark.parametrize("mode", ["performance", "accuracy"])
def test_offline_onnxruntime_backend(small_model, tmp_path, capsys, mode):
    out = tmp_path / "result.json"
    rc = main(["offline", "--model", str(small_model), "--backend", "onnxruntime", "--count", "48", "--batch", "16",
               "--min-duration", "0.5", "--expected-qps", "50", "--mode", mode, "--log-dir", str(tmp_path / "logs"),
               "-o", str(out), "--json"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert (tmp_path / "logs" / "mlperf_log_detail.txt").exists()
    if mode == "performance":
        assert result["samples_per_s"] > 0 and result["loadgen_summary"]["Scenario"] == "Offline"
        assert result["samples_completed"] > 0
    else:
        assert result["accuracy_responses"] == 48  # every sample answered once, top-1 as int32


def test_offline_errors_are_one_line(small_model, capsys):
    assert main(["offline", "--model", str(small_model), "--backend", "trt", "--count", "4", "--log-dir", "/tmp/x"]) == 2
    assert "is an ONNX model" in capsys.readouterr().err  # --backend trt runs a serialized engine
    assert main(["offline", "--model", "/nonexistent.onnx"]) == 2


def test_summary_parser_reads_loadgen_lines(tmp_path):
    from trtfuse.runtime.offline import parse_summary

    p = tmp_path / "s.txt"
    p.write_text("Scenario : Offline\nSamples per second: 31234.5\nResult is : VALID\n")
    assert parse_summary(p) == {"Scenario": "Offline", "Samples per second": 31234.5, "Result is": "VALID"}


@pytest.mark.gpu
def test_offline_cuda_backend_on_a_gpu(tmp_path):
    from trtfuse.plugins.cuda_driver import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a CUDA GPU: {why}")
    from trtfuse.graph_passes.pipeline import rewrite
    from trtfuse.io import save_model
    from trtfuse.models import build

    model, _ = rewrite(build("resnet18", image_size=32, batch=None), "all",
                       calib_images=np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32))
    save_model(model, tmp_path / "all.onnx")
    out = tmp_path / "r.json"
    assert main(["offline", "--model", str(tmp_path / "all.onnx"), "--backend", "cuda", "--count", "100", "--batch",
                 "16", "--mode", "accuracy", "--log-dir", str(tmp_path / "logs"), "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["accuracy_responses"] == 100 and result["gpus"] == 1
