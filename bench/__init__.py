"""Benchmarks (`trtfuse bench ...`). Each writes one JSON record of its run."""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "TRTFUSE_RESULTS_DIR"
DEFAULT_RESULTS_DIR = "bench-results"  # under the current folder: never inside the installed package
# CUDA sources only the bench compiles: the probes (stream_probe.cu, wgmma_peak.cu) and the wgmma kernel's profiling
# hooks (wgmma_profiling.cuh, wgmma_timeline.cuh). Apart from plugins/kernels/ so that production kernels cannot include
# them; NVRTC gets both folders for these builds (plugins/nvrtc.py compile_kernel's include_dirs). Not named
# bench/kernels/: trtfuse.bench.kernels is `trtfuse bench kernels`.
PROBE_KERNEL_DIR = Path(__file__).parent / "probe_kernels"


def default_results_path(name: str) -> Path:
    """Where a benchmark writes its record when -o is not given: $TRTFUSE_RESULTS_DIR/<name>, else
    ./bench-results/<name> (the folder is created; an unwritable place is a one-line error). The repository's
    own records live in bench/results/ and are written there only when asked (-o or TRTFUSE_RESULTS_DIR)."""
    from ..validate import make_output_dir

    folder = make_output_dir(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS_DIR, "results folder")
    return folder / name


def device_tag(device: str) -> str:
    """A device name as it appears in a results file name ("NVIDIA H200" -> "NVIDIA_H200")."""
    return device.replace(" ", "_")


def record_result(benchmark: str, device: str, result: dict, output: str | None, key_figures: dict) -> str:
    """Write a benchmark's record and append its history line; returns the record's path.

    The record is the latest result for (benchmark, device): `-o`, else <results folder>/<benchmark>-<device>.json,
    written atomically. Next to it, <benchmark>-history.jsonl gains one line per run: date, kernel version,
    command and the run's key figures, so a folder of results shows the present in its records and the past in
    one file per benchmark."""
    import json

    from .. import KERNELS_VERSION
    from ..io import atomic_write_json

    path = Path(output) if output else default_results_path(f"{benchmark}-{device_tag(device)}.json")
    atomic_write_json(str(path), result)
    row = {"benchmark": benchmark, "device": device, "date": result.get("date"), "version": KERNELS_VERSION,
           "command": result.get("command"), **key_figures}
    with open(path.with_name(f"{benchmark}-history.jsonl"), "a", encoding="utf-8") as history:
        history.write(json.dumps(row) + "\n")
    return str(path)
