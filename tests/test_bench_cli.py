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
