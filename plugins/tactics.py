"""Tile configurations of the fused conv kernel (the tactics a TensorRT plugin exposes) and the
heuristic that picks one per shape.

A tactic fixes the CTA tile (BM output pixels x BN output channels, 64 bytes of GEMM-K per stage),
the warp grid, the cp.async pipeline depth and the activation vector width (32: CHW32; 4: the
small-channel stem path). Each compiles to its own cubin/PTX (plugins/nvrtc.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import ClassVar

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
    family: ClassVar[str] = "mma"  # "mma": fused_conv.cu (mma.sync, sm_80+); "wgmma": WgmmaTactic below (sm_90a)

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
# The persistent tactics choose() swaps in for short-K, many-tile layers: (2-stage for <= 2 k-tiles,
# 3-stage otherwise), as autotune picked them on the H200 at batch 256 (bench/results/kernels-*.json).
PERSISTENT_TWIN = {1: (10, 11)}


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


# ---------------------------------------------------------------------------------------------------
# Hopper tactics: plugins/kernels/wgmma_conv.cu (wgmma + TMA, sm_90a), launched by plugins/wgmma.py.


def has_wgmma(arch: str | None) -> bool:
    return arch is not None and arch.startswith("sm_90")


def wgmma_enabled(arch: str | None) -> bool:
    """Whether the heuristic and autotune may pick a wgmma tactic: the GPU has wgmma, unless the
    environment says TRTFUSE_WGMMA=0 (on by default since the 128-byte weight boxes and multicast made it
    win on the long-K layers, docs/wgmma.md); explicit tactic ids (ConvLaunch.plan(shape, 22)) work
    regardless."""
    return has_wgmma(arch) and os.environ.get("TRTFUSE_WGMMA", "1") != "0"


@dataclass(frozen=True)
class WgmmaGeometry:
    """How a shape is cut into CTA tiles (mirrors trtfuse::WgmmaTile)."""

    th: int  # output rows per pixel tile (= OH when nb > 1)
    nb: int  # images per pixel tile
    tiles_per_image: int
    ch_tiles: int  # channel tiles of the tactic's CHANNELS (128, or 64 / 256)
    kt: int  # k32 steps (CB * R * S)
    box_bytes: int  # bytes of one activation TMA box: nb * th * OW * 32 (halo: the window, (th + R - 1) * WH * 32; flat: a k32 step's boxes, bm * 32)
    pix_tiles: int
    groups_per_image: int = 0  # flat tiles: 8-pixel groups per image, OH * OW / 8
    box_groups: int = 0  # flat tiles: groups per activation box
    pitch: int = 0  # window tiles: window columns per image, W + max(pad_left, pad_right)

    @property
    def ctas(self) -> int:
        return self.pix_tiles * self.ch_tiles

    @property
    def wh(self) -> int:
        """Window tiles: the window's width, nb images of `pitch` columns (tile position n = oh * wh + image * pitch + ow)."""
        return self.nb * self.pitch


WGMMA_S8_WIDTHS = (64, 96, 112, 128, 160, 176, 192, 208, 224, 256)  # the wgmma N widths plugins/kernels/wgmma_s8.cuh instantiates


@dataclass(frozen=True)
class WgmmaTactic(Tactic):
    """A wgmma tile: `bm` = pixel capacity of a tile, `bn` = its output channels, `stages` = TMA ring
    slots of `ks` k32 steps each; 128 threads per consumer warpgroup plus a producer warpgroup.
    Channel-major (the default): channels on wgmma's M (bn = 128, two consumer warpgroups x m64), pixels
    on its N (bm). Pixel-major (`pixel_major`): pixels on M (bm = 64 or 128: one or two warpgroups x m64
    per tile), channels on N (bn = 128 or 256), the epilogue writing straight from registers (WG_PIXM in
    wgmma_conv.cu); `consumers` warpgroups (2 or 4) take the CTA's tiles in groups of bm / 64, and with
    `resident_kt` the channel tile's whole weight (GEMM-K up to resident_kt k32 steps) stays in shared
    memory (WG_WRES_KT). Channel-major with `halo_rows` (WG_HALO, stride-1 convs): one input window per
    32-channel block in a ring of `halo_stages` slots of `halo_rows` 32-byte rows, each tap's operand a
    shifted view of it; a tile is TH output rows of one image, or NB whole images side by side, whose positions
    oh * WH + i * pitch + ow fill the wgmma N (_window_tiles).
    Channel-major ping-pong (`pingpong` with bn = 64, windows, `resident_kt`): each consumer warpgroup a 64-channel
    window tile of its own, the CTA's channel tile's weight resident, the two taking the tensor cores in turn."""

    ks: int = 2
    persistent: bool = False  # min(tiles, SMs) CTAs walk the tiles; the producer runs ahead across tiles
    multicast: bool = False  # clusters of 2 CTAs on a pixel tile's two channel tiles share the activation boxes (WG_MCAST)
    a_box: int = 32  # bytes of GEMM-K per weight box row: 32 (one k32 step) or 128 (a slot's 4 steps, 128-byte swizzle)
    staging: int = 1  # staging tiles (WG_STAGING): 2 lets the next tile's residual stream in while the last output waits
    pixel_major: bool = False  # pixels on wgmma's M, channels on its N (WG_PIXM): no staging tile, residual by TMA
    consumers: int = 2  # consumer warpgroups (WG_CONSUMERS); 4 only pixel-major
    resident_kt: int = 0  # k32 steps of weight held resident in shared memory (WG_WRES_KT), 0: in every slot
    # two tile groups take the tensor cores in turn (WG_PINGPONG): pixel-major, or channel-major with bn = 64 (each
    # consumer warpgroup a tile of its own, resident weights, windows)
    pingpong: bool = False
    halo_rows: int = 0  # > 0: one input window per 32-channel block, each tap a shifted view of it (WG_HALO; slot rows)
    halo_stages: int = 3  # window ring slots (WG_HALO_STAGES)
    flat: bool = False  # pixel-major, 1x1 stride-1 unpadded convs, OH * OW % 8 == 0: tiles of bm consecutive pixels (WG_FLAT)
    # windows of 3x3 stride-2 convs (WG_S2WIN): a window row is a pair of input columns, 64 bytes, so halo_rows counts
    # 64-byte rows; both row phases of TH + 1 pair rows land in one box (_stride2_window_tiles)
    stride2_windows: bool = False
    # ... of 128-byte rows (column quads, WG_S2WIN 2; one image per tile, window batches): the tile's positions split by
    # output column parity, two wgmmas of N / 2 per tap, half the window rows of the pairs
    quad_windows: bool = False
    pp_inflight: int = 3  # channel-major ping-pong: wgmma batches left in flight (WG_PP_INFLIGHT); holds up to pp_inflight + 1 windows
    # channel-major window tiles without ping-pong: the output leaves by TMA store from a [block][position][32] staging
    # tile, the weight rows permuted in pairs as the ping-pong tile's (WG_TMA_OUT; the ping-pong tile always does)
    tma_store: bool = False
    window_warp: bool = False  # window tiles streaming weights: a second producer thread issues the windows (WG_WINDOW_WARP)
    # channel-major ping-pong on 3x3 windows: one wgmma batch per window (9 taps), each window released as soon as its
    # batch is done, early when the next has not landed (WG_WIN_BATCH)
    window_batches: bool = False
    # stride-2 window batches: the batch issues this many taps, then waits for the previous batch and gives its window
    # back, then issues the rest (WG_EARLY_RELEASE; 0: the whole batch first)
    early_release: int = 0
    # programmatic dependent launch (WG_PDL): launched so that it may start while the previous grid in the stream runs;
    # the CTA's setup and resident weight overlap that grid's last tiles (persistent grids: every CTA is resident).
    # When the CTA lets the next grid launch: 1 at its start, 2 never (at its exit), 3 once its last window is issued
    pdl: int = 0
    diag: int = 0  # profiling builds only (WG_DIAG in wgmma_conv.cu, bench/wgmma_diag.py); never in the table
    timeline: int = 0  # profiling only: the ping-pong consumers stamp the SM clock per tile (WG_TIMELINE, bench/wgmma_timeline.py)
    family: ClassVar[str] = "wgmma"

    def __post_init__(self):
        if self.pixel_major:
            assert self.bm in (64, 128) and self.bn in (128, 256) and self.a_box == 128 and self.ks == 4
            assert self.persistent and not self.multicast, "pixel-major tiles are persistent, without clusters"
            assert self.consumers in (2, 4) and self.consumers % (self.bm // 64) == 0
            assert self.bn * self.consumers <= 512, "accumulators: bn / 2 registers per consumer thread"
            assert self.resident_kt % 4 == 0
            assert not self.pingpong or self.tile_groups == 2, "ping-pong alternates two tile groups"
            assert not self.halo_rows, "window tiles (WG_HALO) are channel-major"
        else:
            assert self.bm in WGMMA_S8_WIDTHS, "the wgmma N of s8: 8, 16, 24, then multiples of 16 up to 256"
            assert not self.halo_rows or (self.a_box == 128 and self.ks == 4 and not self.multicast and self.bm <= self.halo_rows)
            assert not self.stride2_windows or self.halo_rows, "stride-2 windows are windows"
            assert not self.quad_windows or (self.stride2_windows and self.window_batches and self.bm // 2 in WGMMA_S8_WIDTHS), \
                "quads: stride-2 window batches, two wgmmas of N / 2 per tap"
            assert not self.tma_store or (self.halo_rows and not self.pingpong), "TMA stores: the window tiles without ping-pong"
            assert not self.window_warp or (self.halo_rows and not self.pingpong), \
                "a window thread: the window tiles whose weights stream through the ring (the ping-pong tile's producer issues windows only)"
            if self.pingpong:  # each consumer warpgroup a 64-channel tile of its own, the weight resident, windows
                assert self.bn == 64 and self.consumers == 2 and self.resident_kt % 4 == 0 and self.resident_kt > 0
                assert self.halo_rows and self.persistent and self.staging == 2, "channel-major ping-pong: windows, persistent, a staging tile per warpgroup"
                assert 1 <= self.pp_inflight and self.halo_stages >= self.pp_inflight + 1, \
                    "k wgmma batches in flight hold up to k + 1 windows (WG_PP_INFLIGHT)"
            else:
                assert self.bn == 128 and self.consumers == 2 and self.resident_kt == 0, "channel-major tiles are two warpgroups x m64 channels"
            assert not self.flat, "flat tiles are pixel-major"
        assert not self.timeline or (self.pingpong and not self.pixel_major), "the timeline build is the channel-major ping-pong's"
        assert not self.window_batches or (self.pingpong and not self.pixel_major), "window batches: the channel-major ping-pong's"
        assert 0 <= self.early_release < 9 and (not self.early_release or (self.window_batches and self.stride2_windows)), \
            "early release: taps of a stride-2 window batch"
        assert self.pdl in (0, 1, 2, 3) and (not self.pdl or self.persistent), "an early-launched grid's CTAs wait on SMs: only persistent grids, all resident"

    @property
    def CHANNELS(self) -> int:  # output channels per CTA tile
        return self.bn

    @property
    def tile_groups(self) -> int:
        """Pixel-major: tile groups a CTA's consumer warpgroups form, bm / 64 warpgroups each (WgmmaSmem::GROUPS)."""
        return self.consumers // (self.bm // 64)

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def name(self) -> str:
        return (f"w{self.id}_wgmma_p{self.bm}xc{self.bn}_k{self.ks}_s{self.stages}{'_a128' if self.a_box == 128 else ''}"
                f"{'_mc' if self.multicast else ''}{'_pers' if self.persistent else ''}{'_st2' if self.staging == 2 else ''}{'_pm' if self.pixel_major else ''}"
                f"{f'_c{self.consumers}' if self.consumers != 2 else ''}{f'_wr{self.resident_kt}' if self.resident_kt else ''}{'_pp' if self.pingpong else ''}"
                f"{f'_halo{self.halo_stages}' if self.halo_rows else ''}{('_s2q' if self.quad_windows else '_s2') if self.stride2_windows else ''}{'_flat' if self.flat else ''}"
                f"{f'_if{self.pp_inflight}' if self.pp_inflight != 3 else ''}{'_tmaout' if self.tma_store else ''}{'_ww' if self.window_warp else ''}{'_wb' if self.window_batches else ''}{f'_er{self.early_release}' if self.early_release else ''}{f'_pdl{self.pdl}' if self.pdl else ''}"
                + (f"_diag{self.diag}" if self.diag else "") + ("_timeline" if self.timeline else ""))

    # on/off fields and the wgmma_conv.cu macro each sets to 1
    _SWITCHES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("multicast", "WG_MCAST"), ("pixel_major", "WG_PIXM"), ("flat", "WG_FLAT"), ("pingpong", "WG_PINGPONG"),
        ("stride2_windows", "WG_S2WIN"), ("tma_store", "WG_TMA_OUT"),
        ("window_warp", "WG_WINDOW_WARP"), ("window_batches", "WG_WIN_BATCH"))

    def defines(self) -> dict[str, int]:
        d = {"WG_BN": self.bm, "WG_STAGES": self.stages, "WG_KS": self.ks, "WG_PERSISTENT": int(self.persistent)}
        d.update({macro: 1 for field, macro in self._SWITCHES if getattr(self, field)})
        if self.a_box == 128:
            d["WG_A128"] = 1
        if self.staging != 1:
            d["WG_STAGING"] = self.staging
        if self.pdl:
            d["WG_PDL"] = self.pdl
        if self.early_release:
            d["WG_EARLY_RELEASE"] = self.early_release
        if self.quad_windows:
            d["WG_S2WIN"] = 2
        if self.pixel_major and self.consumers != 2:
            d["WG_CONSUMERS"] = self.consumers
        if self.pixel_major or self.bn != 128:
            d["WG_CH"] = self.bn
        if self.resident_kt:
            d["WG_WRES_KT"] = self.resident_kt
        if self.halo_rows:
            d.update(WG_HALO=1, WG_HALO_ROWS=self.halo_rows, WG_HALO_STAGES=self.halo_stages)
        if self.pp_inflight != 3:
            d["WG_PP_INFLIGHT"] = self.pp_inflight
        if self.diag:
            d["WG_DIAG"] = self.diag
        if self.timeline:
            d["WG_TIMELINE"] = 1
        return d

    @property
    def stores_by_tma(self) -> bool:
        """Channel-major tiles whose output leaves by TMA store and whose weight rows are permuted in pairs (kTmaOut in
        wgmma_conv.cu): the ping-pong tiles and the `tma_store` window tiles."""
        return not self.pixel_major and (self.pingpong or self.tma_store)

    @property
    def window_row_bytes(self) -> int:
        """Bytes of one window row: a CHW32 vector (32), or with stride-2 windows a pair (64) or quad (128) of them."""
        return 128 if self.quad_windows else 64 if self.stride2_windows else 32

    @property
    def halo_slot_bytes(self) -> int:
        """One window slot: halo_rows window rows, 1024-byte aligned (WgmmaSmem::HALO_SLOT)."""
        return round_up(self.halo_rows * self.window_row_bytes, 1024) if self.halo_rows else 0

    def shared_bytes(self, in_channels: int = 0, kernel_shape=None) -> int:
        """Operand ring + staging tiles [pixels][channels + 16] (tiles that store by TMA: [block][pixels][32];
        pixel-major: resident weights, two residual buffers of every consumer warp's 16 pixels x channels and each
        tile group's folded factors) + mbarriers + 1024 for aligning the ring (WgmmaSmem in wgmma_conv.cu)."""
        bars = 8 * (2 * self.stages + 1)
        if self.pixel_major:
            weights_in_slot = 0 if self.resident_kt else self.CHANNELS
            ring = self.stages * self.ks * 32 * (weights_in_slot + self.bm) + self.resident_kt * 32 * self.CHANNELS
            return ring + 2 * self.consumers * 64 * self.bn + self.tile_groups * 8 * self.bn + bars + 1024
        if self.halo_rows:  # weight slots carry weights only (or resident weights), the windows have their ring and barriers
            weights = self.resident_kt * 32 * self.CHANNELS if self.resident_kt else self.stages * self.ks * 32 * self.CHANNELS
            ring = weights + self.halo_stages * self.halo_slot_bytes
            bars += 16 * self.halo_stages
        else:
            ring = self.stages * self.ks * 32 * (self.CHANNELS + self.bm)
        # staging rows of CHANNELS + 16 bytes; the TMA-stored tiles' are [block][position][32], unpadded
        staging_row = self.CHANNELS if self.stores_by_tma else self.CHANNELS + 16
        return ring + self.staging * self.bm * staging_row + bars + 1024

    def geometry(self, shape: ConvShape) -> WgmmaGeometry | None:
        """Pixel tiles of TH full output rows (or NB whole images) whose TMA box fits the tile (or, for a
        window tactic, whose window does: _window_tiles); None when the shape is outside what the kernel
        handles (CHW4 input, boxes over 256, strides over 8)."""
        if shape.vec != 32:
            return None
        groups_per_image = box_groups = 0
        if self.flat:
            # the output's linear pixel index is the input's (1x1, stride 1, unpadded) and comes in 8-pixel groups
            if (shape.r, shape.s, shape.stride, shape.pads) != (1, 1, (1, 1), (0, 0, 0, 0)) or shape.h * shape.w % 8:
                return None
            groups_per_image = shape.h * shape.w // 8
            box_groups = min(groups_per_image & -groups_per_image, self.bm // 8)  # a power of two dividing both
            tiles = 1, 1, 1, self.bm * 32, math.ceil(shape.n * shape.h * shape.w / self.bm), 0
        else:
            tiles = (self._stride2_window_tiles(shape) if self.stride2_windows else self._window_tiles(shape) if self.halo_rows
                     else self._row_tiles(shape))
        if tiles is None:
            return None
        th, nb, tpi, box_bytes, pix_tiles, pitch = tiles
        kt = math.ceil(shape.c / 32) * shape.r * shape.s
        if self.resident_kt and kt > self.resident_kt:
            return None  # the channel tile's weight does not fit the resident buffer
        if self.window_batches and shape.r * shape.s != 9:
            return None  # a batch is one window's 9 taps (WG_WIN_BATCH)
        ch_tiles = math.ceil(round_up(shape.k, 32) / self.CHANNELS)
        if self.multicast and ch_tiles % 2:
            return None  # a cluster pairs a pixel tile's channel tiles
        return WgmmaGeometry(th, nb, tpi, ch_tiles, kt, box_bytes, pix_tiles, groups_per_image, box_groups, pitch)

    def _row_tiles(self, shape: ConvShape):
        """(TH, NB, tiles per image, box bytes, pixel tiles, 0 (no window pitch)): TH full output rows of one image,
        balanced, or NB whole images (TH = OH), each one activation box per k32 step."""
        oh, ow = shape.out_hw
        sh, sw = shape.stride
        if sh > 8 or sw > 8 or ow * sw > 256 or ow > self.bm:
            return None
        if oh * ow <= self.bm:
            nb, th = min(self.bm // (oh * ow), shape.n, 256), oh
            if th * sh > 256:
                return None
            return th, nb, 1, nb * th * ow * 32, math.ceil(shape.n / nb), 0
        th_max = min(self.bm // ow, 256 // sh)
        tpi = math.ceil(oh / th_max)
        th = math.ceil(oh / tpi)
        return th, 1, tpi, th * ow * 32, shape.n * tpi, 0

    def _window_tiles(self, shape: ConvShape):
        """WG_HALO: (TH, NB, tiles per image, box bytes, pixel tiles, pitch). The window holds TH + R - 1 input
        rows of NB images side by side, each image `pitch` = W + max(pad_left, pad_right) columns from -pad_left,
        so a window row is WH = NB * pitch columns; tile position n = oh * WH + i * pitch + ow is output pixel (oh, ow)
        of image i, and tap (r, s) reads window row n + r * WH + s. A read past an image's columns (ow + s >= pitch)
        lands on the next image's, or the next row's, first columns: its left padding, zeros, which is what the
        right padding holds (pad_right <= pitch - W). So one padding column serves both sides, and small maps fill
        the wgmma N with several images (7 x 7: 4 images, 196 pixels in 224 positions). Tiles are TH output rows
        of one image or (TH = OH) NB whole images whose last position, (TH - 1) * WH + (NB - 1) * pitch + OW - 1,
        fits the wgmma N, and every tap's view (up to (R - 1) * WH + S - 1 rows further) fits the slot. Stride 1
        only (a strided conv's taps are not shifts of one window), and R * S >= 4 (the window ring's hand-back lags
        one 4-step batch behind; 1x1 convs gain nothing from windows)."""
        oh, ow = shape.out_hw
        pitch = shape.w + max(shape.pads[1], shape.pads[3])
        if shape.stride != (1, 1) or shape.r * shape.s < 4 or ow > self.bm or pitch > 256:
            return None

        def positions(th: int, nb: int) -> int:
            return (th - 1) * nb * pitch + (nb - 1) * pitch + ow

        if positions(oh, 1) <= self.bm:
            nb = 1
            while nb < min(shape.n, 256) and positions(oh, nb + 1) <= self.bm:
                nb += 1
            th, tpi, pix_tiles = oh, 1, math.ceil(shape.n / nb)
        else:
            nb = 1
            th_max = min((self.bm - ow) // pitch + 1, 257 - shape.r)  # window rows TH + R - 1 <= 256 (box limit)
            tpi = math.ceil(oh / th_max)
            th, pix_tiles = math.ceil(oh / tpi), shape.n * tpi
        wh = nb * pitch
        if self.bm + (shape.r - 1) * wh + shape.s - 1 > self.halo_rows:
            return None
        if nb * th * ow * 2 < self.bm:
            return None  # under half the tile's positions would be pixels: the row-box tiles do better
        return th, nb, tpi, (th + shape.r - 1) * wh * 32, pix_tiles, pitch

    def _stride2_window_tiles(self, shape: ConvShape):
        """WG_S2WIN: (TH, NB, tiles per image, box bytes, pixel tiles, pitch) for a 3x3 stride-2 conv padded by 1 on an
        even map. Output pixel (oh, ow)'s taps read input rows 2oh - 1 + r and columns 2ow - 1 + s. Seen as pairs of
        columns (64 bytes: columns 2j, 2j + 1), tap s of column ow reads the 32 bytes at (1 + s) * 32 of pair row ow
        when pairs start at -1 (columns 2ow - 1 + s are consecutive 32-byte vectors), so with rows of pitch = OW + 1
        pairs, tile position n = oh * pitch + ow reads byte n * 64 + (1 + s) * 32 of tap row r's window: one descriptor
        per tap with 64-byte rows, like the stride-1 windows' shifted views, each input pixel loaded once per channel
        block instead of once per tap reading it (the row-box tiles' 9 boxes per block). Two forms:

        * TH output rows of one image (maps whose image fills at least half the tile): the rows split by phase (row
          2 h2 + ph) serve all three tap rows, as phase 1 from h2 = oh - 1 (r = 0), phase 0 from oh (r = 1) and phase 1
          from oh (r = 2), so the window is one box (64, pitch, TH + 1, 2, 1) of the view (64, W / 2, H / 2, 2, N * CB)
          from (0, -1, oh0 - 1, 0, n * CB + cb), landing [ph][h2][pair][64], (TH + 1) * pitch pair rows per phase.
        * NB whole images stacked (small maps, 7 x 7 outputs: 4 images of 56 positions fill N 224), positions
          n = (i * OH + oh) * pitch + ow. One phase-1 window cannot serve both r = 0 and r = 2 here: image i's rows
          would need OH + 1 of them (the zero padding row above) in OH rows of positions. So each tap row r has a
          window of its own, rows 2oh + r - 1 of the NB images: one box (64, pitch, 2 OH, NB, 1) with element strides
          (1, 1, 2, 1, 1) of the view (64, W / 2, H, N, CB) from (0, -1, r - 1, n0, cb), landing [image][oh][pair][64];
          the three windows sit win = NB * OH * pitch rows apart (a multiple of 16 rows: 1024 bytes, so every box lands
          on the same swizzle phase), and tap row r's view starts r * win rows in. 3 OH pitch pair rows per image, where
          the first form's 2 (OH + 1) pitch would need 64 positions per 7 x 7 image instead of 56.
        * quad_windows (one image per tile, W a multiple of 4): 128-byte window rows, quads of input columns 4j .. 4j + 3
          counted from quad -1. Output column ow = 2t + e reads columns 4t + 2e - 1 + s, the 32 bytes at t * 128 + (3 + s
          + 2e) * 32 of the tap row's window rows, so the tile's positions split by column parity e: position e * bm / 2
          + oh * pitch + t is pixel (oh0 + oh, 2t + e), pitch = OW / 2 + 1 quads, each tap two wgmmas of N = bm / 2, the
          odd half's view 64 bytes after the even half's. One box (128, pitch, TH + 1, 2, 1) of the view (128, W / 4, H /
          2, 2, N * CB), landing [ph][h2][quad][128]: half the pairs' rows.
        """
        oh, ow = shape.out_hw
        if ((shape.r, shape.s, shape.stride, shape.pads) != (3, 3, (2, 2), (1, 1, 1, 1)) or shape.h % 2 or shape.w % 2
                or ow > self.bm):
            return None
        if self.quad_windows and shape.w % 4:
            return None
        # one wgmma's positions and a tile row's pixels among them: the whole row, or (quads) one column parity's half
        span, row_px = (self.bm // 2, ow // 2) if self.quad_windows else (self.bm, ow)
        pitch = row_px + 1
        if pitch > 256:
            return None
        image_rows = oh * pitch  # positions of one image
        if not self.quad_windows and 2 * image_rows <= self.bm:  # stacked images (the kernel tells the forms apart by NB > 1)
            nb = min(self.bm // image_rows, shape.n)
            while nb > 1 and nb * image_rows % 16:
                nb -= 1  # whole 1024-byte windows
            win = nb * image_rows
            if nb < 2 or win % 16 or 2 * oh > 256 or 2 * win + self.bm + 1 > self.halo_rows:
                return None  # tap (2, 2)'s view, from row 2 win + 1, must stay inside the slot
            if nb * oh * ow * 2 < self.bm:
                return None  # under half the tile's positions would be pixels
            return oh, nb, 1, 3 * win * self.window_row_bytes, math.ceil(shape.n / nb), pitch
        th_max = min((span - row_px) // pitch + 1, 255)  # TH + 1 window rows per phase <= 256 (box limit)
        tpi = math.ceil(oh / th_max)
        th = math.ceil(oh / tpi)
        phase_rows = (th + 1) * pitch
        if phase_rows + pitch + 1 + span > self.halo_rows:
            return None  # tap (2, 2)'s view (quads: the odd half's), from row phase_rows + pitch + 1, must stay inside the slot
        if th * ow * 2 < self.bm:
            return None  # under half the tile's positions would be pixels
        return th, 1, tpi, 2 * phase_rows * self.window_row_bytes, shape.n * tpi, pitch

WGMMA_TACTICS: tuple[WgmmaTactic, ...] = (
    WgmmaTactic(20, 256, 128, 2, 1, 6, 32, 1, ks=2),
    WgmmaTactic(21, 224, 128, 2, 1, 6, 32, 1, ks=2),
    WgmmaTactic(22, 208, 128, 2, 1, 6, 32, 1, ks=2),
    WgmmaTactic(23, 128, 128, 2, 1, 8, 32, 1, ks=2),
    WgmmaTactic(24, 208, 128, 2, 1, 6, 32, 1, ks=2, persistent=True),
    WgmmaTactic(25, 256, 128, 2, 1, 6, 32, 1, ks=2, persistent=True),
    # One 128-byte weight box per slot of 4 k32 steps (WG_A128): the copy engine moves a quarter of the
    # weight rows (bench/wgmma_diag.py found the ring bound by the copy engine's rows per clock).
    WgmmaTactic(26, 208, 128, 2, 1, 4, 32, 1, ks=4, a_box=128),
    WgmmaTactic(27, 256, 128, 2, 1, 3, 32, 1, ks=4, a_box=128),
    WgmmaTactic(28, 208, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True),
    WgmmaTactic(29, 256, 128, 2, 1, 3, 32, 1, ks=4, a_box=128, persistent=True),
    # ... and each activation box loaded once for a cluster of 2 CTAs (the two channel tiles of a pixel
    # tile) and multicast into both: each copy engine moves half the activation rows.
    WgmmaTactic(30, 208, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, multicast=True),
    WgmmaTactic(31, 208, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, multicast=True, persistent=True),
    WgmmaTactic(32, 256, 128, 2, 1, 3, 32, 1, ks=4, a_box=128, multicast=True, persistent=True),
    # Short GEMM-K with a residual (the 1x1 conv3 layers): a tile's main loop is too short to hide the
    # residual's latency behind, so a second staging tile lets it stream in during the previous tile's
    # epilogue; the shallower ring pays for the shared memory.
    WgmmaTactic(33, 208, 128, 2, 1, 3, 32, 1, ks=4, a_box=128, multicast=True, persistent=True, staging=2),
    WgmmaTactic(34, 256, 128, 2, 1, 2, 32, 1, ks=4, a_box=128, multicast=True, persistent=True, staging=2),
    WgmmaTactic(35, 208, 128, 2, 1, 3, 32, 1, ks=4, a_box=128, persistent=True, staging=2),
    # Pixel-major tiles: 128 pixels x 256 (or 128) channels, the epilogue straight from registers to
    # 8-byte CHW32 stores, the residual one TMA box per tile (the epilogue-bound 1x1 +residual layers).
    WgmmaTactic(40, 128, 256, 2, 1, 3, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True),
    WgmmaTactic(41, 128, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True),
    WgmmaTactic(42, 128, 256, 2, 1, 2, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True),
    # ... with the channel tile's weight resident in shared memory (short GEMM-K: the slots carry activations
    # only): w45 tiles of 64 pixels x 256 channels, one per consumer warpgroup; w46 4 consumer warpgroups (4
    # warps per scheduler) in two groups of 2 on 128-pixel tiles. Measured on the H200 at batch 256 (bench/results/
    # wgmma-diag-NVIDIA_H200-2026-11-21/8-epilogue-streams.json): within 3% of w42 (w46 3% faster on res2
    # conv3, w45 on par on res4 conv3); 64-pixel tiles for 4 warpgroups and the TMA store on 2 were slower
    # and are not kept. w48 (w46 with the output handed to the copy engine, a TMA store from a staging tile;
    # never autotune's choice) was removed in session 11: it hung or died with "unspecified launch failure"
    # after tens of CUDA-graph replays (res2 first conv1 at batch 256, 64 or 128 output channels), the failure
    # behind the crashed benches of sessions 8 and 11 (docs/PERF.md).
    WgmmaTactic(45, 64, 256, 2, 1, 8, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, resident_kt=8),
    WgmmaTactic(46, 128, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, consumers=4, resident_kt=8),
    # w50: w45 with its two tile groups (one warpgroup each) taking the tensor cores in turn (WG_PINGPONG).
    # Measured on the H200 at batch 256 (bench/results/wgmma-diag-NVIDIA_H200-2026-11-21/9-pingpong.json):
    # 2-4% faster than w42/w45 on res2-res4 conv3 +res. Ping-pong on w46's groups of two warpgroups was 2%
    # slower than w46, and 16-byte stores (lane pairs swapping 8-byte pieces) moved nothing: not kept.
    WgmmaTactic(50, 64, 256, 2, 1, 8, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, resident_kt=8, pingpong=True),
    # Stride-1 convs with R x S taps: one input window per 32-channel block, each tap's operand a shifted view
    # of it (WG_HALO), so the copy engine moves (TH + R - 1) x WH rows per channel block instead of R x S x
    # TH x OW: res3 conv2 (28 x 28, 7-row tiles, WH 30: 208 positions) and res4 conv2 (14 x 14, WH 16: 224).
    WgmmaTactic(60, 208, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=288),
    WgmmaTactic(61, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=288),
    WgmmaTactic(62, 208, 128, 2, 1, 6, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=288, halo_stages=4),
    # ... with 7 x 7 maps' 4 images side by side (pitch 8: 196 pixels in 224 positions), whose views reach row 290.
    WgmmaTactic(64, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=320),
    # Channel-major ping-pong (WG_PINGPONG with WG_CH 64): each consumer warpgroup a window tile of 64 channels of its
    # own, the two taking the tensor cores in turn, so the epilogue and the tile's drain run under the other's main
    # loop; the channel tile's weight (GEMM-K up to resident_kt k32 steps) is resident, the copy engine moves windows.
    # w70 keeps 8 window slots since session 19 (6 before): res3 conv2 0.0491 -> 0.0490, 0.0491 -> 0.0483, 0.0500 -> 0.0487
    # ms in three calls (bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/79-*.json, 80-*.json; 10 slots 0.0494-0.0495, 12
    # 0.0501; in session 14, before the TMA stores, 8 had not helped: 39-window-stages.json).
    # Programmatic dependent launch (pdl, session 22; bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/99-pdl-*.json, batch
    # 256, A/B in one call): a grid that lets the next launch at its start (pdl=1) gained on w67-w70 (res3 conv2 w70
    # 0.0485 -> 0.0473 ms, res4 conv2 w69 0.0466 -> 0.0454, res5 conv2 w69 0.0428 -> 0.0422, res4 first conv2 w67 0.0490 ->
    # 0.0472, res5 first conv2 w68 0.0460 -> 0.0453) but cost w74 4 % (0.0522 -> 0.0543, in every call): w74 takes the
    # launch attribute alone (pdl=2: the launch overlaps the previous grid's exit; 0.0522 -> 0.0516).
    WgmmaTactic(70, 208, 64, 2, 1, 1, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=288, halo_stages=8,
                staging=2, resident_kt=36, pingpong=True, pdl=1),
    WgmmaTactic(71, 224, 64, 2, 1, 1, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=288, halo_stages=4,
                staging=2, resident_kt=72, pingpong=True),
    # ... for 56 x 56 maps (res2's 64-channel conv2: a 64-channel tile is the whole layer): 3 rows of pitch 57 are 170
    # positions, N 176, whose views reach row 292 (H200, batch 256: 0.0649 ms against mma.sync's 0.1494, 6 window slots
    # 0.0659, printed by a wgmma_diag call whose JSON its timeout cut off; bench/results/kernels-NVIDIA_H200-2026-11-22.json,
    # v17: 0.0655, 3.58x cuBLASLt).
    # Since session 19 with a wgmma batch per window (window_batches, as w74 below): res2 conv2 0.0659 -> 0.0597 and
    # 0.0665 -> 0.0607 ms in two calls (bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/78-window-batches-ab-*.json).
    WgmmaTactic(73, 176, 64, 2, 1, 1, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=320, halo_stages=8,
                staging=2, resident_kt=36, pingpong=True, window_batches=True),
    # Stride-2 windows (WG_S2WIN) for the 3x3 stride-2 layers, whose row-box tiles are bound by the copy engine's rows
    # (9 boxes of 32-byte rows per channel block, docs/wgmma.md): one box of 64-byte pair rows per channel block. w74, a
    # 64-channel ping-pong tile with resident weights, for 28 x 28 outputs (res3 first conv2: 7 rows of pitch 29); w65, a
    # 128-channel tile sharing each window between its two warpgroups, the weights through the ring (res4 first conv2,
    # whose 72 k32 steps of weight leave no room for resident weights and windows). Measured on the H200 at batch 256
    # (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/46-stride2-windows.json, 47-*.json): res3 first conv2 w35 0.0765 ->
    # w74 0.0556 ms (w65 0.0655), res4 first conv2 w31 0.0567 -> w65 0.0534 (3 window slots 0.0547). Not kept: w74's 14 x 14
    # form (bm 128, resident weights, 3 slots, 2 batches in flight) 0.1061 ms; w74 sharing its windows over clusters of
    # 2 CTAs by multicast, 0.0587; w74 with 128-byte rows of column quads (positions split by column parity, two wgmmas of
    # N 112 per k32 step; "w77" of commit 39834de, reverted): copies alone 0.0440 -> 0.0352 ms, but the wgmma issue alone
    # 0.0451 -> 0.0481 and the kernel 0.0572 (48-quad-windows-not-kept.json).
    # w74 leaves 1 wgmma batch in flight, not 3: with 4 window slots of 9 taps, 3 batches (12 k32 steps) held windows
    # the producer was waiting for (res3 first conv2 0.0552 -> 0.0539 ms with 2, 49-stride2-ring-depths.json; 0.0555 ->
    # 0.0544, 50-w74-two-in-flight.json, after the v18 bench), and 1 took it from 0.0548-0.0561 to 0.0535 in two calls
    # (session 18, 65-w74-one-in-flight.json, 65b-pingpong-in-flight.json: there the stride-1 ping-pong tiles w70 / w71 /
    # w73 gained nothing from 1 or 2, and keep 3).
    # Since session 19 w74 takes a wgmma batch per window (window_batches): a window goes back once its own 9 taps are
    # done, early when the next has not landed, where a batch of 4 k32 steps straddling two windows held the first until
    # the second had landed. H200, batch 256, six A/B calls (bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/70-*.json,
    # 71-*.json, 75-*.json, 76-*.json, 78-*.json): 0.0533 -> 0.0526, 0.0544 -> 0.0530, 0.0555 -> 0.0538,
    # 0.0539 -> 0.0532, 0.0550 -> 0.0540, 0.0542 -> 0.0533 ms, and its build without stores 0.0523 -> 0.0490. (w70 on res3
    # conv2 0.0491 -> 0.0494 and 0.0499 -> 0.0508, w71 on res4 conv2 0.0462 -> 0.0472: not taken; 77-*.json.)
    WgmmaTactic(74, 208, 64, 2, 1, 1, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=480, halo_stages=4,
                staging=2, resident_kt=36, pingpong=True, stride2_windows=True, pp_inflight=1, window_batches=True, pdl=2),
    # w89 (session 22): w74 with quad windows (quad_windows: 128-byte rows of 4 columns, positions split by column parity,
    # two wgmmas of N 112 per tap; 224 positions for a tile's 196 pixels against w74's 208). In one call (H200, batch 256,
    # bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/100-quad-windows*.json): copies alone 0.0279 ms against w74's 0.0408,
    # issue alone 0.0387 against 0.0359, main loop 0.0457 against 0.0438, the kernel 0.0520-0.0522 against 0.0529-0.0530;
    # a window is still seen ~3,400 clocks after its issue, so 4 slots keep the windows ~1,370 clocks apart. It lets the
    # next grid launch once its last window is issued (pdl=3: 0.0513 twice, against 0.0518-0.0526 at pdl=1).
    # Session 23: a window held ~2,700 clocks for a ~1,230-clock batch (timeline), because the batch after it was issued
    # whole before the wait that gives it back, and a wgmma's issue waits for room in the tensor cores' queue. With
    # early_release=5 a batch issues 5 of its taps, waits for the previous batch and gives its window back, then issues
    # the other 4: 0.0477-0.0485 ms in four timings against 0.0513-0.0516 (early_release 3: 0.0485, 0.0486; 4: 0.0476,
    # 0.0501; 6: 0.0478, 0.0481; 8: 0.0510, 0.0516; bench/results/wgmma-diag-NVIDIA_H200-2026-11-26/103-*.json).
    # w74 gained nothing measurable from it (0.0523 against 0.0523 at 5) and keeps whole batches.
    WgmmaTactic(89, 224, 64, 2, 1, 1, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=248, halo_stages=4,
                staging=2, resident_kt=36, pingpong=True, stride2_windows=True, quad_windows=True, pp_inflight=1,
                window_batches=True, pdl=3, early_release=5),
    WgmmaTactic(65, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=496, halo_stages=4, stride2_windows=True,
                window_warp=True),
    # w66: w65's tile with stacked-image windows for 7 x 7 outputs (res5 first conv2: 4 images, 196 pixels in 224
    # positions, against the row-box tiles' 98 in 128 or 196 in 208 with 9 boxes per channel block): 3 windows of 224
    # pair rows per channel block, 44 KB slots, 3 of them.
    WgmmaTactic(66, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=688, halo_stages=3, stride2_windows=True,
                window_warp=True),
    # w67-w69: w65, w66 and w64 storing by TMA (WG_TMA_OUT): their consumer threads' 16-byte stores, under the next
    # tile's first wgmma batch, outlasted it (res4 first conv2 w65 0.0545 ms, 0.0469 without them; res5 first conv2 w66
    # 0.0489 / 0.0458: bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/54-channel-major-stores.json).
    # Since session 18 the stride-2 window tiles w65-w68 issue their windows from a thread of their own (window_warp):
    # issued with the weight slot each is first used with, a 28.8 KB window arrived late (ncu on w67: the consumers
    # spent 10 % of their stall samples waiting on windows). H200, batch 256 (bench/results/wgmma-diag-NVIDIA_H200-
    # 2026-11-22/63-window-warp*.json): res4 first conv2 w67 0.0506-0.0508 -> 0.0481-0.0484 ms, w65 0.0539 -> 0.0515;
    # res5 first conv2 w68 0.0477-0.0478 -> 0.0457-0.0461, w66 0.0491 -> 0.0471; res3 first conv2 w67 0.0593 -> 0.0560.
    # The stride-1 window tiles gained nothing (w60 -1 %, w61 / w62 / w64 within 1 %, w69 +0.5-1 %) and keep one thread.
    WgmmaTactic(67, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=496, halo_stages=4, stride2_windows=True,
                tma_store=True, window_warp=True, pdl=1),
    WgmmaTactic(68, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=688, halo_stages=3, stride2_windows=True,
                tma_store=True, window_warp=True, pdl=1),
    WgmmaTactic(69, 224, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, halo_rows=320, halo_stages=4, tma_store=True, pdl=1),
    # Flat tiles (WG_FLAT) of the 1x1 stride-1 layers whose maps come in 8-pixel groups: w50 / w45 / w42 / w46 with
    # tiles of consecutive pixels instead of whole output rows, so res2's 56- and res3's 28-pixel rows leave no
    # computed row unstored (row tiles: 12.5 % of the rows).
    WgmmaTactic(52, 64, 256, 2, 1, 8, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, resident_kt=8, pingpong=True,
                flat=True),
    WgmmaTactic(54, 64, 256, 2, 1, 8, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, resident_kt=8, flat=True),
    WgmmaTactic(55, 128, 256, 2, 1, 3, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, flat=True),
    WgmmaTactic(56, 128, 128, 2, 1, 4, 32, 1, ks=4, a_box=128, persistent=True, pixel_major=True, consumers=4, resident_kt=8,
                flat=True),
)
assert not set(TACTICS_BY_ID) & {t.id for t in WGMMA_TACTICS}, "tactic ids are unique across families"
TACTICS_BY_ID.update({t.id: t for t in WGMMA_TACTICS})


def wgmma_cost(shape: ConvShape, tactic: WgmmaTactic, sms: int = H100_SMS) -> float | None:
    """Relative time of a wgmma tactic: waves of CTA tiles x each tile's computed work, pixel capacity x channels x
    k32 steps (so 64-channel tiles, twice as many, weigh the same as 128-channel ones)."""
    g = tactic.geometry(shape)
    if g is None:
        return None
    return math.ceil(g.ctas / sms) * tactic.bm * tactic.CHANNELS * g.kt


# Measured order (H200, batch 256, bench/results/wgmma-diag-*/4-multicast.json): the multicast
# persistent tile where the channel tiles pair up, else the persistent tile with 128-byte weight boxes.
WGMMA_PREFERRED = (31, 28)
# ... and before those, for stride-1 convs with R x S taps, the window tiles (WG_HALO) where one fits: measured
# on the H200 at batch 256 (bench/results/wgmma-diag-NVIDIA_H200-2026-11-21/11-halo-windows.json) res3 conv2
# 0.0799 (w28) -> 0.0677 ms (w60), res4 conv2 0.0622 (w31) -> 0.0567 (w61).
# Then (session 13) the channel-major ping-pong w70 first where its resident weights hold the GEMM-K (<= 1152: res3
# conv2 0.0592-0.0599 ms on w60 -> 0.0576-0.0582 on w70, bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/
# 34-select-cursor-if3-*.json; on res4 conv2, w71 0.0521-0.0526 stays behind w61's 0.0508-0.0516). Since its output
# leaves by TMA store (session 14, 42-tma-store.json), w71 leads on res4 conv2 (0.0462 ms against w61's 0.0515) and w70
# on res3 conv2 0.0494. Among the window tiles that fit, choose_wgmma takes the one computing least, this order between
# equals. The stride-2 windows (session 15) take the 3x3 stride-2 layers: res3 first conv2 w74, res4 first conv2 w65;
# their stacked-image form (session 16) res5 first conv2: w66 0.0487 ms against w40's 0.0501 and w31's 0.0533
# (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/52-stride2-stacked-windows.json). The 128-channel window tiles that
# store by TMA (session 16) lead their twins: res5 conv2 w69 0.0427-0.0429 ms against w64's 0.0461, res4 first conv2 w67
# 0.0507 against w65's 0.0537, res5 first conv2 w68 0.0475 against w66's 0.0493 (55-*.json, 57-*.json); on res4 / res3
# conv2 the ping-pong w71 / w70 stay ahead of w69 (0.0456 / 0.0489 against 0.0465 / 0.0541), as w74 of w67 on res3
# first conv2 (0.0541 against 0.0592).
WGMMA_HALO_PREFERRED = (70, 71, 73, 60, 61, 69, 64, 89, 74, 67, 65, 68, 66)
# The quad windows (w89) copy half the window rows of the pairs (w74) for 8 % more positions; wgmma_cost counts only the
# positions, so where a quad tile fits choose_wgmma takes it (res3 first conv2: 0.0513 ms against w74's 0.0527 in one call).
# GEMM-K under 1024 (the 1x1 conv3 / downsample / conv1 layers): two staging tiles, the residual streaming
# in while the previous output waits (bench/results/wgmma-diag-*/5-residual-epilogue.json: res3/res4
# conv3 +res fastest with 33 or 35, 1.17-1.24x the mma.sync kernel).
WGMMA_SHORT_K_PREFERRED = (33, 35)
# GEMM-K under 512 with 256+ output channels (res2-res4's conv3 +res and downsample layers): the pixel-major
# tile, whose epilogue writes from registers (bench/results/kernels-NVIDIA_H200-2026-11-21.json, v8 autotune:
# w42 on every conv3 +res, w40 on the downsamples; res3 conv3 +res 0.124 -> 0.104 ms against w33); first the
# ping-pong tile w50 where the GEMM-K fits its resident weights (<= 256: 2-4% faster on res2-res4 conv3 +res,
# bench/results/wgmma-diag-NVIDIA_H200-2026-11-21/9-pingpong.json). Maps in 8-pixel groups take the flat tiles
# before any of these (WGMMA_FLAT_PREFERRED).
WGMMA_PIXEL_MAJOR_PREFERRED = (50, 42, 40)
# GEMM-K under 1024 where the map comes in 8-pixel groups (1x1, stride 1): the flat tiles first, whatever the channel
# count (bench/results/kernels-NVIDIA_H200-2026-11-22-v12a.json, batch 256 autotune: w52 on res2/res3 conv3 +res, w54
# on res2 downsample (w52 in the v12 run), w55 on res4 first conv1 (GEMM-K 512), w56 on res2 first conv1, res2 conv1
# and res3 first conv1, the 64-channel ones included: 1.04-1.25x what those layers took before). 256+ channels: w52, else w55 (resident
# weights hold GEMM-K <= 256 only); fewer: w56, whose 128-channel tile leaves a 64-channel layer half empty and
# still won. (w52 against its row-tile form w50: res3 conv3 +res 0.0954 -> 0.0756 ms, res2 conv3 +res 0.1709 ->
# 0.1344, bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/18-flat-tiles.json.)
WGMMA_FLAT_PREFERRED = {True: (52, 55), False: (56,)}  # by "256+ output channels"


def choose_wgmma(shape: ConvShape, sms: int = H100_SMS) -> WgmmaTactic | None:
    """The wgmma tactic for a shape where it is expected to beat the mma.sync kernel, else None.

    Rule (measured on the H200 at batch 256, docs/wgmma.md): a grid of at least one full wave (two for the ping-pong
    tiles), and first the window tile of WGMMA_HALO_PREFERRED computing least where one fits (stride-1 R x S convs,
    64-channel ones included, and 3x3 stride-2 convs on even maps); then, for GEMM-K under 1024,
    WGMMA_FLAT_PREFERRED's flat tile where one fits; otherwise
    at least 128 output channels (a tile is 128 channels: 64 would leave half the tensor-core work empty) and
    WGMMA_PREFERRED's (GEMM-K >= 1024), WGMMA_PIXEL_MAJOR_PREFERRED's (GEMM-K < 512, 256+ channels) or
    WGMMA_SHORT_K_PREFERRED's first tactic whose geometry fits, else the fewest waves x pixel capacity x
    k32 steps (wgmma_cost).
    """
    m, n, kg = shape.gemm
    # stride-1 R x S convs: the window tile computing least (7 x 7 maps: 3 images in 208 positions or 4 in 224; 64 output
    # channels: a 64-channel ping-pong tile), whatever the GEMM-K and channel count, the preferred order between equals;
    # a ping-pong tile only where every CTA gets two tiles (one per consumer warpgroup)
    # (the stride-2 windows likewise for 3x3 stride-2 convs padded by 1 on even maps)
    windows = [t for i in WGMMA_HALO_PREFERRED if (g := (t := TACTICS_BY_ID[i]).geometry(shape)) is not None
               and g.ctas >= (2 if t.pingpong else 1) * sms]
    if windows:
        quads = [t for t in windows if t.quad_windows]
        return quads[0] if quads else min(windows, key=lambda t: wgmma_cost(shape, t, sms))
    if kg < 1024:
        for i in WGMMA_FLAT_PREFERRED[n >= 256]:
            geo = TACTICS_BY_ID[i].geometry(shape)
            if geo is not None:
                return TACTICS_BY_ID[i] if geo.ctas >= sms else None
    if n < 128:
        return None
    if kg >= 1024:
        preferred = WGMMA_PREFERRED
    elif kg < 512 and n >= 256:
        preferred = WGMMA_PIXEL_MAJOR_PREFERRED
    else:
        preferred = WGMMA_SHORT_K_PREFERRED
    best = next((TACTICS_BY_ID[i] for i in preferred if TACTICS_BY_ID[i].geometry(shape) is not None), None)
    if best is None:
        costs = [(c, t) for t in WGMMA_TACTICS if (c := wgmma_cost(shape, t, sms)) is not None]
        if not costs:
            return None
        best = min(costs, key=lambda ct: ct[0])[1]
    if best.geometry(shape).ctas < sms:
        return None
    return best
