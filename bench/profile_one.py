"""One fused-conv launch per (shape, tactic), for ncu:

    ncu --clock-control none --section ... python3 -m trtfuse.bench.profile_one [TACTIC_ID ...]

Shapes: ResNet-50 res3 conv3 (1x1 128->512 + residual, the memory-bound target layer), res4 conv2
(3x3 256, compute-bound), res4 conv3 (1x1 256->1024 + residual, short K on the wgmma tactic) and res3 first conv2
(3x3 stride 2, 128 channels: the stride-2 window tile's layer) at batch 256; each with the heuristic's tactic and every tactic id given. A non-numeric argument keeps only the shapes
whose label contains it (e.g. `res3`). ID:D profiles the wgmma tactic's profiling build D (its `diag`, e.g. `42:9`;
its output is meaningless by design and not checked)."""

import dataclasses
import sys

from ..plugins.conv import ConvLaunch
from ..plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS, ConvShape
from .conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule

SHAPES = {"res3 conv3 b256": (ConvShape(256, 128, 28, 28, 512, 1, 1), True),
          "res4 conv2 b256": (ConvShape(256, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1)), False),
          "res4 conv3 b256": (ConvShape(256, 256, 14, 14, 1024, 1, 1), True),
          "res3 first conv2 b256": (ConvShape(256, 128, 56, 56, 128, 3, 3, (2, 2), (1, 1, 1, 1)), False)}
ALL = {**TACTICS_BY_ID, **{t.id: t for t in WGMMA_TACTICS}}

def _tactic_arg(arg: str):
    tid, _, diag = arg.partition(":")
    return dataclasses.replace(ALL[int(tid)], diag=int(diag)) if diag else ALL[int(tid)]


ids = [_tactic_arg(a) for a in sys.argv[1:] if a.replace(":", "").isdigit()]
keep = [a for a in sys.argv[1:] if not a.replace(":", "").isdigit()]
for label, (shape, res) in SHAPES.items():
    if keep and not any(k in label for k in keep):
        continue
    problem = ConvProblem.random(shape, res)
    for tactic in [None] + ids:
        if tactic is not None and tactic.family == "mma" and tactic.vec != shape.vec:
            continue
        if tactic is not None and tactic.family == "wgmma" and tactic.geometry(shape) is None:
            continue  # a tactic given for another shape (e.g. a window tile on a 1x1 layer)
        plan = ConvLaunch.plan(shape) if tactic is None else ConvLaunch(shape, tactic, 1)
        out, _ = DeviceConv(problem, plan).run_checked()
        diag = getattr(plan.tactic, "diag", 0)
        print(label, plan.tactic.name, "diag build, not checked" if diag else passes_lsb_rule(compare(out, problem.golden())))
