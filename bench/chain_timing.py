"""The chain kernel (plugins/chain_conv.py) against the two fused-conv kernels it replaces, on one GPU:

    python3 -m trtfuse.bench.chain_timing [--batch 256] [--c2 64] [--reps 50]

Both on the same random operands (timing only: correctness is tests/test_chain_conv_gpu.py's), each conv of the pair
planned by the heuristic (ConvLaunch.plan), medians of CUDA-event times after a warm-up. Writes the run's record
(bench-results/chain-timing-<device>.json and its history line).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import numpy as np

from trtfuse import args as flags


def measure(batch: int, c2: int, reps: int) -> dict:
    from ..plugins import chain_conv
    from ..plugins import cuda_driver as cd
    from ..plugins.conv import ConvLaunch
    from ..plugins.tactics import ConvShape

    rng = np.random.default_rng(0)
    conv1 = ConvShape(batch, chain_conv.K1, 56, 56, chain_conv.C1, 1, 1)
    conv2 = ConvShape(batch, chain_conv.C1, 56, 56, c2, 1, 1)
    hw = 56 * 56

    def int8(count):
        return cd.DeviceBuffer.from_array(rng.integers(-128, 128, count, dtype=np.int8))

    def f32(count, low, high):
        return cd.DeviceBuffer.from_array(rng.uniform(low, high, count).astype(np.float32))

    x, residual = int8(batch * chain_conv.K1 * hw), int8(batch * chain_conv.C1 * hw)
    convs = [(int8(c.k * c.c), f32(c.k, 1e-6, 3e-6), f32(c.k, -0.3, 0.3), f32(1, 0.01, 0.03)) for c in (conv1, conv2)]
    residual_scale = f32(1, 0.002, 0.01)
    y, z = cd.DeviceBuffer(batch * chain_conv.C1 * hw), cd.DeviceBuffer(batch * c2 * hw)
    ptrs = [tuple(b.ptr for b in c) for c in convs]
    plans = [ConvLaunch.plan(conv1), ConvLaunch.plan(conv2)]
    workspaces = [cd.DeviceBuffer(p.workspace_bytes) if p.workspace_bytes else None for p in plans]
    for ws in workspaces:
        if ws:
            ws.fill(0)
    stream = cd.Stream()

    def chain():
        chain_conv.launch_chain((conv1, conv2), x.ptr, residual.ptr, residual_scale.ptr, ptrs, y.ptr, z.ptr,
                                stream=stream.handle)

    def first():
        plans[0].launch(x.ptr, *ptrs[0], y.ptr, residual=residual.ptr, residual_scale=residual_scale.ptr,
                        workspace=workspaces[0].ptr if workspaces[0] else 0, stream=stream.handle)

    def second():
        plans[1].launch(y.ptr, *ptrs[1], z.ptr, workspace=workspaces[1].ptr if workspaces[1] else 0, stream=stream.handle)

    def pair():
        first()
        second()

    timer = cd.Timer()
    out = {}
    for name, fn in (("chain", chain), ("conv 1 alone", first), ("conv 2 alone", second), ("two kernels", pair)):
        for _ in range(3):
            fn()
        stream.synchronize()
        out[name] = statistics.median(timer.time(fn, stream.handle, reps))
    out["plans"] = [p.name for p in plans]
    return out


def main(argv=None) -> int:
    from . import record_result
    from ..plugins import chain_conv
    from ..plugins import cuda_driver as cd
    from ..ui import print_table

    p = argparse.ArgumentParser(prog="python3 -m trtfuse.bench.chain_timing", description=__doc__.split("\n\n")[0])
    flags.batch(p, 256, "images per batch (default 256)")
    p.add_argument("--c2", type=int, choices=chain_conv.C2_CHOICES, default=64, help="conv 2's output channels (default 64)")
    flags.reps(p, 50, "timed launches per kernel (default 50)")
    args = p.parse_args(argv)
    ok, why = cd.gpu_available()
    if not ok:
        print(f"needs a CUDA GPU: {why}", file=sys.stderr)
        return 1
    refused = chain_conv.device_refusal()
    if refused:
        print(refused, file=sys.stderr)
        return 1
    times = measure(args.batch, args.c2, args.reps)
    device = cd.device_name()
    record = {"device": device, "date": datetime.date.today().isoformat(), "command": "python3 -m trtfuse.bench.chain_timing "
              + " ".join(sys.argv[1:] if argv is None else argv), "batch": args.batch, "c2": args.c2, "ms": times}
    path = record_result("chain-timing", device, record, None,
                         {"batch": args.batch, "c2": args.c2, "chain_ms": times["chain"], "two_kernels_ms": times["two kernels"]})
    print_table(["kernel", "ms (median)"], [[k, f"{v:.4f}"] for k, v in times.items() if k != "plans"]
                + [["plans of the two", ", ".join(times["plans"])], ["record", path]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
