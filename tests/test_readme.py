"""The README's workflow block, run line by line on the CPU, so the README cannot drift from the product.

Every `trtfuse ...` line of the first code block under "## Workflow" runs, in order, in a temporary folder,
through `trtfuse.cli.main` (the console command's entry point, without a process start per line). Comments
are dropped and `[optional]` groups left out. The one substitution: the first line's `models resnet50`
builds a ResNet-18 at 32 x 32 (under the same file name), so the block takes about a minute on 2 cores
instead of many; every other argument is the README's. Lines whose comment starts with `GPU:` or `TensorRT:` must end,
on a machine without them, in exactly one `trtfuse: error:` line with exit 2; every other line must pass.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trtfuse.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
SMALL_MODEL = ["resnet18", "--image-size", "32"]


def workflow_lines(text: str) -> list[tuple[list[str], str]]:
    """(argv after `trtfuse`, comment) for each command line of the Workflow block."""
    section = text.split("## Workflow", 1)[1]
    block = section.split("```", 2)[1]
    lines = []
    for raw in block.splitlines():
        command, _, comment = raw.partition("  #")
        command = re.sub(r"\[[^\]]*\]", "", command).strip()
        if not command:
            continue
        argv = shlex.split(command)
        assert argv[0] == "trtfuse", f"README workflow line does not start with trtfuse: {raw!r}"
        lines.append((argv[1:], comment.strip()))
    return lines


def serving_lines(text: str) -> list[tuple[list[str], str]]:
    """The README's "Serving on Triton Inference Server" block."""
    section = text.split("## Serving on Triton Inference Server", 1)[1]
    block = section.split("```", 2)[1]
    return workflow_lines("## Workflow\n```" + block + "```")


def needs_hardware(comment: str) -> bool:
    return bool(re.match(r"(GPU|TensorRT):", comment))


def test_workflow_block_is_parsed():
    lines = workflow_lines(README.read_text())
    commands = [argv[0] for argv, _ in lines]
    # every subcommand appears, in the order `trtfuse --help` lists them
    from trtfuse.cli import WORKFLOW

    firsts = [c for c in dict.fromkeys(commands)]
    assert [c for c in WORKFLOW if c in firsts] == sorted(firsts, key=WORKFLOW.index)
    assert set(WORKFLOW) - {"calibrate-compare"} <= set(commands)
    assert lines[0][0][:2] == ["models", "resnet50"]


def _no_gpu() -> bool:
    try:
        from trtfuse.plugins import cuda_driver as cd

        return not cd.gpu_available()[0]
    except Exception:  # noqa: BLE001 - no cuda-python at all: no GPU either
        return True


@pytest.mark.slow
def test_readme_workflow_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlperf_loadgen", reason="the README's offline line needs mlcommons-loadgen")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRTFUSE_RESULTS_DIR", str(tmp_path / "bench-results"))
    no_gpu = _no_gpu()
    for i, (argv, comment) in enumerate(workflow_lines(README.read_text())):
        if i == 0:
            argv = argv[:1] + SMALL_MODEL + argv[2:]
        rc = main(list(argv))
        out, err = capsys.readouterr()
        shown = "trtfuse " + " ".join(argv)
        assert "Traceback" not in err and "internal error" not in err, (shown, err)
        if needs_hardware(comment):
            if no_gpu:
                lines = err.strip().splitlines()
                assert rc == 2 and len(lines) == 1 and lines[0].startswith("trtfuse: error: "), (shown, rc, err)
        else:
            assert rc == 0, (shown, rc, err)
            assert out.strip(), shown  # every subcommand prints a summary
            assert not [l for l in err.splitlines() if "warning" in l.lower()], (shown, err)
    for name in ("resnet50.onnx", "scales.json", "resnet50.int8.onnx", "resnet50.all.onnx"):
        assert (tmp_path / name).is_file(), name
    # The serving block, on the model the workflow just wrote: without a GPU `serve --backend cuda` stops with one
    # line, and with no server on the port the LoadGen lines do too.
    if no_gpu:
        for argv, _ in serving_lines(README.read_text()):
            rc = main(list(argv))
            out, err = capsys.readouterr()
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1 and lines[0].startswith("trtfuse: error: "), (argv, rc, err)


def qdq_lines(text: str) -> list[tuple[list[str], str]]:
    """The README's Q/DQ block: the code block after "quantized with Q/DQ nodes" in the Workflow section."""
    section = text.split("## Workflow", 1)[1].split("quantized with Q/DQ nodes", 1)[1]
    block = section.split("```", 2)[1]
    return workflow_lines("## Workflow\n```" + block + "```")


@pytest.mark.slow
def test_readme_qdq_block_runs_on_an_onnxruntime_quantized_model(tmp_path, monkeypatch, capsys):
    """The block's lines on what a user brings: ONNX Runtime's quantize_static (QDQ, per-channel int8 weights,
    symmetric int8 activations) of a small ResNet, saved as the README's model.qdq.onnx."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from trtfuse.models.cache import load_cached_model

    monkeypatch.chdir(tmp_path)
    onnx.save(load_cached_model("resnet18", image_size=32, batch=1, opset=17, fold_bn=True), "model.fp32.onnx")
    images = np.random.default_rng(3).normal(size=(4, 3, 32, 32)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": images[i:i + 1]} for i in range(len(images))])

        def get_next(self):
            return next(self.it, None)

    quantize_static("model.fp32.onnx", "model.qdq.onnx", Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True})
    before = (tmp_path / "model.qdq.onnx").read_bytes()
    lines = qdq_lines(README.read_text())
    assert [argv[0] for argv, _ in lines] == ["rewrite", "evaluate"]
    for argv, _ in lines:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 0 and out.strip(), ("trtfuse " + " ".join(argv), rc, err)
        assert "Traceback" not in err and "internal error" not in err
    assert (tmp_path / "model.qdq.onnx").read_bytes() == before
    rewritten = onnx.load("model.int8.onnx")
    assert sum(n.domain == "trtfuse" for n in rewritten.graph.node) > 0
