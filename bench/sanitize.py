"""Small fused-conv launches for compute-sanitizer (memcheck, racecheck): every tactic, split-K,
residual and padding paths, each checked against the golden reference.

    compute-sanitizer --tool memcheck python3 -m trtfuse.bench.sanitize
"""

import sys

from ..plugins.conv import ConvLaunch
from ..plugins.tactics import TACTICS, ConvShape
from .conv_problem import ConvProblem, DeviceConv, compare, passes_lsb_rule


def main() -> int:
    cases = []
    for t in TACTICS:
        c, in_vec = {4: (3, 0), 16: (12, 16), 32: (40, 0)}[t.vec]
        cases.append((ConvShape(1, c, 9, 7, 40, 3, 3, (2, 1), (1, 1, 1, 1), in_vec), True, t.id, 1))
        if t.persistent:  # more tiles than resident CTAs would be needed to loop; a wide shape gives several
            cases.append((ConvShape(4, c, 24, 24, 96, 1, 1, (1, 1), (0, 0, 0, 0), in_vec), True, t.id, 1))
    cases.append((ConvShape(1, 64, 5, 5, 64, 3, 3, (1, 1), (1, 1, 1, 1)), True, 4, 3))
    bad = 0
    for shape, res, tid, splits in cases:
        p = ConvProblem.random(shape, res, seed=1)
        out, _ = DeviceConv(p, ConvLaunch.plan(shape, tid, splits)).run_checked()
        stats = compare(out, p.golden())
        ok = passes_lsb_rule(stats)
        bad += not ok
        print(f"tactic {tid} splits {splits} {shape}: {'ok' if ok else 'MISMATCH'} {stats}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
