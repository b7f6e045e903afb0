"""What a new user meets first: --help, --debug anywhere, progress when piped, the packaging, the quickstart's
last words, benchmarks from any folder, offline on the CPU with its defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_calib import small_resnet
from trtfuse.cli import SERVING, WORKFLOW, build_parser, main
from trtfuse.io import save_model

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_the_workflow_in_the_readme_order(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^    ([a-z][a-z-]+)", text, flags=re.M)
    assert listed == [c for c in WORKFLOW + SERVING if c in listed] and set(listed) == set(WORKFLOW + SERVING)
    readme = (ROOT / "README.md").read_text().split("## Workflow", 1)[1].split("```", 2)[1]
    order = list(dict.fromkeys(re.findall(r"^trtfuse ([a-z-]+)", readme, flags=re.M)))
    assert order == [c for c in WORKFLOW if c in order]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_works_before_or_after_the_subcommand(tmp_path, monkeypatch, where, capsys):
    import trtfuse.graph_passes.pipeline as pipeline

    save_model(small_resnet(size=32), tmp_path / "m.onnx")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(pipeline, "run_pipeline", broken)
    argv = ["rewrite", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--calib-images", "1"]
    assert main(argv) == 1  # an unexpected exception: one line, pointing at --debug
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: a bug (rerun with --debug" in err
    with pytest.raises(RuntimeError, match="a bug"):  # the traceback, wherever --debug stands
        main(["--debug"] + argv if where == "before" else argv + ["--debug"])


def test_progress_lines_when_piped(monkeypatch, capsys):
    from trtfuse.ui import progress

    monkeypatch.setenv("TRTFUSE_PROGRESS_INTERVAL", "0")
    monkeypatch.delenv("TRTFUSE_PROGRESS", raising=False)
    for _ in progress(range(3), desc="step", unit="img"):
        pass
    lines = capsys.readouterr().err.strip().splitlines()  # pytest's stderr is not a terminal
    assert lines[0].startswith("step: 1/3 img (33%)") and lines[-1].endswith("- done"), lines
    monkeypatch.setenv("TRTFUSE_PROGRESS", "0")
    for _ in progress(range(3), desc="step"):
        pass
    assert capsys.readouterr().err == ""


def test_pyproject_gives_setuptools_nothing_to_warn_about():
    tomllib = pytest.importorskip("tomllib")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(cfg["project"]["license"], str)  # an SPDX expression, not the deprecated table
    tools = cfg["tool"]["setuptools"]
    dirs, packages = tools["package-dir"], set(tools["packages"])
    for package, folder in dirs.items():  # every folder that Python could import is a listed package
        for sub in (ROOT / folder).rglob("*"):
            parts = sub.relative_to(ROOT / folder).parts
            if "__pycache__" in parts or "results" in parts:  # bytecode; the recorded benchmark results
                continue
            if sub.is_dir() and any(f.is_file() for f in sub.iterdir()):
                name = package + "." + ".".join(parts)
                assert name in packages, f"{name} ({sub}) is importable but not in [tool.setuptools] packages"


def test_quickstart_ends_by_naming_every_output():
    text = (ROOT / "scripts" / "quickstart.sh").read_text()
    outputs = re.findall(r"(?:-o|--report)\s+(out/\S+)", text)
    tail = text[text.rindex("$T "):]
    assert outputs and all(f"  {o} " in tail for o in outputs), outputs


def test_bench_harness_from_any_folder_writes_there_not_into_the_package(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen")
    import trtfuse.bench as bench

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRTFUSE_RESULTS_DIR", raising=False)
    package = Path(bench.__file__).parent / "results"
    before = sorted(p.name for p in package.iterdir()) if package.is_dir() else []
    assert main(["bench", "harness", "--seconds", "0.05", "--count", "64", "--batch", "8", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    written = sorted(p.name for p in (tmp_path / "bench-results").iterdir())
    assert written == ["harness-cpu.json", "harness-history.jsonl"]
    latest = json.loads((tmp_path / "bench-results" / "harness-cpu.json").read_text())
    assert latest["samples_completed"] == record["samples_completed"]
    (line,) = (tmp_path / "bench-results" / "harness-history.jsonl").read_text().splitlines()
    assert json.loads(line)["samples_per_s"] == record["samples_per_s"] and json.loads(line)["version"]
    assert (sorted(p.name for p in package.iterdir()) if package.is_dir() else []) == before


@pytest.fixture(scope="module")
def cpu_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline")
    save_model(small_resnet(size=32, batch=1), root / "static.onnx")
    assert main(["rewrite", str(root / "static.onnx"), "-o", str(root / "q.onnx"), "--calib-images", "1", "--json"]) == 0
    return root


def test_offline_onnxruntime_defaults_fit_a_batch_1_model(cpu_models, tmp_path, capsys):
    pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen")
    out = tmp_path / "r.json"
    capsys.readouterr()
    assert main(["offline", "--model", str(cpu_models / "static.onnx"), "--backend", "onnxruntime", "--count", "8",
                 "--min-duration", "0.5", "--log-dir", str(tmp_path / "logs"), "-o", str(out), "--json"]) == 0
    result = json.loads(out.read_text())
    assert result["batch"] == 1 and result["expected_qps"] > 0  # the model's batch; the rate from a warm-up
    # LoadGen's query is sized from the measured rate: a run of seconds, not hours
    assert result["samples_completed"] <= 1.1 * result["expected_qps"] * 0.5 + 2


def test_offline_onnxruntime_runs_a_rewritten_model_and_says_why_invalid(cpu_models, tmp_path, capsys):
    pytest.importorskip("mlperf_loadgen", reason="needs mlcommons-loadgen")
    capsys.readouterr()
    # one sample for a 5 s minimum: LoadGen must judge it INVALID, and trtfuse must say why
    assert main(["offline", "--model", str(cpu_models / "q.onnx"), "--backend", "onnxruntime", "--count", "2",
                 "--min-duration", "5", "--expected-qps", "0.1", "--log-dir", str(tmp_path / "logs")]) == 0
    out, err = capsys.readouterr()
    assert "INVALID because" in out and "Min duration not satisfied" in out
    assert err.strip().splitlines() == [l for l in err.strip().splitlines() if l.startswith("trtfuse: warning: LoadGen judged")]
    assert len(err.strip().splitlines()) == 1


def test_bad_scale_numbers_are_refused_not_rounded(tmp_path, capsys):
    from trtfuse.errors import TrtfuseError
    from trtfuse.graph_passes.scales import validate_scales

    for value in (1e-50, 1e39):
        with pytest.raises(TrtfuseError, match="outside the float32 range"):
            validate_scales({"format": "trtfuse-scales-v1", "activations": {"x": value}})
    assert validate_scales({"format": "trtfuse-scales-v1", "activations": {"x": 0.02}}) == {"x": 0.02}


def test_all_zero_tensors_are_named_in_one_warning(capsys):
    from trtfuse.calib.calibrate import warn_zero_tensors
    from trtfuse.calib.stats import AbsHistogram

    import numpy as np

    hists = {"a": AbsHistogram(64), "b": AbsHistogram(64)}
    hists["a"].add(np.zeros(8, np.float32))
    hists["b"].add(np.ones(8, np.float32))
    assert warn_zero_tensors(hists, {"a": 1.0, "b": 1.0}) == ["a"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trtfuse: warning: 1 of 2 tensors were 0") and "'a'" in err[0]


def test_non_finite_activations_are_refused():
    from trtfuse.calib.stats import AbsHistogram, NonFiniteActivation

    import numpy as np

    with pytest.raises(NonFiniteActivation):
        AbsHistogram(64).add(np.array([1.0, np.inf], np.float32))  # would loop forever doubling the range


def test_input_and_output_path_messages_blame_the_right_thing(tmp_path, capsys):
    save_model(small_resnet(size=32), tmp_path / "m.onnx")
    (tmp_path / "folder.onnx").mkdir()
    assert main(["rewrite", str(tmp_path / "folder.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    assert "is a directory, not a model file" in capsys.readouterr().err
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "file").write_text("")
    assert main(["rewrite", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "ro" / "file" / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert "checker" not in err and "is not a folder" in err


def test_run_takes_a_folder_of_images_as_calibrate_and_evaluate_do(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    save_model(small_resnet(size=32), tmp_path / "m.onnx")
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    capsys.readouterr()
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(folder), "--count", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["images"] == 3
