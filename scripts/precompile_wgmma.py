"""Compile wgmma tactic variants into the NVRTC disk cache in parallel, before a device run times or tests them
(each sm_90a variant takes NVRTC a minute or two; one process per variant uses the device machine's cores):

    python3 scripts/precompile_wgmma.py 74 75 65:diag=2 70:halo_stages=10:diag=1

A spec is a table tactic id, optionally with integer fields replaced as in bench/wgmma_diag.py's --replace.
"""

import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from trtfuse.plugins.nvrtc import compile_kernel
from trtfuse.plugins.tactics import TACTICS_BY_ID
from trtfuse.plugins.wgmma import ARCH, SOURCE


def tactic_of(spec: str):
    tid, *fields = spec.split(":")
    return dataclasses.replace(TACTICS_BY_ID[int(tid)], **{k: int(v) for k, v in (f.split("=") for f in fields)})


def build(spec: str) -> str:
    t0 = time.time()
    tactic = tactic_of(spec)
    spills = compile_kernel(SOURCE, tactic.defines(), ARCH, "cubin").spills()
    return f"{spec:28s} {tactic.name} {time.time() - t0:.0f}s spills={spills}"


def main(specs: list[str]) -> int:
    if not specs:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with ProcessPoolExecutor(max_workers=min(len(specs), 16)) as pool:
        for line in pool.map(build, specs):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
