"""Tile configurations of the fused conv kernel (the tactics a TensorRT plugin exposes) and the
heuristic that picks one per shape.

A tactic fixes the CTA tile (BM output pixels x BN output channels, 64 bytes of GEMM-K per stage),
the warp grid, the cp.async pipeline depth and the activation vector width (32: CHW32; 4: the
small-channel stem path). Each compiles to its own cubin/PTX (plugins/nvrtc.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import channel_vector, gemm_k, round_up

H100_SMS = 132  # H100 SXM and H200 both have 132 SMs


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
PERSISTENT_TWIN = {1: 11}  # the persistent tactic choose() swaps in for short-K, many-tile layers


@dataclass(frozen=True)
class ConvShape:
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    in_vec: int = 0  # input vector width; 0: the op's layout (channel_vector), 16: the space-to-depth stem

    @property
    def out_hw(self) -> tuple[int, int]:
        oh = (self.h + self.pads[0] + self.pads[2] - self.r) // self.stride[0] + 1
        ow = (self.w + self.pads[1] + self.pads[3] - self.s) // self.stride[1] + 1
        return oh, ow

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of the implicit GEMM, K padded as the kernel walks it."""
        oh, ow = self.out_hw
        return self.n * oh * ow, round_up(self.k, 32), gemm_k(self.c, (self.r, self.s), self.vec)[1]

    @property
    def vec(self) -> int:
        return self.in_vec or channel_vector(self.c)


def candidate_tactics(shape: ConvShape) -> list[Tactic]:
    return [t for t in TACTICS if t.vec == shape.vec]


def output_tiles(shape: ConvShape, tactic: Tactic) -> int:
    m, n, _ = shape.gemm
    return math.ceil(m / tactic.bm) * math.ceil(n / tactic.bn)


def choose(shape: ConvShape, sms: int = H100_SMS) -> tuple[Tactic, int]:
    """(tactic, split-K slices) for a shape, without measuring.

    Prefer the largest tile that still gives every SM at least two CTAs (large tiles re-read the
    operands least); when even the smallest tile leaves SMs idle (small batch, late stages), split
    the GEMM-K so the grid fills the GPU, keeping >= 4 k-tiles of 64 per slice. A short-K layer
    with many 128x128 tiles runs persistent (measured on the H200 at batch 256, 2026-11-21: 3-8%
    faster on every 1x1 conv with GEMM-K <= 512, slower on longer K; docs/PERF.md).
    """
    m, n, kg = shape.gemm
    cands = [t for t in candidate_tactics(shape) if t.bn <= max(64, n) and not t.persistent]
    cands.sort(key=lambda t: -(t.bm * t.bn))
    for t in cands:
        if output_tiles(shape, t) >= 2 * sms:
            twin = PERSISTENT_TWIN.get(t.id)
            if twin is not None and math.ceil(kg / 64) <= 8 and output_tiles(shape, t) >= 8 * sms:
                return TACTICS_BY_ID[twin], 1
            return t, 1
    smallest = cands[-1]
    tiles = output_tiles(shape, smallest)
    ktiles = math.ceil(kg / 64)
    splits = max(1, min(ktiles // 4, math.ceil(sms / tiles), 16))
    return smallest, splits
