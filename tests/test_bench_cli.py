"""`trtfuse bench ...` without a GPU: every GPU benchmark ends with one line and exit status 2, writes
no results file, and `bench e2e` is reachable from the CLI with the e2e module's options."""

import pytest

from trtfuse.cli import main
from trtfuse.plugins.cuda_driver import gpu_available

_ok, _ = gpu_available()
pytestmark = pytest.mark.skipif(_ok, reason="checks the no-GPU error path; this machine has a GPU")


@pytest.mark.parametrize("argv", [["bench", "e2e", "--no-torch", "--seconds", "1"], ["bench", "kernels", "--batch", "1"]])
def test_gpu_benchmarks_refuse_cleanly_without_a_gpu(argv, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(argv + ["-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trtfuse: error:") and ("GPU" in err[0] or "CUDA" in err[0])
    assert not out.exists()


def test_bench_e2e_rejects_bad_values(capsys):
    assert main(["bench", "e2e", "--streams", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_bench_e2e_pipeline_only_refusals_are_one_line(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    assert main(["bench", "e2e", "--pipeline-only", "--energy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pipeline-only" in err[0]
    assert main(["bench", "e2e", "--pipeline-only", "--model", str(tmp_path / "missing.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.onnx" in err[0]
    plain = tmp_path / "relu.onnx"  # a valid model, but not one `trtfuse rewrite --fuse all` wrote
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(plain))
    before = plain.read_bytes()
    assert main(["bench", "e2e", "--pipeline-only", "--model", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no fused convolutions" in err[0] and "Traceback" not in err[0]
    assert plain.read_bytes() == before


def test_bench_e2e_takes_a_rewritten_model_up_to_the_gpu(tmp_path, capsys):
    """A `rewrite --fuse all` model passes --model's checks; the one line is then the missing GPU's. With the graph loop's
    PyTorch comparison (torchvision's ResNet-50) a given model is refused."""
    from onnx_fixtures import save_tiny_rewritten

    path = tmp_path / "all.onnx"
    save_tiny_rewritten(path)
    assert main(["bench", "e2e", "--model", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-torch" in err[0]
    out = tmp_path / "r.json"
    assert main(["bench", "e2e", "--pipeline-only", "--model", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPU" in err[0] and not out.exists()
