"""Benchmarks (`trtfuse bench ...`). Each writes one JSON record of its run."""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "TRTFUSE_RESULTS_DIR"
DEFAULT_RESULTS_DIR = "bench-results"  # under the current folder: never inside the installed package


def default_results_path(name: str) -> Path:
    """Where a benchmark writes its record when -o is not given: $TRTFUSE_RESULTS_DIR/<name>, else
    ./bench-results/<name> (the folder is created; an unwritable place is a one-line error). The repository's
    own records live in bench/results/ and are written there only when asked (-o or TRTFUSE_RESULTS_DIR)."""
    from ..validate import make_output_dir

    folder = make_output_dir(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS_DIR, "results folder")
    return folder / name
