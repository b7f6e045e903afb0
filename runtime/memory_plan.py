"""Where each activation of a forward lives when activations share memory by lifetime (runtime/gpu_runner.py,
share_activations): pure functions, no GPU.

A forward is a list of steps run in order on one stream; each step names the buffers it touches. A buffer is live
from the first step that touches it to the last; two buffers may take the same bytes when their lives do not
overlap. Buffers outside the steps' reach (the graph's input and output, anything written or read between forwards)
are the caller's to keep out.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from ..plugins.layout import round_up


def _rounded(sizes: dict[Hashable, int], align: int) -> dict[Hashable, int]:
    return {b: round_up(max(int(n), 1), align) for b, n in sizes.items()}


def lifetimes(steps: Sequence[Sequence[Hashable]]) -> dict[Hashable, tuple[int, int]]:
    """Each buffer's (first, last) step index from what every step touches, in step order."""
    out: dict[Hashable, tuple[int, int]] = {}
    for index, touched in enumerate(steps):
        for buf in touched:
            first, _ = out.get(buf, (index, index))
            out[buf] = (first, index)
    return out


def assign_offsets(sizes: dict[Hashable, int], lives: dict[Hashable, tuple[int, int]], align: int) -> tuple[dict[Hashable, int], int]:
    """({buffer: byte offset}, arena bytes): every buffer of `sizes` at an offset that is a multiple of `align`, no two
    buffers whose lives overlap on overlapping bytes. Largest first, each at the lowest gap left by the buffers already
    placed whose lives overlap its own (the greedy order TensorRT's and TensorFlow's planners use)."""
    if align < 1:
        raise ValueError("align must be >= 1")
    rounded = _rounded(sizes, align)
    order = sorted(rounded, key=lambda b: (-rounded[b], lives[b][0], lives[b][1], str(b)))
    offsets: dict[Hashable, int] = {}
    for buf in order:
        first, last = lives[buf]
        taken = sorted((offsets[o], offsets[o] + rounded[o]) for o in offsets
                       if lives[o][0] <= last and first <= lives[o][1])
        at = 0
        for start, end in taken:
            if at + rounded[buf] <= start:
                break
            at = max(at, end)
        offsets[buf] = at
    arena = max((offsets[b] + rounded[b] for b in offsets), default=0)
    return offsets, arena


def peak_live_bytes(sizes: dict[Hashable, int], lives: dict[Hashable, tuple[int, int]], align: int = 1) -> int:
    """The most bytes live at one step: no arena can be smaller."""
    rounded = _rounded(sizes, align)
    steps = {i for first, last in lives.values() for i in (first, last)}
    return max((sum(n for b, n in rounded.items() if lives[b][0] <= i <= lives[b][1]) for i in steps), default=0)


def describe(activation_bytes: dict) -> str | None:
    """A runner's `activation_bytes` ({"placed", "separate"}) for a summary table: "9.88 GB (40.64 GB unshared)"."""
    if not activation_bytes:
        return None
    return f"{activation_bytes['placed'] / 1e9:.2f} GB ({activation_bytes['separate'] / 1e9:.2f} GB unshared)"
