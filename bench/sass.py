"""The SASS of a compiled kernel, read for a hazard that only shows there: wgmma's accumulators touched while a wgmma
that writes them is in flight.

wgmma writes its accumulator registers asynchronously, until the `wgmma.wait_group` that ends it. ptxas (CUDA 13.0)
has scheduled reads of a block's accumulators after the next wgmma that overwrites them: the stem kernel
(plugins/kernels/stem_pool_rows.cu) then pooled the next block's values in place of its own, and only the GPU tests
showed it (docs/design/stem-pool.md). Two rules, checked on the straight-line SASS listing:

* in_flight_uses: no instruction other than a wgmma names a register of a wgmma group's accumulators between the
  group's first wgmma and the `WARPGROUP.DEPBAR` that waits for it. Holds for every kernel.
* unread_accumulators: every register of a group's accumulators is read between that wait and the next wgmma that
  writes them again. Holds for kernels whose every group overwrites its accumulators (its first k-step ignores them)
  and whose result is read in registers, such as the stem's; a GEMM main loop that accumulates across groups does not.

nvdisasm comes from the nvidia-cuda-nvdisasm wheel (the test extras) or PATH."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s*(.*?)\s*(?:/\*.*)?$")
# IGMMA.64x64x32.S8.S8 R24, ...: M 64, N 64; s32 (or f32) accumulators: N / 2 registers a thread from the first
_WGMMA = re.compile(r"^(?:@!?U?P\w+\s+)?[IH]GMMA\.(\d+)x(\d+)x\d+\S*\s+R(\d+),")
_REGISTER = re.compile(r"\bR(\d+)\b")


def nvdisasm() -> str | None:
    """The nvdisasm binary: the nvidia-cuda-nvdisasm wheel's (next to this Python), else PATH's; None if neither."""
    for root in {Path(p) for p in sys.path if p}:
        for found in sorted(root.glob("nvidia/cu*/bin/nvdisasm")):
            return str(found)
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes, tool: str | None = None) -> list[str]:
    """The instructions of a cubin, one string each, in listing order (offsets and comments dropped)."""
    tool = tool or nvdisasm()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        listing = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return [m.group(1) for m in map(_INSTRUCTION.match, listing.splitlines()) if m and m.group(1)]


@dataclass(frozen=True)
class WgmmaGroup:
    first: int  # index of the group's first wgmma
    wait: int  # index of the WARPGROUP.DEPBAR after it (len(lines) if none)
    low: int  # first accumulator register
    count: int  # accumulator registers a thread

    def holds(self, register: int) -> bool:
        return self.low <= register < self.low + self.count


def wgmma_groups(lines: list[str]) -> list[WgmmaGroup]:
    """The wgmma groups of a listing: consecutive wgmma into the same accumulators up to the next wait."""
    groups, i = [], 0
    while i < len(lines):
        m = _WGMMA.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and "WARPGROUP.DEPBAR" not in lines[j]:
            j += 1
        groups.append(WgmmaGroup(i, j, int(m.group(3)), int(m.group(2)) // 2))
        i = j + 1
    return groups


_GUARD = re.compile(r"^@!?U?P\w+\s+")
_NO_DESTINATION = ("ST", "RED", "ATOM", "BRA", "BAR", "SYNCS", "WARPSYNC", "EXIT", "RET")


def _registers(instruction: str, sources_only: bool = False) -> set[int]:
    """The registers an instruction names (R22.64 counts as R22); sources_only: less its destination (the first
    operand of an instruction that writes one)."""
    body = _GUARD.sub("", instruction).rstrip(" ;")
    opcode, _, operands = body.partition(" ")
    if sources_only and not opcode.startswith(_NO_DESTINATION):
        operands = operands.split(",", 1)[1] if "," in operands else ""
    return {int(r) for r in _REGISTER.findall(operands)}


def in_flight_uses(lines: list[str]) -> list[str]:
    """'first wgmma | instruction' for each instruction that names a register of a group's accumulators while the
    group is in flight (between its first wgmma and its wait). Empty for a sound kernel."""
    found = []
    for g in wgmma_groups(lines):
        for k in range(g.first + 1, g.wait):
            if not _WGMMA.match(lines[k]) and any(g.holds(r) for r in _registers(lines[k])):
                found.append(f"{lines[g.first]} | {lines[k]}")
    return found


def unread_accumulators(lines: list[str]) -> list[str]:
    """'first wgmma: n of N read' for each group of which some accumulator register is not read between its wait and
    the next group that writes any of its registers (or the end of the listing)."""
    groups, found = wgmma_groups(lines), []
    for n, g in enumerate(groups):
        end = next((h.first for h in groups[n + 1:] if h.low < g.low + g.count and g.low < h.low + h.count), len(lines))
        read = set()
        for instruction in lines[g.wait + 1:end]:
            if not _WGMMA.match(instruction):
                read |= {r for r in _registers(instruction, sources_only=True) if g.holds(r)}
        if len(read) < g.count:
            found.append(f"{lines[g.first]}: {len(read)} of {g.count} read")
    return found
