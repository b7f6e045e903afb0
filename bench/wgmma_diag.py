"""Which stage bounds the Hopper wgmma tactic? Times profiling builds of plugins/kernels/wgmma_conv.cu
(bench/probe_kernels/wgmma_profiling.cuh) against the real kernel on ResNet-50's long-K layers at batch 256 (device only):

    python3 -m trtfuse.bench.wgmma_diag [--out FILE]

  full      the tactic as shipped
  diag1     no epilogue: TMA + wgmma + ring barriers (the main loop's own rate)
  diag2     no wgmma: the copy engine's feed rate through the ring
  diag3     no copies: wgmma + barriers on stale shared memory (the tensor cores' rate as issued)
  diag4/5   as diag2 with only the weight / only the activation boxes
  diag6/7   pixel-major: no residual loads / no output stores (the epilogue's two memory streams)
  diag8/9   pixel-major: the epilogue alone (no copies, no wgmma) / its instructions alone (no memory either)
  diag10/11 no weight copies (stale weight slots: what resident weights leave) without / with the epilogue
  diag12/13 channel-major: no copies, no epilogue (wgmma + ring barriers) / nor the ring (wgmma issue alone)
  diag15    an empty launch of the tactic's shape (what a launch costs in the CUDA graph; --replace 74:diag=15)

plus ring variants (k32 steps per slot x slots). Outputs of diag builds are meaningless by design;
the `full` builds are checked against the mma.sync kernel's output (itself proven by the GPU tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
import sys
import time

from trtfuse import args as flags
from ..io import atomic_write_json
from ..plugins.conv import ConvLaunch
from ..plugins.tactics import TACTICS_BY_ID, ConvShape, choose

LAYERS = [
    ("res4 conv2 3x3 256", ConvShape(256, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res3 conv2 3x3 128", ConvShape(256, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res5 conv2 3x3 512", ConvShape(256, 512, 7, 7, 512, 3, 3, (1, 1), (1, 1, 1, 1))),
    ("res4 conv1 1x1 1024->256", ConvShape(256, 1024, 14, 14, 256, 1, 1)),
    ("res4 first conv1 1x1 512->256", ConvShape(256, 512, 28, 28, 256, 1, 1)),
    ("res5 first conv1 1x1 1024->512", ConvShape(256, 1024, 14, 14, 512, 1, 1)),
    ("res5 conv1 1x1 2048->512", ConvShape(256, 2048, 7, 7, 512, 1, 1)),
    ("res2 first conv1 1x1 64->64", ConvShape(256, 64, 56, 56, 64, 1, 1)),
    ("res2 downsample 1x1 64->256", ConvShape(256, 64, 56, 56, 256, 1, 1)),
    ("res3 downsample 1x1/2 256->512", ConvShape(256, 256, 56, 56, 512, 1, 1, (2, 2))),
    ("res4 downsample 1x1/2 512->1024", ConvShape(256, 512, 28, 28, 1024, 1, 1, (2, 2))),
    ("res5 downsample 1x1/2 1024->2048", ConvShape(256, 1024, 14, 14, 2048, 1, 1, (2, 2))),
    # res3's downsample on its input stored at stride 2 by the chain kernel before it (CudaRunner's fuse_subsample)
    ("res3 downsample on the subsampled input 1x1 256->512", ConvShape(256, 256, 28, 28, 512, 1, 1)),
    ("res3 first conv2 3x3/2 128", ConvShape(256, 128, 56, 56, 128, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res4 first conv2 3x3/2 256", ConvShape(256, 256, 28, 28, 256, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res5 first conv2 3x3/2 512", ConvShape(256, 512, 14, 14, 512, 3, 3, (2, 2), (1, 1, 1, 1))),
    ("res2 conv2 3x3 64", ConvShape(256, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1))),
]
# The residual 1x1 layers (short GEMM-K, the epilogue's share is largest): --residual
RESIDUAL_LAYERS = [
    ("res2 conv3 1x1 64->256 +res", ConvShape(256, 64, 56, 56, 256, 1, 1)),
    ("res4 conv3 1x1 256->1024 +res", ConvShape(256, 256, 14, 14, 1024, 1, 1)),
    ("res5 conv3 1x1 512->2048 +res", ConvShape(256, 512, 7, 7, 2048, 1, 1)),
    ("res3 conv3 1x1 128->512 +res", ConvShape(256, 128, 28, 28, 512, 1, 1)),
]


def variants():
    by_id = TACTICS_BY_ID
    out = [(f"full t{i}", by_id[i]) for i in (24, 26, 28, 29, 30, 31, 32, 33, 34, 35, 40, 41, 42, 43, 45, 46, 50, 52, 53, 54, 55, 56, 57, 59, 60, 61, 62, 64,
                                              65, 66, 67, 68, 69, 70, 71, 73, 74)]
    out += [(f"diag{d} t{i}", dataclasses.replace(by_id[i], diag=d)) for i in (60, 61, 64, 65, 66, 67, 68, 69, 70, 71, 74)
            for d in (1, 2, 3, 10, 11, 12, 13)]
    out += [(f"diag{d} t{i}", dataclasses.replace(by_id[i], diag=d)) for i in (70, 71, 74) for d in (7, 8, 9)]
    out += [(f"diag{d} t31", dataclasses.replace(by_id[31], diag=d)) for d in (1, 2, 3)]
    out += [("diag1 t28", dataclasses.replace(by_id[28], diag=1))]
    out += [(f"diag{d} t{i}", dataclasses.replace(by_id[i], diag=d)) for i in (40, 42, 45, 46, 50, 52) for d in (1, 3, 6, 7, 8, 9)]
    return out


def replaced_variant(spec: str):
    """'70:halo_stages=10:diag=1' -> ('t70 halo_stages=10 diag=1', tactic 70 with those integer fields replaced): an
    experiment's variant without a table entry (WgmmaTactic checks the combination)."""
    tid, *fields = spec.split(":")
    changes = {k: int(v) for k, v in (f.split("=") for f in fields)}
    try:
        return f"t{tid} " + " ".join(fields), dataclasses.replace(TACTICS_BY_ID[int(tid)], **changes)
    except AssertionError as exc:  # a combination the kernel does not take: say which rule, no traceback
        raise SystemExit(f"wgmma_diag: --replace {spec}: {exc or 'a combination WgmmaTactic refuses'}") from None


def _print_variant(label: str, v: dict) -> None:
    if "ms" in v:
        print(f"  {label:16s} {v['ms']:8.4f} ms {v['tops']:7.1f} TOPS {'' if v.get('ok') is None else ('ok' if v['ok'] else 'BAD')}")
    else:
        print(f"  {label:16s} {v}")


def main(argv=None) -> int:
    import torch

    from ..plugins import cuda_driver as cd
    from .conv_problem import POISON, ConvProblem
    from .kernels import graph_time_ms
    from .wgmma_check import TorchOperands

    ap = argparse.ArgumentParser()
    flags.out(ap)
    ap.add_argument("--residual", action="store_true", help="time the residual 1x1 layers instead")
    ap.add_argument("--only", help="comma-separated variant labels to time (e.g. 'full t42,full t43,diag3 t43')")
    ap.add_argument("--layers", help="comma-separated substrings: time only the layers whose name has one")
    ap.add_argument("--batches", help="comma-separated batch sizes to time each layer at instead of 256 (e.g. wave "
                    "quantization: '198,200,256,264')")
    flags.replace(ap, "comma-separated table tactics with fields replaced, also timed: '70:halo_stages=10:diag=1,61:halo_rows=256'")
    flags.settle(ap, 0.0, "seconds the card idles before each variant is timed: a power-bound kernel (res3 first conv2) "
                 "drops from 1980 MHz after ~100 ms of load, so without it the variant timed later runs slower "
                 "(bench/clock_probe.py)")
    args = ap.parse_args(argv)
    extra = []
    for spec in (s for s in args.replace.split(",") if s):  # a spec given twice is timed twice: 't74 pdl=1 #2'
        label, tactic = replaced_variant(spec)
        seen = sum(1 for prior, _ in extra if prior.split(" #")[0] == label)
        extra.append((f"{label} #{seen + 1}" if seen else label, tactic))
    only = set(args.only.split(",")) if args.only else None
    only = only | {label for label, _ in extra} if only is not None else None
    layers = RESIDUAL_LAYERS if args.residual else LAYERS
    if args.layers:
        layers = [(n, s) for n, s in layers if any(k in n for k in args.layers.split(","))]
    if args.batches:
        layers = [(f"{n} batch {b}", dataclasses.replace(s, n=int(b))) for n, s in layers for b in args.batches.split(",")]
    torch.cuda.init()
    cd.context()
    rows = []
    for name, shape in layers:
        problem = ConvProblem.random(shape, args.residual)
        shape = problem.shape  # its `residual` is --residual's: the tactics without residual buffers take the others
        m, _, kg = shape.gemm
        ops = TorchOperands(torch, problem)
        y, runner = ops.y, ops.launcher
        flops = 2.0 * m * shape.k * shape.c * shape.r * shape.s

        t_mma, s_mma = choose(shape)
        ref_plan = ConvLaunch(shape, t_mma, s_mma)
        runner(ref_plan)()
        torch.cuda.synchronize()
        ref = y.clone()
        rec = {"layer": name, "M": m, "N": shape.k, "K": kg,
               "mma_sync": {"tactic": t_mma.name, "ms": graph_time_ms(torch, runner(ref_plan), 10)}}
        rec["mma_sync"]["tops"] = flops / (rec["mma_sync"]["ms"] * 1e-3) / 1e12
        print(f"== {name}  M={m} N={shape.k} K={kg}")
        _print_variant("mma_sync", rec["mma_sync"])
        for label, t in variants() + extra:
            if t.geometry(shape) is None or (only and label not in only):
                continue
            if args.settle:
                torch.cuda.synchronize()
                time.sleep(args.settle)
            try:
                plan = ConvLaunch(shape, t, 1)
                ok = None
                if not t.diag:
                    y.fill_(POISON)
                    runner(plan)()
                    torch.cuda.synchronize()
                    diff = (y.int() - ref.int()).abs()
                    ok = bool((diff == 0).float().mean() >= 0.999 and int(diff.max()) <= 1)
                ms = graph_time_ms(torch, runner(plan), 10)
                rec[label] = {"ms": ms, "tops": flops / (ms * 1e-3) / 1e12, "ok": ok, "tactic": t.name}
            except Exception as exc:  # a variant outside shared memory etc.: say so, keep going
                # the message's end: a compiler's log ends with its error, the start is only the defines
                rec[label] = {"error": f"{type(exc).__name__}: ...{str(exc)[-300:]}"}
            _print_variant(label, rec[label])  # as each is timed: a run cut short still shows what it measured
        rows.append(rec)
        torch.cuda.empty_cache()
    if args.out:
        atomic_write_json(args.out, {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                     "command": "python3 -m trtfuse.bench.wgmma_diag "
                                     + shlex.join(sys.argv[1:] if argv is None else argv),
                                     "records": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
