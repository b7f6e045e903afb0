"""Where does a channel-major ping-pong tile's time go? Runs the timeline build (bench/probe_kernels/wgmma_timeline.cuh, of
plugins/kernels/wgmma_conv.cu: each consumer warpgroup's thread 0 writes the SM clock at six points of each of its
tiles; with any profiling build, --replace diag=1) on one layer at batch 256 and prints the median phase lengths in
clocks, and the SM clock rate they imply against the kernel's time (device only):

    python3 -m trtfuse.bench.wgmma_timeline --layer "res3 first" --tactic 74 [--replace diag=1:pp_inflight=2] [--out FILE]

  wait turn    ready (previous store has read the staging tile) -> the other warpgroup has issued its tile
  wait window  turn -> the tile's first windows have landed
  issue        first windows -> last batch committed (the main loop as this warpgroup issues it)
  drain        last commit -> its wgmmas done
  epilogue     drained -> requantized, staged and handed to the TMA store
  to ready     stored -> ready for the next tile (the previous store's reads of the staging tile)
  period       ready -> ready, one warpgroup's two tiles (the CTA's pair of tiles)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
import sys

import numpy as np

from trtfuse import args as flags
from ..io import atomic_write_json
from ..plugins.conv import ConvLaunch
from .wgmma_diag import LAYERS, replaced_variant

# kTimelineCtas, kTimelineTiles, kTimelinePoints, window uses and the points of each (kWindowPoints) in wgmma_conv.cu
CTAS, TILES, POINTS, USES, WINDOW_POINTS = 160, 16, 6, 64, 4
PHASES = ("wait turn", "wait window", "issue", "drain", "epilogue")


def phases(stamps: np.ndarray) -> dict[str, np.ndarray]:
    """stamps [cta, warpgroup, tile, point] (0 where never written) -> each phase's lengths over the tiles that
    ran, and the period between a warpgroup's consecutive tiles."""
    d = stamps.astype(np.int64)
    ran = (d != 0).all(axis=-1)
    out = {name: (d[..., j + 1] - d[..., j])[ran] for j, name in enumerate(PHASES)}
    nxt = ran[..., 1:] & ran[..., :-1]
    out["to ready"] = (d[..., 1:, 0] - d[..., :-1, 5])[nxt]
    out["period"] = (d[..., 1:, 0] - d[..., :-1, 0])[nxt]
    return out


def window_phases(w: np.ndarray, slots: int) -> dict[str, np.ndarray]:
    """w [cta, use, (issued, seen landed, given back, slot wanted)] -> a window's time in the copy path (issue to seen)
    and in its slot (seen to given back), how long a given-back slot takes to carry the window `slots` uses on (given
    back to that one's issue) and the producer's wait for it, and the intervals between consecutive windows' issues
    and sightings. A ring of `slots` turns once per slot-time: copy path + held + back to issue."""
    ran = (w != 0).all(axis=-1)
    both = ran[:, 1:] & ran[:, :-1]
    lap = ran[:, slots:] & ran[:, :-slots]
    return {"window seen after issue": (w[..., 1] - w[..., 0])[ran],
            "window held (seen to given back)": (w[..., 2] - w[..., 1])[ran],
            "slot given back to reissued": (w[:, slots:, 0] - w[:, :-slots, 2])[lap],
            "producer waits for the slot": (w[..., 0] - w[..., 3])[ran],
            "window issue interval": (w[:, 1:, 0] - w[:, :-1, 0])[both],
            "window seen interval": (w[:, 1:, 1] - w[:, :-1, 1])[both]}


def main(argv=None) -> int:
    import torch
    from cuda.bindings import driver as drv

    from ..plugins import cuda_driver as cd
    from ..plugins import wgmma
    from .conv_problem import ConvProblem
    from .kernels import graph_time_ms
    from .wgmma_check import TorchOperands

    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", default="res3 first")
    ap.add_argument("--tactic", type=int, default=74)
    flags.replace(ap, "colon-separated integer fields of the tactic to replace: 'pp_inflight=2'")
    ap.add_argument("--dump", type=int, help="print one CTA's raw stamps (points 0-5 per tile; per window: wanted, issued, seen, given back)")
    flags.out(ap)
    args = ap.parse_args(argv)
    _, variant = replaced_variant(":".join([str(args.tactic)] + ([args.replace] if args.replace else [])))
    tactic = dataclasses.replace(variant, timeline=1)
    name, shape = next((n, s) for n, s in LAYERS if args.layer in n)
    torch.cuda.init()
    cd.context()
    ops = TorchOperands(torch, ConvProblem.random(shape, False))
    plan = ConvLaunch(shape, tactic, 1)
    run = ops.launcher(plan)
    for _ in range(3):  # warm: clocks up, module loaded
        run()
    torch.cuda.synchronize()
    module = wgmma.module_for(tactic).module
    ptr, size = cd.check(drv.cuModuleGetGlobal(module, b"trtfuse_timeline"))
    assert size == CTAS * 2 * TILES * POINTS * 8
    wptr, wsize = cd.check(drv.cuModuleGetGlobal(module, b"trtfuse_windows"))
    assert wsize == CTAS * USES * WINDOW_POINTS * 8
    eptr, esize = cd.check(drv.cuModuleGetGlobal(module, b"trtfuse_entry"))
    assert esize == CTAS * 8
    entry = np.zeros(CTAS, dtype=np.uint64)
    host = np.zeros(CTAS * 2 * TILES * POINTS, dtype=np.uint64)
    windows = np.zeros(CTAS * USES * WINDOW_POINTS, dtype=np.uint64)
    ms = graph_time_ms(torch, run, 10)
    records, spans, starts = [], [], []
    for _ in range(5):
        cd.check(drv.cuMemsetD8(ptr, 0, size))
        cd.check(drv.cuMemsetD8(wptr, 0, wsize))
        cd.check(drv.cuMemsetD8(eptr, 0, esize))
        run()
        torch.cuda.synchronize()
        cd.check(drv.cuMemcpyDtoH(host.ctypes.data, ptr, size))
        cd.check(drv.cuMemcpyDtoH(entry.ctypes.data, eptr, esize))
        stamps = host.reshape(CTAS, 2, TILES, POINTS).astype(np.int64)
        # a CTA's start to its first tile's ready point (barrier init, the weight's load, the first windows' wait)
        starts += [int(c[c != 0].min() - e) for c, e in zip(stamps, entry.astype(np.int64)) if (c != 0).any() and e != 0]
        cd.check(drv.cuMemcpyDtoH(windows.ctypes.data, wptr, wsize))
        records.append(phases(stamps) | window_phases(windows.reshape(CTAS, USES, WINDOW_POINTS).astype(np.int64), tactic.halo_stages))
        spans += [int(c[c != 0].max() - c[c != 0].min()) for c in stamps if (c != 0).any()]
    pooled = {k: np.concatenate([r[k] for r in records]) for k in records[0]}
    summary = {k: {"median": float(np.median(v)), "p10": float(np.percentile(v, 10)), "p90": float(np.percentile(v, 90))}
               for k, v in pooled.items()}
    if args.dump is not None:  # the last launch's stamps of one CTA, relative to its first
        c = stamps[args.dump]
        t0 = c[c != 0].min()
        for wg in range(2):
            for i in range(TILES):
                if (c[wg, i] != 0).all():
                    print(f"  cta {args.dump} wg {wg} tile {2 * i + wg:2d}: " + " ".join(f"{v - t0:7d}" for v in c[wg, i]))
        w = windows.reshape(CTAS, USES, WINDOW_POINTS).astype(np.int64)[args.dump]
        for u in range(USES):
            if (w[u] != 0).all():
                print(f"  cta {args.dump} window {u:2d}: wanted {w[u, 3] - t0:7d} issued {w[u, 0] - t0:7d} "
                      f"seen {w[u, 1] - t0:7d} given back {w[u, 2] - t0:7d}")
    span = float(np.median(spans))
    start = float(np.median(starts)) if starts else float("nan")
    print(f"== {name}  {tactic.name}  {ms:.4f} ms; a CTA's first to last stamp {span:.0f} clocks "
          f"({span / (ms * 1e3):.0f} MHz if it ran the whole kernel); its start to its first tile {start:.0f} clocks; "
          "phases in SM clocks over the tiles of 5 launches")
    for k, v in summary.items():
        print(f"  {k:24s} median {v['median']:8.0f}   p10 {v['p10']:8.0f}   p90 {v['p90']:8.0f}")
    if args.out:
        atomic_write_json(args.out, {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "command": "python3 -m trtfuse.bench.wgmma_timeline "
                                     + shlex.join(sys.argv[1:] if argv is None else argv),
                                     "layer": name, "tactic": tactic.name, "ms": ms, "cta_span_clocks": span,
                                     "start_to_first_tile_clocks": start, "clocks": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
