"""One fused-conv launch per shape, for ncu: `ncu --clock-control none python3 -m trtfuse.bench.profile_one`.
Shapes: ResNet-50 res3 conv3 (+residual) at batch 1 and 256."""

from ..plugins.conv import ConvLaunch
from ..plugins.tactics import ConvShape
from .conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule

for batch in (1, 256):
    shape = ConvShape(batch, 128, 28, 28, 512, 1, 1)
    problem = ConvProblem.random(shape, True)
    out, _ = DeviceConv(problem, ConvLaunch.plan(shape)).run_checked()
    print(batch, ConvLaunch.plan(shape).tactic.name, passes_lsb_rule(compare(out, problem.golden())))
