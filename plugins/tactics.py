"""Tile configurations of the fused conv kernel (the tactics a TensorRT plugin exposes) and the
heuristic that picks one per shape.

A tactic fixes the CTA tile (BM output pixels x BN output channels, 64 bytes of GEMM-K per stage),
the warp grid, the cp.async pipeline depth and the activation vector width (32: CHW32; 4: the
small-channel stem path). Each compiles to its own cubin/PTX (plugins/nvrtc.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .conv_shape import H100_SMS, ConvShape
from .layout import gemm_k
from .wgmma_tactics import (  # noqa: F401  (the Hopper family, re-exported: one table of tactic ids)
    WGMMA_S8_WIDTHS, WGMMA_TACTICS, WgmmaGeometry, WgmmaTactic, choose_wgmma, has_wgmma, wgmma_cost, wgmma_enabled)


@dataclass(frozen=True)
class Tactic:
    id: int  # TensorRT tactic ids are positive ints
    bm: int
    bn: int
    wm: int
    wn: int
    stages: int
    vec: int
    min_blocks: int = 1  # CTAs per SM the register budget must allow (__launch_bounds__)
    # Persistent: a grid of only the CTAs that fit at once, each looping over output tiles and issuing
    # the next tile's loads before this tile's epilogue (short-K layers are otherwise a serial chain of
    # load -> MMA -> epilogue -> store per CTA). Costs a second staging tile of shared memory.
    persistent: bool = False
    family: ClassVar[str] = "mma"  # "mma": fused_conv.cu (mma.sync, sm_80+); "wgmma": wgmma_tactics.WgmmaTactic (sm_90a)

    @property
    def threads(self) -> int:
        return self.wm * self.wn * 32

    @property
    def name(self) -> str:
        return (f"t{self.id}_{self.bm}x{self.bn}_w{self.wm}x{self.wn}_s{self.stages}_v{self.vec}_b{self.min_blocks}"
                + ("_p" if self.persistent else ""))

    def defines(self) -> dict[str, int]:
        return {"TF_BM": self.bm, "TF_BN": self.bn, "TF_WM": self.wm, "TF_WN": self.wn,
                "TF_STAGES": self.stages, "TF_VEC": self.vec, "TF_MINB": self.min_blocks,
                "TF_PERSISTENT": int(self.persistent)}

    def shared_bytes(self, in_channels: int, kernel_shape) -> int:
        """Dynamic shared memory: pipeline ring + output/residual staging tile + tap table."""
        _, kg_pad = gemm_k(in_channels, kernel_shape, self.vec)
        ktiles = math.ceil(kg_pad / 64)
        taps = ktiles * 64 // self.vec
        staging = 2 if self.persistent else 1
        return self.stages * (self.bm + self.bn) * 64 + staging * self.bm * (self.bn + 16) + taps * 16


TACTICS: tuple[Tactic, ...] = (
    Tactic(1, 128, 128, 2, 4, 4, 32, 2),
    Tactic(2, 128, 64, 2, 2, 4, 32, 2),
    Tactic(3, 64, 128, 2, 2, 4, 32, 2),
    Tactic(4, 64, 64, 2, 2, 4, 32, 3),
    Tactic(5, 128, 128, 2, 4, 3, 32, 1),
    # Short GEMM-K (most 1x1 convs: 2..8 k-tiles) needs no deep ring; less shared memory, more CTAs.
    Tactic(8, 128, 128, 2, 4, 2, 32, 2),
    Tactic(9, 64, 64, 2, 2, 2, 32, 4),
    Tactic(6, 128, 64, 2, 2, 4, 4, 2),
    Tactic(7, 64, 64, 2, 2, 4, 4, 3),
    # CHW16: the space-to-depth stem (plugins/stem.py), 16-byte gathers instead of CHW4's 4-byte ones.
    Tactic(15, 128, 64, 2, 2, 4, 16, 2),
    Tactic(16, 64, 64, 2, 2, 4, 16, 3),
    Tactic(17, 128, 64, 2, 2, 3, 16, 2, persistent=True),
    # Persistent variants for the short-K, many-tile layers (res2-res5 1x1 convs at large batch).
    Tactic(10, 128, 128, 2, 4, 2, 32, 2, persistent=True),
    Tactic(11, 128, 128, 2, 4, 3, 32, 2, persistent=True),
    Tactic(12, 128, 64, 2, 2, 3, 32, 2, persistent=True),
    Tactic(13, 64, 128, 2, 2, 3, 32, 2, persistent=True),
    Tactic(14, 64, 64, 2, 2, 3, 32, 4, persistent=True),
)
TACTICS_BY_ID = {t.id: t for t in TACTICS}
assert not set(TACTICS_BY_ID) & {t.id for t in WGMMA_TACTICS}, "tactic ids are unique across families"
TACTICS_BY_ID.update({t.id: t for t in WGMMA_TACTICS})
# The persistent tactics choose() swaps in for short-K, many-tile layers: (2-stage for <= 2 k-tiles,
# 3-stage otherwise), as autotune picked them on the H200 at batch 256 (bench/results/kernels-*.json).
PERSISTENT_TWIN = {1: (10, 11)}


def candidate_tactics(shape: ConvShape, arch: str | None = None) -> list[Tactic]:
    """Tactics that can run `shape`; the Hopper ones only where wgmma_enabled(arch)."""
    return [t for t in TACTICS if t.vec == shape.vec] + [t for t in WGMMA_TACTICS if wgmma_enabled(arch) and t.geometry(shape)]


def output_tiles(shape: ConvShape, tactic: Tactic) -> int:
    m, n, _ = shape.gemm
    return math.ceil(m / tactic.bm) * math.ceil(n / tactic.bn)


def choose(shape: ConvShape, sms: int = H100_SMS, arch: str | None = None) -> tuple[Tactic, int]:
    """(tactic, split-K slices) for a shape, without measuring.

    On Hopper (`arch` "sm_90") with the wgmma tactics enabled (wgmma_enabled), the long-K shapes take
    one (choose_wgmma).
    Otherwise prefer the largest tile that still gives every SM at least two CTAs (large tiles re-read the
    operands least); when even the smallest tile leaves SMs idle (small batch, late stages), split
    the GEMM-K so the grid fills the GPU, keeping >= 4 k-tiles of 64 per slice. A short-K layer
    with many 128x128 tiles runs persistent (measured on the H200 at batch 256, 2026-11-21: 3-8%
    faster on every 1x1 conv with GEMM-K <= 512, slower on longer K; docs/PERF.md).
    """
    if wgmma_enabled(arch):
        w = choose_wgmma(shape, sms)
        if w is not None:
            return w, 1
    m, n, kg = shape.gemm
    cands = [t for t in candidate_tactics(shape) if t.bn <= max(64, n) and not t.persistent]
    cands.sort(key=lambda t: -(t.bm * t.bn))
    for t in cands:
        if output_tiles(shape, t) >= 2 * sms:
            twin = PERSISTENT_TWIN.get(t.id)
            ktiles = math.ceil(kg / 64)
            if twin is not None and ktiles <= 8 and output_tiles(shape, t) >= 8 * sms:
                return TACTICS_BY_ID[twin[0] if ktiles <= 2 else twin[1]], 1
            return t, 1
    smallest = cands[-1]
    tiles = output_tiles(shape, smallest)
    ktiles = math.ceil(kg / 64)
    splits = max(1, min(ktiles // 4, math.ceil(sms / tiles), 16))
    return smallest, splits
