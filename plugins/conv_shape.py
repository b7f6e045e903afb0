"""The convolution a tactic is asked to run: its shape, as the heuristic, the launchers and the tactic families see it."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import channel_vector, gemm_k, round_up

H100_SMS = 132  # H100 SXM and H200 both have 132 SMs

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
    # whether a residual may be added in the epilogue: False only where the conv is known to have none (a FusedConv
    # node), which lets the tactics that keep no residual buffers take it; True wherever it is not known
    residual: bool = True

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

