"""Bad input against every subcommand: one line, `trtfuse: error:`, exit 2, nothing touched.

Each case runs `trtfuse.cli.main` in a folder holding the corpus (models good and broken, scales files with
bad numbers, data files and folders, a FIFO standing for a device file) and checks the house rule for bad
input: exit status 2, exactly one line on stderr starting `trtfuse: error: `, no traceback, no "internal
error", and the folder exactly as before: every input byte-identical, no partial output, no temporary file,
nothing created anywhere in it (so no output outside what was named either). Ctrl-C is checked on real
processes: exit 130, one line, no output left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_calib import small_resnet
from trtfuse.cli import main
from trtfuse.io import save_model


def _snapshot(root: Path) -> dict:
    """Every entry under root: its type, and a content hash for regular files (FIFOs are never opened)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), digest)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    save_model(small_resnet(size=32), root / "m.onnx")  # fp32, dynamic batch
    save_model(small_resnet(size=32, batch=1), root / "static.onnx")  # fp32, batch 1
    dyn = small_resnet(size=32)
    dims = dyn.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    save_model(dyn, root / "dyn.onnx")  # dynamic spatial dims: nothing the rewrite can fuse
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["rewrite", "m.onnx", "-o", "q.onnx", "--calib-images", "2", "--json"]) == 0
        assert main(["calibrate", "m.onnx", "--count", "8", "--method", "max", "-o", "s.json", "--json"]) == 0
    finally:
        os.chdir(cwd)
    (root / "junk.onnx").write_bytes(b"\x08\x07not an onnx model at all" * 10)
    (root / "empty.onnx").write_bytes(b"")
    (root / "engine.engine").write_bytes(b"not a TensorRT engine" * 4)
    (root / "dir.onnx").mkdir()
    os.mkfifo(root / "fifo")  # a non-regular file: what /dev/null is to root, without risking /dev/null
    good = json.loads((root / "s.json").read_text())
    name = next(iter(good["activations"]))
    for tag, value in [("tiny", 1e-50), ("huge", 1e39), ("neg", -0.5), ("zero", 0.0), ("str", "0.1")]:
        doc = dict(good, activations=dict(good["activations"], **{name: value}))
        (root / f"scales_{tag}.json").write_text(json.dumps(doc))
    (root / "scales_badjson.json").write_text("{\"format\": ")
    (root / "scales_fmt.json").write_text(json.dumps({"format": "other", "activations": {}}))
    (root / "scales_none.json").write_text(json.dumps({"format": "trtfuse-scales-v1", "activations": {}}))
    np.save(root / "nan.npy", np.full((4, 3, 32, 32), np.nan, np.float32))
    np.save(root / "inf.npy", np.full((4, 3, 32, 32), np.inf, np.float32))
    np.save(root / "zero.npy", np.zeros((4, 3, 32, 32), np.float32))
    np.save(root / "int.npy", np.zeros((4, 3, 32, 32), np.int32))
    np.save(root / "flat.npy", np.zeros((4, 3072), np.float32))
    np.save(root / "size64.npy", np.random.default_rng(0).normal(size=(4, 3, 64, 64)).astype(np.float32))
    (root / "imgs_empty").mkdir()
    (root / "imgs_bad").mkdir()
    (root / "imgs_bad" / "a.jpg").write_bytes(b"not a jpeg")
    return root


# (id, argv). Names are files of the corpus; "new*" names are outputs that must not appear.
CASES = [
    # global
    ("unknown-command", ["bogus"]),
    # models: numbers, paths
    ("models-arch", ["models", "resnet152", "-o", "new.onnx"]),
    ("models-no-output", ["models", "resnet18"]),
    ("models-o-fifo", ["models", "resnet18", "-o", "fifo"]),
    ("models-o-dir", ["models", "resnet18", "-o", "dir.onnx"]),
    ("models-o-no-folder", ["models", "resnet18", "-o", "nofolder/new.onnx"]),
    ("models-o-under-file", ["models", "resnet18", "-o", "m.onnx/new.onnx"]),
    ("models-image-size-0", ["models", "resnet18", "-o", "new.onnx", "--image-size", "0"]),
    ("models-image-size-33", ["models", "resnet18", "-o", "new.onnx", "--image-size", "33"]),
    ("models-image-size-text", ["models", "resnet18", "-o", "new.onnx", "--image-size", "big"]),
    ("models-opset", ["models", "resnet18", "-o", "new.onnx", "--opset", "5"]),
    ("models-batch-neg", ["models", "resnet18", "-o", "new.onnx", "--batch", "-1"]),
    ("models-bn-images", ["models", "resnet18", "-o", "new.onnx", "--bn-images", "1"]),
    # calibrate: models, data, numbers, outputs
    ("calibrate-missing-model", ["calibrate", "missing.onnx", "-o", "new.json"]),
    ("calibrate-dir-model", ["calibrate", "dir.onnx", "-o", "new.json"]),
    ("calibrate-junk-model", ["calibrate", "junk.onnx", "-o", "new.json"]),
    ("calibrate-empty-model", ["calibrate", "empty.onnx", "-o", "new.json"]),
    ("calibrate-fifo-model", ["calibrate", "fifo", "-o", "new.json"]),
    ("calibrate-int8-model", ["calibrate", "q.onnx", "-o", "new.json"]),
    ("calibrate-dynamic-spatial", ["calibrate", "dyn.onnx", "-o", "new.json", "--count", "4"]),
    ("calibrate-nan-data", ["calibrate", "m.onnx", "--data", "nan.npy", "-o", "new.json"]),
    ("calibrate-inf-data", ["calibrate", "m.onnx", "--data", "inf.npy", "-o", "new.json"]),
    ("calibrate-zero-data", ["calibrate", "m.onnx", "--data", "zero.npy", "-o", "new.json"]),
    ("calibrate-int-data", ["calibrate", "m.onnx", "--data", "int.npy", "-o", "new.json"]),
    ("calibrate-flat-data", ["calibrate", "m.onnx", "--data", "flat.npy", "-o", "new.json"]),
    ("calibrate-size-mismatch", ["calibrate", "m.onnx", "--data", "size64.npy", "-o", "new.json"]),
    ("calibrate-empty-folder", ["calibrate", "m.onnx", "--data", "imgs_empty", "-o", "new.json"]),
    ("calibrate-bad-image", ["calibrate", "m.onnx", "--data", "imgs_bad", "-o", "new.json"]),
    ("calibrate-missing-data", ["calibrate", "m.onnx", "--data", "nowhere", "-o", "new.json"]),
    ("calibrate-count-0", ["calibrate", "m.onnx", "--count", "0", "-o", "new.json"]),
    ("calibrate-count-neg", ["calibrate", "m.onnx", "--count", "-5", "-o", "new.json"]),
    ("calibrate-count-float", ["calibrate", "m.onnx", "--count", "2.5", "-o", "new.json"]),
    ("calibrate-count-huge", ["calibrate", "m.onnx", "--count", "1000000000", "-o", "new.json"]),
    ("calibrate-percentile-0", ["calibrate", "m.onnx", "--method", "percentile", "--percentile", "0", "-o", "new.json"]),
    ("calibrate-percentile-nan", ["calibrate", "m.onnx", "--percentile", "nan", "-o", "new.json"]),
    ("calibrate-percentile-101", ["calibrate", "m.onnx", "--percentile", "101", "-o", "new.json"]),
    ("calibrate-batch-0", ["calibrate", "m.onnx", "--batch", "0", "-o", "new.json"]),
    ("calibrate-threads-0", ["calibrate", "m.onnx", "--threads", "0", "-o", "new.json"]),
    ("calibrate-method", ["calibrate", "m.onnx", "--method", "bogus", "-o", "new.json"]),
    ("calibrate-o-fifo", ["calibrate", "m.onnx", "-o", "fifo"]),
    ("calibrate-o-input", ["calibrate", "m.onnx", "-o", "m.onnx"]),
    ("calibrate-o-data", ["calibrate", "m.onnx", "--data", "zero.npy", "-o", "zero.npy"]),
    ("calibrate-o-dir", ["calibrate", "m.onnx", "-o", "dir.onnx"]),
    ("calibrate-o-no-folder", ["calibrate", "m.onnx", "-o", "nofolder/new.json"]),
    ("calibrate-cache-same", ["calibrate", "m.onnx", "-o", "new.json", "--cache", "new.json"]),
    ("calibrate-cache-fifo", ["calibrate", "m.onnx", "-o", "new.json", "--cache", "fifo"]),
    # rewrite: models, scales, numbers, outputs
    ("rewrite-dir-model", ["rewrite", "dir.onnx", "-o", "new.onnx"]),
    ("rewrite-junk-model", ["rewrite", "junk.onnx", "-o", "new.onnx"]),
    ("rewrite-int8-model", ["rewrite", "q.onnx", "-o", "new.onnx"]),
    ("rewrite-o-fifo", ["rewrite", "m.onnx", "-o", "fifo", "--scales", "s.json"]),
    ("rewrite-o-input", ["rewrite", "m.onnx", "-o", "m.onnx", "--scales", "s.json"]),
    ("rewrite-o-scales", ["rewrite", "m.onnx", "-o", "s.json", "--scales", "s.json"]),
    ("rewrite-o-dir", ["rewrite", "m.onnx", "-o", "dir.onnx", "--scales", "s.json"]),
    ("rewrite-o-no-folder", ["rewrite", "m.onnx", "-o", "nofolder/new.onnx", "--scales", "s.json"]),
    ("rewrite-o-under-file", ["rewrite", "m.onnx", "-o", "m.onnx/new.onnx", "--scales", "s.json"]),
    ("rewrite-report-fifo", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "s.json", "--report", "fifo"]),
    ("rewrite-report-same", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "s.json", "--report", "new.onnx"]),
    ("rewrite-scales-tiny", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_tiny.json"]),
    ("rewrite-scales-huge", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_huge.json"]),
    ("rewrite-scales-neg", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_neg.json"]),
    ("rewrite-scales-zero", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_zero.json"]),
    ("rewrite-scales-str", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_str.json"]),
    ("rewrite-scales-badjson", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_badjson.json"]),
    ("rewrite-scales-format", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_fmt.json"]),
    ("rewrite-scales-none", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "scales_none.json"]),
    ("rewrite-scales-missing", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "missing.json"]),
    ("rewrite-scales-dir", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "dir.onnx"]),
    ("rewrite-scales-model", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "m.onnx"]),
    ("rewrite-calib-images-0", ["rewrite", "m.onnx", "-o", "new.onnx", "--calib-images", "0"]),
    ("rewrite-fuse", ["rewrite", "m.onnx", "-o", "new.onnx", "--fuse", "some"]),
    ("rewrite-split-k", ["rewrite", "m.onnx", "-o", "new.onnx", "--split-k", "-3", "--scales", "s.json"]),
    # evaluate
    ("evaluate-swapped", ["evaluate", "q.onnx", "m.onnx", "--count", "2"]),
    ("evaluate-junk", ["evaluate", "m.onnx", "junk.onnx", "--count", "2"]),
    ("evaluate-dir", ["evaluate", "dir.onnx", "q.onnx", "--count", "2"]),
    ("evaluate-missing", ["evaluate", "m.onnx", "missing.onnx", "--count", "2"]),
    ("evaluate-count-0", ["evaluate", "m.onnx", "q.onnx", "--count", "0"]),
    ("evaluate-batch-nan", ["evaluate", "m.onnx", "q.onnx", "--batch", "nan"]),
    ("evaluate-nan-data", ["evaluate", "m.onnx", "q.onnx", "--data", "nan.npy"]),
    ("evaluate-o-fifo", ["evaluate", "m.onnx", "q.onnx", "--count", "2", "-o", "fifo"]),
    ("evaluate-o-input", ["evaluate", "m.onnx", "q.onnx", "--count", "2", "-o", "q.onnx"]),
    # calibrate-compare
    ("compare-methods-empty", ["calibrate-compare", "m.onnx", "--methods", ","]),
    ("compare-methods-bogus", ["calibrate-compare", "m.onnx", "--methods", "max,bogus"]),
    ("compare-out-dir-missing", ["calibrate-compare", "m.onnx", "--out-dir", "nofolder"]),
    ("compare-out-dir-file", ["calibrate-compare", "m.onnx", "--out-dir", "m.onnx"]),
    ("compare-eval-count-0", ["calibrate-compare", "m.onnx", "--eval-count", "0"]),
    ("compare-o-fifo", ["calibrate-compare", "m.onnx", "-o", "fifo"]),
    ("compare-int8-model", ["calibrate-compare", "q.onnx"]),
    # run
    ("run-junk", ["run", "junk.onnx"]),
    ("run-dir", ["run", "dir.onnx"]),
    ("run-count-0", ["run", "m.onnx", "--count", "0"]),
    ("run-nan-data", ["run", "m.onnx", "--data", "nan.npy"]),
    ("run-int-data", ["run", "m.onnx", "--data", "int.npy"]),
    ("run-flat-data", ["run", "m.onnx", "--data", "flat.npy"]),
    ("run-size-mismatch", ["run", "m.onnx", "--data", "size64.npy"]),
    ("run-missing-data", ["run", "m.onnx", "--data", "missing.npy"]),
    ("run-empty-folder", ["run", "m.onnx", "--data", "imgs_empty"]),
    ("run-engine-choice", ["run", "m.onnx", "--engine", "bogus"]),
    ("run-backend-choice", ["run", "m.onnx", "--backend", "bogus"]),
    ("run-reference-junk", ["run", "m.onnx", "--count", "2", "--reference", "junk.onnx"]),
    ("run-reference-dir", ["run", "m.onnx", "--count", "2", "--reference", "dir.onnx"]),
    ("run-trt-onnx", ["run", "m.onnx", "--backend", "trt"]),
    ("run-trt-junk-engine", ["run", "engine.engine", "--backend", "trt"]),
    ("run-trt-dir", ["run", "dir.onnx", "--backend", "trt"]),
    ("run-trt-fifo", ["run", "fifo", "--backend", "trt"]),  # reading a FIFO would block for ever
    ("run-fifo-reference", ["run", "m.onnx", "--reference", "fifo"]),
    ("run-fifo-data", ["run", "m.onnx", "--data", "fifo"]),
    ("calibrate-fifo-data", ["calibrate", "m.onnx", "--data", "fifo", "-o", "new.json"]),
    ("rewrite-fifo-scales", ["rewrite", "m.onnx", "-o", "new.onnx", "--scales", "fifo"]),
    # build (TensorRT): one line whatever is missing
    ("build-o-fifo", ["build", "q.onnx", "-o", "fifo"]),
    ("build-o-input", ["build", "q.onnx", "-o", "q.onnx"]),
    ("build-junk", ["build", "junk.onnx", "-o", "new.engine"]),
    ("build-batch", ["build", "q.onnx", "-o", "new.engine", "--batch", "abc"]),
    ("build-plugins", ["build", "q.onnx", "-o", "new.engine", "--plugins", "v9"]),
    # offline
    ("offline-missing-model", ["offline", "--model", "missing.onnx", "--backend", "onnxruntime"]),
    ("offline-dir-model", ["offline", "--model", "dir.onnx", "--backend", "onnxruntime"]),
    ("offline-junk-model", ["offline", "--model", "junk.onnx", "--backend", "onnxruntime"]),
    ("offline-backend", ["offline", "--model", "m.onnx", "--backend", "tpu"]),
    ("offline-count-0", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--count", "0"]),
    ("offline-batch-neg", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--batch", "-1"]),
    ("offline-batch-static", ["offline", "--model", "static.onnx", "--backend", "onnxruntime", "--batch", "3"]),
    ("offline-min-duration-neg", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--min-duration", "-1"]),
    ("offline-min-duration-nan", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--min-duration", "nan"]),
    ("offline-qps-0", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--expected-qps", "0"]),
    ("offline-qps-inf", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--expected-qps", "inf"]),
    ("offline-streams-0", ["offline", "--model", "m.onnx", "--streams", "0"]),
    ("offline-gpus-0", ["offline", "--model", "m.onnx", "--gpus", "0"]),
    ("offline-gpus-text", ["offline", "--model", "m.onnx", "--gpus", "many"]),
    ("offline-mode", ["offline", "--model", "m.onnx", "--mode", "server"]),
    ("offline-log-dir-file", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--log-dir", "m.onnx"]),
    ("offline-log-dir-under-file", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--log-dir", "m.onnx/logs"]),
    ("offline-o-fifo", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "-o", "fifo"]),
    ("offline-o-input", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "-o", "m.onnx"]),
    ("offline-nan-data", ["offline", "--model", "m.onnx", "--backend", "onnxruntime", "--data", "nan.npy", "--log-dir", "m.onnx/x"]),
    ("offline-trt-onnx", ["offline", "--model", "m.onnx", "--backend", "trt", "--log-dir", "dir.onnx"]),
    # bench
    ("bench-unknown", ["bench", "bogus"]),
    ("bench-harness-seconds-0", ["bench", "harness", "--seconds", "0"]),
    ("bench-harness-seconds-nan", ["bench", "harness", "--seconds", "nan"]),
    ("bench-harness-batch-0", ["bench", "harness", "--batch", "0"]),
    ("bench-harness-slots-text", ["bench", "harness", "--slots", "two"]),
    ("bench-harness-o-fifo", ["bench", "harness", "-o", "fifo"]),
    ("bench-harness-o-dir", ["bench", "harness", "-o", "dir.onnx"]),
    ("bench-harness-o-no-folder", ["bench", "harness", "-o", "nofolder/new.json"]),
    ("bench-splitk-reps-0", ["bench", "splitk", "--reps", "0"]),
    ("bench-e2e-batch-0", ["bench", "e2e", "--batch", "0"]),
    ("bench-kernels-reps-0", ["bench", "kernels", "--reps", "0"]),
    # --debug after the subcommand changes nothing for bad input
    ("debug-after", ["rewrite", "m.onnx", "-o", "fifo", "--debug"]),
    ("debug-before", ["--debug", "calibrate", "q.onnx", "-o", "new.json"]),
]


@pytest.mark.parametrize("argv", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(corpus, argv, monkeypatch, capsys):
    monkeypatch.chdir(corpus)
    monkeypatch.setenv("TRTFUSE_RESULTS_DIR", str(corpus / "bench-results"))  # must not appear either
    before = _snapshot(corpus)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("trtfuse: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert _snapshot(corpus) == before  # inputs byte-identical, no partial or stray output


def test_output_mode_follows_the_umask(corpus, tmp_path, monkeypatch):
    """Outputs are created as open() would create them (0666 less the umask), not 0600."""
    monkeypatch.chdir(corpus)
    old = os.umask(0o027)
    try:
        assert main(["rewrite", "m.onnx", "-o", str(tmp_path / "a.onnx"), "--scales", "s.json", "--json"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.onnx").stat().st_mode) == 0o640


def test_warnings_are_one_line_and_say_what_was_done(corpus, tmp_path, monkeypatch, capsys):
    """Rewriting a model whose blocks cannot be fused (dynamic spatial dims) writes it, and says so in one line."""
    monkeypatch.chdir(corpus)
    out = tmp_path / "d.onnx"
    assert main(["rewrite", "dyn.onnx", "-o", str(out), "--scales", "s.json", "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trtfuse: warning: no block was fused") and "dynamic" in err[0], err
    assert out.is_file()


def test_default_scales_serve_every_fuse_mode(corpus, tmp_path, monkeypatch, capsys):
    """calibrate's default (--fuse both) records what `rewrite --fuse all` needs as well as --fuse residual."""
    monkeypatch.chdir(corpus)
    for fuse in ("residual", "all"):
        assert main(["rewrite", "m.onnx", "-o", str(tmp_path / f"{fuse}.onnx"), "--scales", "s.json", "--fuse", fuse,
                     "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["rewrite", "m.onnx", "-o", str(tmp_path / "x.onnx"), "--scales", "s.json", "--fuse", "all"]) == 0
    residual_only = tmp_path / "r.json"
    assert main(["calibrate", "m.onnx", "--count", "4", "--method", "max", "--fuse", "residual", "-o",
                 str(residual_only), "--json"]) == 0
    capsys.readouterr()
    assert main(["rewrite", "m.onnx", "-o", str(tmp_path / "y.onnx"), "--scales", str(residual_only), "--fuse", "all"]) == 2
    err = capsys.readouterr().err
    assert "--fuse all" in err and "trtfuse calibrate" in err  # says exactly which command to run


def _spawn(argv, cwd):
    env = dict(os.environ, TRTFUSE_PROGRESS="0", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "trtfuse.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not predicate():
        time.sleep(0.1)


@pytest.mark.parametrize("case", ["calibrate", "offline"])
def test_ctrl_c_is_exit_130_one_line_and_leaves_no_output(corpus, tmp_path, case):
    if case == "offline":
        pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen")
        # LoadGen blocks in C++; the interrupt must still end it at once
        argv = ["offline", "--model", str(corpus / "m.onnx"), "--backend", "onnxruntime", "--count", "16",
                "--min-duration", "120", "--log-dir", str(tmp_path / "logs"), "-o", str(tmp_path / "r.json")]
        started = lambda: (tmp_path / "logs" / "mlperf_log_detail.txt").exists()
    else:
        argv = ["calibrate", str(corpus / "m.onnx"), "--count", "20000", "--batch", "1", "-o", str(tmp_path / "s.json")]
        started = lambda: False  # interrupted while loading or running, whichever it is at
    proc = _spawn(argv, tmp_path)
    _wait_for(started, 30 if case == "offline" else 4)
    time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == ["trtfuse: interrupted"], err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "s.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
