"""`trtfuse bench harness`: the samples per second the Offline harness itself sustains (CPU only).

LoadGen's Offline scenario, the query slicing, the launcher and completion threads and the per-sample
responses of runtime/offline.py, over runner slots that take no time: each `start` writes its batch's
answer at once and each `wait` returns it. No GPU is involved, so the figure is the harness's own ceiling:
a GPU run cannot go faster, and at a GPU rate R the harness's Python work (under one GIL) occupies about
R / ceiling of the run's time, which is what it can steal from the threads that feed the GPU.

    trtfuse bench harness [--batch 256] [--slots 4] [--seconds 5] [--count 4096] [--answers array|lists|objects]

--answers is the offline run's choice: the query read in place (runtime/loadgen_query.py) and one C++ call per batch
(runtime/loadgen_answers.py), the query as the Python binding's two lists, or those and a Python QuerySampleResponse
per sample.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile

import numpy as np

from trtfuse import args as flags
from ..runtime.offline import DEFAULT_STREAMS


class InstantSlot:
    """A runner slot whose batch is done the moment it starts (the answer: sample index mod 1000)."""

    def __init__(self, batch: int):
        self.top1 = np.zeros(batch, np.int32)

    def start(self, indices) -> None:
        self.top1[: len(indices)] = np.asarray(indices) % 1000

    def wait(self) -> np.ndarray:
        return self.top1


def measure(batch: int, slots: int, seconds: float, count: int, log_dir: str, answers: str = "array") -> dict:
    from ..runtime.offline import _GpuWorker, run_loadgen

    worker = _GpuWorker([InstantSlot(batch) for _ in range(slots)])
    # LoadGen sizes the one Offline query from the expected rate: 1.1 x 200k/s x `seconds` samples (the
    # harness may finish them sooner than `seconds`; the rate is what is measured).
    return run_loadgen([worker], count, batch, pad_last_batch=True, mode="performance", log_dir=log_dir,
                       expected_qps=200_000.0, min_duration_s=seconds, answers=answers)


def add_arguments(p) -> None:
    flags.batch(p, 256, "samples per batch (default 256)")
    p.add_argument("--slots", type=int, default=DEFAULT_STREAMS, help="runner slots, as --streams (default %d)" % DEFAULT_STREAMS)
    flags.seconds(p, 5.0, "LoadGen min duration: the query holds 220k x S samples (default 5)")
    flags.count(p, 4096, "samples in the query sample library (default 4096)")
    flags.answers(p, "as trtfuse offline --answers")


def run(args) -> int:
    from . import record_result
    from ..errors import TrtfuseError
    from ..validate import check_output_file

    if getattr(args, "output", None):
        check_output_file(args.output, "-o")
    from ..ui import print_json, print_table

    if args.batch < 1 or args.slots < 1 or args.seconds <= 0 or args.count < 1:
        raise TrtfuseError("--batch, --slots and --count must be at least 1 and --seconds positive")
    with tempfile.TemporaryDirectory() as logs:
        result = measure(args.batch, args.slots, args.seconds, args.count, logs, args.answers)
    host = f"cpu: {platform.processor() or platform.machine()} x {os.cpu_count()} cores, Python {platform.python_version()}"
    date = datetime.date.today().isoformat()
    record = {"device": host, "date": date, "command": args.command_line, "batch": args.batch,
              "slots": args.slots, "answers": result["answers"], "samples_per_s": result["samples_per_s"],
              "samples_completed": result["samples_completed"], "wall_seconds": result["wall_seconds"],
              "result": result["loadgen_summary"].get("Result is")}
    path = record_result("harness", "cpu", record, getattr(args, "output", None),
                         {k: record[k] for k in ("samples_per_s", "result", "batch", "slots", "answers")})
    if getattr(args, "json", False):
        print_json(record)
    else:
        print_table(["measurement", "value"], [["harness ceiling (samples/s)", f"{record['samples_per_s']:,.0f}"],
                                               ["answers", record["answers"]],
                                               ["samples", f"{record['samples_completed']:,}"],
                                               ["wall s", f"{record['wall_seconds']:.2f}"], ["results", path]])
    return 0
