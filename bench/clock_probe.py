"""At what SM clock and power does a kernel run when it runs for a while? Replays one conv tactic (or the wgmma
peak kernel) back to back for a few seconds while `nvidia-smi` samples the SM clock, the board power and the
active clock-throttle reasons, and reports their medians over the steady part (device only):

    python3 -m trtfuse.bench.clock_probe --kernels "res3 first@74" "res3 first@74:diag=2" --peak 208:2:0 [--out FILE]

The int8 datasheet peak (1979 TOPS) is counted at 1.83 GHz; a kernel whose clock sits lower loses that share of the
peak whatever its schedule, and a throttle reason of "sw power cap" says the board's power limit set it, i.e. that
the energy the kernel spends per output (data movement included) is part of its speed. Read only: the card's clocks
and limits are never touched (docs/PERF.md, "Method": clocks).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import subprocess
import sys
import time

from trtfuse import args as flags
from ..io import atomic_write_json

# nvidia-smi's clocks_throttle_reasons.active bits (nvml.h, nvmlClocksEventReasons)
THROTTLE_BITS = {0x1: "gpu idle", 0x2: "applications clocks setting", 0x4: "sw power cap", 0x8: "hw slowdown",
                 0x10: "sync boost", 0x20: "sw thermal slowdown", 0x40: "hw thermal slowdown", 0x80: "hw power brake",
                 0x100: "display clocks setting"}
QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit] or ["none"]


def parse_sample(line: str):
    """'2026/11/26 06:21:54.123, 1650, 612.34, 51, 0x0000000000000004' -> (epoch seconds, 1650.0, 612.34, 51.0, 4);
    None for a line that is not a sample."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return stamp, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)
    except ValueError:
        return None


def summarize(samples: list[tuple[float, float, float, float, int]]) -> dict:
    if not samples:
        return {"samples": 0}
    masks = {}
    for s in samples:
        masks[s[4]] = masks.get(s[4], 0) + 1
    return {"samples": len(samples), "sm_mhz": statistics.median(s[1] for s in samples),
            "sm_mhz_min": min(s[1] for s in samples), "sm_mhz_max": max(s[1] for s in samples),
            "power_w": statistics.median(s[2] for s in samples), "temp_c": max(s[3] for s in samples),
            "throttle": {", ".join(throttle_names(m)): n for m, n in sorted(masks.items())}}


def timeline(starts: list[float], gpu_ms: list[float], samples: list, edges_ms: list[float]) -> list[dict]:
    """Replays (host start time, GPU ms per launch) and nvidia-smi samples binned by time since the first replay:
    how the launch time and the clock move from an idle card into the power cap."""
    t0 = starts[0]
    rows = []
    for lo, hi in zip(edges_ms, edges_ms[1:]):
        ms = [g for t, g in zip(starts, gpu_ms) if lo <= (t - t0) * 1e3 < hi]
        clk = [s[1] for s in samples if lo <= (s[0] - t0) * 1e3 < hi]
        pw = [s[2] for s in samples if lo <= (s[0] - t0) * 1e3 < hi]
        if ms:
            rows.append({"from_ms": lo, "to_ms": hi, "ms_per_launch": statistics.median(ms),
                         "sm_mhz": statistics.median(clk) if clk else None, "power_w": statistics.median(pw) if pw else None})
    return rows


def sampled_run(torch, replay, launches_per_replay: int, seconds: float, settle: float, idle: float,
                interval_ms: int = 10) -> dict:
    """After `idle` seconds with the card idle (a cool start, as a benchmark after lighter work sees it), call replay()
    back to back for `seconds`, timing each by CUDA events and waiting for it (the host must not queue seconds ahead
    of the samples), while nvidia-smi samples every interval_ms. Returns the steady summary (the samples after `settle`
    seconds), the first 50 ms's median launch time (a bench/kernels.py figure's regime) and the timeline."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"-lms={interval_ms}"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    starts, gpu_ms = [], []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        time.sleep(idle)
        t0 = time.time()
        while time.time() - t0 < seconds:
            starts.append(time.time())
            start.record()
            replay()
            stop.record()
            stop.synchronize()
            gpu_ms.append(start.elapsed_time(stop) / launches_per_replay)
    finally:
        smi.terminate()
        out, _ = smi.communicate(timeout=10)
    samples = [x for x in (parse_sample(l) for l in out.splitlines()) if x is not None]
    steady = [x for x in samples if x[0] - t0 >= settle and x[0] - t0 <= seconds]
    first = [g for t, g in zip(starts, gpu_ms) if t - t0 < 0.05]
    late = [g for t, g in zip(starts, gpu_ms) if t - t0 >= settle]
    edges = [0, 10, 20, 30, 50, 100, 200, 400, 700, 1000, 1500, 2000, 3000, 5000]
    return {"first_50ms_ms": statistics.median(first), "steady_ms": statistics.median(late) if late else None,
            **summarize(steady), "timeline": timeline(starts, gpu_ms, samples, [e for e in edges if e <= seconds * 1e3 + 1])}


def main(argv=None) -> int:
    import torch

    from ..plugins import cuda_driver as cd
    from ..plugins.conv import ConvLaunch
    from .conv_problem import ConvProblem
    from .kernels import captured_graph
    from .wgmma_check import TorchOperands
    from .wgmma_diag import LAYERS, replaced_variant

    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", nargs="*", default=["res3 first@74"],
                    help="LAYER@TACTIC: a bench/wgmma_diag.py layer name's substring and a tactic id with replaced fields "
                    "('res3 first@74:diag=2')")
    ap.add_argument("--peak", nargs="*", default=[], help="wgmma peak variants N:warpgroups:layout (bench/wgmma_peak.py)")
    flags.seconds(ap, 2.0, "seconds each kernel replays (default 2)")
    flags.settle(ap, 1.0, "seconds into each kernel's run before its samples count as steady (default 1)")
    ap.add_argument("--idle", type=float, default=2.0, help="seconds idle before each kernel's run")
    flags.out(ap)
    args = ap.parse_args(argv)
    torch.cuda.init()
    cd.context()
    rows = []

    def report(label, r):
        rows.append({"variant": label, **r})
        steady = "-" if r["steady_ms"] is None else f"{r['steady_ms']:.4f}"  # None: the run ended before `settle`
        print(f"{label:34s} first 50 ms {r['first_50ms_ms']:.4f} ms/launch, steady {steady}  "
              f"SM {r.get('sm_mhz', 0):6.0f} MHz ({r.get('sm_mhz_min', 0):.0f}-{r.get('sm_mhz_max', 0):.0f})  "
              f"{r.get('power_w', 0):6.1f} W  {r.get('temp_c', 0):.0f} C  {r.get('throttle')}", flush=True)
        for b in r["timeline"]:
            print(f"    {b['from_ms']:5.0f}-{b['to_ms']:<5.0f} ms  {b['ms_per_launch']:.4f} ms/launch  "
                  f"{b['sm_mhz'] or 0:5.0f} MHz  {b['power_w'] or 0:5.0f} W")

    for kernel in args.kernels:
        layer, spec = kernel.split("@")
        name, shape = next((n, s) for n, s in LAYERS if layer in n)
        ops = TorchOperands(torch, ConvProblem.random(shape, False))
        label, tactic = replaced_variant(spec)
        graph, inner, _ = captured_graph(torch, ops.launcher(ConvLaunch(shape, tactic, 1)), target_ms=1.0)
        torch.cuda.synchronize()
        report(f"{name.split(' 3x3')[0]} {label}", sampled_run(torch, graph.replay, inner, args.seconds, args.settle, args.idle))
        del graph, ops
        torch.cuda.empty_cache()
    for variant in args.peak:
        from . import wgmma_peak

        fn, _ = wgmma_peak.launcher(torch, cd, variant, iters=1000)
        fn()
        report(f"wgmma_peak {variant}", sampled_run(torch, fn, 1, args.seconds, args.settle, args.idle))
    if args.out:
        atomic_write_json(args.out, {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "command": "python3 -m trtfuse.bench.clock_probe " + shlex.join(sys.argv[1:] if argv is None else argv),
                                     "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
