"""The Hopper tactics (plugins/kernels/wgmma_conv.cu: wgmma + TMA, sm_90a, launched by plugins/wgmma.py).

A tactic is a type: WgmmaTactic's fields are the kernel's whole compile-time configuration. config_header() emits
them as one `constexpr` struct, trtfuse::WgmmaTactic, which the kernel includes (NVRTC gets it as the generated
header wgmma_tactic.cuh); can_implement() is the one place that says whether, and why not, a tactic runs a shape;
the heuristic (choose_wgmma) and the autotuner (candidate_tactics) read the same objects. Measurements behind the
table and the preferred orders: docs/design/wgmma-tactics.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import ClassVar

from .conv_shape import H100_SMS, ConvShape
from .layout import round_up

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
    groups_per_set: int = 0  # flat tiles: 8-row groups per set of group_images images (OH * OW / 8, or OH * OW in boxes)
    box_groups: int = 0  # flat tiles: groups per activation box
    pitch: int = 0  # window tiles: window columns per image, W + max(pad_left, pad_right)
    group_images: int = 1  # flat tiles: images an 8-row group spans: 1 (8 pixels of an image) or 8 (a pixel of 8 images)

    @property
    def ctas(self) -> int:
        return self.pix_tiles * self.ch_tiles

    @property
    def wh(self) -> int:
        """Window tiles: the window's width, nb images of `pitch` columns (tile position n = oh * wh + image * pitch + ow)."""
        return self.nb * self.pitch


WGMMA_S8_WIDTHS = (64, 96, 112, 128, 160, 176, 192, 208, 224, 256)  # the wgmma N widths plugins/kernels/wgmma_s8.cuh instantiates


@dataclass(frozen=True, kw_only=True)
class WgmmaTactic:
    """A wgmma tile: `bm` = pixel capacity of a tile, `bn` = its output channels, `stages` = TMA ring slots of `ks`
    k32 steps each; 128 threads per consumer warpgroup plus a producer warpgroup.
    Channel-major (the default): channels on wgmma's M (bn = 128, two consumer warpgroups x m64), pixels on its N (bm).
    Pixel-major (`pixel_major`): pixels on M (bm = 64 or 128: one or two warpgroups x m64 per tile), channels on N
    (bn = 128 or 256), the epilogue writing straight from registers; `consumers` warpgroups (2 or 4) take the CTA's
    tiles in groups of bm / 64, and with `resident_kt` the channel tile's whole weight stays in shared memory.
    Channel-major with `halo_rows` (stride-1 convs): one input window per 32-channel block in a ring of `halo_stages`
    slots of `halo_rows` rows, each tap's operand a shifted view of it (_window_tiles).
    Channel-major ping-pong (`pingpong` with bn = 64, windows, `resident_kt`): each consumer warpgroup a 64-channel
    window tile of its own, the CTA's channel tile's weight resident, the two taking the tensor cores in turn."""

    id: int  # TensorRT tactic id, unique across the kernel families
    bm: int  # pixel capacity of a tile: the wgmma N (channel-major) or M (pixel-major, 64 per warpgroup)
    bn: int  # output channels of a tile: 128 (channel-major), 64 (channel-major ping-pong), 128 or 256 (pixel-major)
    stages: int  # TMA ring slots
    ks: int = 2  # k32 steps per ring slot
    persistent: bool = False  # min(tiles, SMs) CTAs walk the tiles; the producer runs ahead into the next tile's slots
    # clusters of 2 CTAs on a pixel tile's two channel tiles: each copy engine loads half of a slot's activation boxes
    # and multicasts them into both CTAs; a slot is refilled once both CTAs' consumers released it
    multicast: bool = False
    # bytes of GEMM-K per weight box row: 32 (one k32 step) or 128 (a slot's 4 steps in one box, 128-byte swizzle: the
    # copy engine's cost goes with the rows it moves, so this cuts the weights' cost 4x; needs ks = 4)
    a_box: int = 32
    # staging tiles: 2 lets the next tile's residual stream in while the other still holds the last output (short-K
    # residual layers, whose main loop is too short to hide the residual's latency)
    staging: int = 1
    # pixels on wgmma's M, channels on its N: the weight rows permuted so a thread's accumulators are 8 consecutive
    # channels of a pixel, the epilogue writing 8-byte CHW32 pieces from registers, no staging tile, no CTA barrier
    pixel_major: bool = False
    consumers: int = 2  # consumer warpgroups; 4 only pixel-major (4 warps per scheduler in the epilogue-bound layers)
    # pixel-major: residual buffers; 0 frees their shared memory for ring slots, for convs without a residual only
    # (can_implement refuses a shape whose `residual` is True, the kernel traps on a residual pointer)
    residual_buffers: int = 2
    resident_kt: int = 0  # k32 steps of the channel tile's weight held resident in shared memory; 0: in every slot
    # two tile groups take the tensor cores in turn (as CUTLASS's KernelTmaWarpSpecializedPingpong): pixel-major, or
    # channel-major with bn = 64 (each consumer warpgroup a tile of its own, resident weights, windows, TMA stores)
    pingpong: bool = False
    # > 0: one input window per 32-channel block lands once in a ring of its own, each tap's operand a shifted view of
    # it (stride-1 R x S convs); the slot's rows (32-byte rows, or the stride-2 windows' 64 / 128-byte rows)
    halo_rows: int = 0
    halo_stages: int = 3  # window ring slots
    # pixel-major, 1x1 unpadded convs: tiles of bm consecutive output pixels (stride 2: in groups of one pixel of 8 images)
    flat: bool = False
    # windows of 3x3 stride-2 convs: a window row is a pair of input columns, 64 bytes; both row phases of TH + 1 pair
    # rows land in one box (_stride2_window_tiles)
    stride2_windows: bool = False
    # ... of 128-byte rows (column quads; one image per tile, window batches): the tile's positions split by output
    # column parity, two wgmmas of N / 2 per tap, half the window rows of the pairs
    quad_windows: bool = False
    pp_inflight: int = 3  # channel-major ping-pong: wgmma batches left in flight; holds up to pp_inflight + 1 windows
    # channel-major window tiles without ping-pong: the output leaves by TMA store from a [block][position][32] staging
    # tile, the weight rows permuted in pairs as the ping-pong tile's (which always stores so)
    tma_store: bool = False
    window_warp: bool = False  # window tiles streaming weights: a second producer thread issues the windows
    # channel-major ping-pong on 3x3 windows: one wgmma batch per window (9 taps), each window released as soon as its
    # batch is done, early when the next has not landed
    window_batches: bool = False
    # stride-2 window batches: the batch issues this many taps, then waits for the previous batch and gives its window
    # back, then issues the rest (0: the whole batch first)
    early_release: int = 0
    # programmatic dependent launch: launched so that it may start while the previous grid in the stream runs; the
    # CTA's setup and resident weight overlap that grid's last tiles (persistent grids: every CTA is resident).
    # When the CTA lets the next grid launch: 1 at its start, 2 never (at its exit), 3 once its last window is issued
    pdl: int = 0
    diag: int = 0  # profiling builds only (bench/probe_kernels/wgmma_profiling.cuh, bench/wgmma_diag.py); never in the table
    timeline: int = 0  # profiling only: per-tile SM clocks of the ping-pong consumers (wgmma_timeline.cuh, bench/wgmma_timeline.py)
    family: ClassVar[str] = "wgmma"
    vec: ClassVar[int] = 32  # the activation's channel vector: CHW32
    min_blocks: ClassVar[int] = 1  # one CTA per SM (it takes the SM's shared memory and registers)

    def __post_init__(self):
        if self.pixel_major:
            assert self.bm in (64, 128) and self.bn in (128, 256) and self.a_box == 128 and self.ks == 4
            assert self.persistent and not self.multicast, "pixel-major tiles are persistent, without clusters"
            assert self.consumers in (2, 4) and self.consumers % (self.bm // 64) == 0
            assert self.bn * self.consumers <= 512, "accumulators: bn / 2 registers per consumer thread"
            assert self.resident_kt % 4 == 0
            assert self.residual_buffers in (0, 2), "residual buffers: two (one a tile group), or none"
            assert not self.pingpong or self.tile_groups == 2, "ping-pong alternates two tile groups"
            # (w46 with resident_kt=0 ran res4 conv3, 2 k-blocks a tile, but did not finish res5 conv3's 4 in 200 s)
            assert self.tile_groups == 1 or self.resident_kt, "tile groups: the channel tile's weight resident"
            assert not self.halo_rows, "window tiles are channel-major"
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
                    "k wgmma batches in flight hold up to k + 1 windows (pp_inflight)"
            else:
                assert self.bn == 128 and self.consumers == 2 and self.resident_kt == 0, "channel-major tiles are two warpgroups x m64 channels"
            assert not self.flat, "flat tiles are pixel-major"
            assert self.residual_buffers == 2, "residual buffers are the pixel-major tiles' (channel-major ones stage)"
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
                f"{f'_c{self.consumers}' if self.consumers != 2 else ''}{f'_rb{self.residual_buffers}' if self.residual_buffers != 2 else ''}{f'_wr{self.resident_kt}' if self.resident_kt else ''}{'_pp' if self.pingpong else ''}"
                f"{f'_halo{self.halo_stages}' if self.halo_rows else ''}{('_s2q' if self.quad_windows else '_s2') if self.stride2_windows else ''}{'_flat' if self.flat else ''}"
                f"{f'_if{self.pp_inflight}' if self.pp_inflight != 3 else ''}{'_tmaout' if self.tma_store else ''}{'_ww' if self.window_warp else ''}{'_wb' if self.window_batches else ''}{f'_er{self.early_release}' if self.early_release else ''}{f'_pdl{self.pdl}' if self.pdl else ''}"
                + (f"_diag{self.diag}" if self.diag else "") + ("_timeline" if self.timeline else ""))

    # Fields that are no part of the kernel's configuration struct: profiling builds select a header of their own
    _NOT_IN_STRUCT: ClassVar[tuple[str, ...]] = ("diag", "timeline")

    def config_header(self) -> str:
        """The generated header wgmma_tactic.cuh: this tactic as one constexpr struct, trtfuse::WgmmaTactic, whose
        members are the fields above by name; the cluster shape the kernel is declared with (an attribute, which a
        constexpr cannot switch on and off); and the profiling hooks: none for a table tactic, the profiling or
        timeline build's for bench/wgmma_diag.py and bench/wgmma_timeline.py."""
        members = []
        for f in fields(self):
            if f.name in self._NOT_IN_STRUCT:
                continue
            value = getattr(self, f.name)
            members.append(f"  static constexpr bool {f.name} = {'true' if value else 'false'};" if isinstance(value, bool)
                           else f"  static constexpr int {f.name} = {int(value)};")
        if self.timeline:
            profiling = ['#include "wgmma_timeline.cuh"', f"namespace trtfuse {{ using WgmmaProfiling = TimelineBuild<{self.diag}>; }}"]
        elif self.diag:
            profiling = ['#include "wgmma_profiling.cuh"', f"namespace trtfuse {{ using WgmmaProfiling = ProfilingBuild<{self.diag}>; }}"]
        else:
            profiling = ['#include "wgmma_no_profiling.cuh"']
        return "\n".join([f"// {self.name}: generated by WgmmaTactic.config_header (plugins/wgmma_tactics.py)", "#pragma once",
                          "namespace trtfuse {", "struct WgmmaTactic {", *members, "};", "}  // namespace trtfuse",
                          f"#define TRTFUSE_WGMMA_CLUSTER {'__cluster_dims__(2, 1, 1)' if self.multicast else ''}",
                          *profiling, ""])

    @property
    def stores_by_tma(self) -> bool:
        """Channel-major tiles whose output leaves by TMA store and whose weight rows are permuted in pairs (kTmaOut in
        wgmma_config.cuh): the ping-pong tiles and the `tma_store` window tiles."""
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
        tile group's folded factors) + mbarriers + 1024 for aligning the ring (WgmmaSmem in wgmma_tile.cuh)."""
        bars = 8 * (2 * self.stages + 1)
        if self.pixel_major:
            weights_in_slot = 0 if self.resident_kt else self.CHANNELS
            ring = self.stages * self.ks * 32 * (weights_in_slot + self.bm) + self.resident_kt * 32 * self.CHANNELS
            return ring + self.residual_buffers * self.consumers * 64 * self.bn + self.tile_groups * 8 * self.bn + bars + 1024
        if self.halo_rows:  # weight slots carry weights only (or resident weights), the windows have their ring and barriers
            weights = self.resident_kt * 32 * self.CHANNELS if self.resident_kt else self.stages * self.ks * 32 * self.CHANNELS
            ring = weights + self.halo_stages * self.halo_slot_bytes
            bars += 16 * self.halo_stages
        else:
            ring = self.stages * self.ks * 32 * (self.CHANNELS + self.bm)
        # staging rows of CHANNELS + 16 bytes; the TMA-stored tiles' are [block][position][32], unpadded
        staging_row = self.CHANNELS if self.stores_by_tma else self.CHANNELS + 16
        return ring + self.staging * self.bm * staging_row + bars + 1024

    def can_implement(self, shape: ConvShape) -> tuple[bool, str]:
        """(True, "") where the kernel built from this tactic runs `shape`, else (False, why not): the one place that
        decides it, read by the heuristic (choose_wgmma), the autotuner (candidate_tactics) and the launcher (grid)."""
        plan = self._plan(shape)
        return (True, "") if isinstance(plan, WgmmaGeometry) else (False, plan)

    def geometry(self, shape: ConvShape) -> WgmmaGeometry | None:
        """How `shape` is cut into CTA tiles, or None where the tactic cannot run it (can_implement says why)."""
        plan = self._plan(shape)
        return plan if isinstance(plan, WgmmaGeometry) else None

    def _plan(self, shape: ConvShape) -> WgmmaGeometry | str:
        """Pixel tiles of TH full output rows (or NB whole images) whose TMA box fits the tile (or, for a
        window tactic, whose window does: _window_tiles), or the reason the shape is outside what the kernel
        handles (CHW4 input, boxes over 256, strides over 8, ...)."""
        if shape.vec != 32:
            return f"input vectors of {shape.vec} channels (the TMA views read CHW32)"
        if self.pixel_major and not self.residual_buffers and shape.residual:
            return "no residual buffers: convs without a residual only"
        groups_per_set = box_groups = 0
        group_images = 1
        if self.flat:
            # a 1x1 unpadded conv: output pixel (oh, ow) reads input pixel (oh, ow), or at stride 2 (2 oh, 2 ow); an
            # 8-row group of the wgmma operand is 8 pixels of one image where the output map comes in groups of 8 at
            # stride 1, else one pixel of 8 images (14 x 14, 7 x 7, and every map at stride 2: flat_group_images)
            if (shape.r, shape.s, shape.pads) != (1, 1, (0, 0, 0, 0)) or shape.stride not in ((1, 1), (2, 2)):
                return "flat tiles: 1x1 unpadded convs of stride 1 or 2 only"
            oh, ow = shape.out_hw
            hw, group_images, strided = oh * ow, flat_group_images(shape), shape.stride == (2, 2)
            if group_images == 8 and shape.n % 8:
                return ("stride-2 flat tiles: the batch's images must come in groups of 8 (a group is one pixel of 8 images)" if strided
                        else "flat tiles: the map's pixels, or else the batch's images, must come in groups of 8")
            if group_images == 1:
                groups_per_set = hw // 8
                box_groups = min(groups_per_set & -groups_per_set, self.bm // 8)  # a power of two dividing both
            elif strided:  # a box is pixels of one output row: the most (up to 4) that divide the row, so none crosses it
                box_groups = min(ow & -ow, 4, self.bm // 8)
                groups_per_set = hw
            else:  # a set of 8 images: its OH * OW groups rounded up to boxes of 4 (the groups past the map not stored)
                box_groups = min(4, self.bm // 8)
                groups_per_set = round_up(hw, box_groups)
            rows = shape.n // group_images * groups_per_set * 8
            tiles = 1, 1, 1, self.bm * 32, math.ceil(rows / self.bm), 0
        else:
            tiles = (self._stride2_window_tiles(shape) if self.stride2_windows else self._window_tiles(shape) if self.halo_rows
                     else self._row_tiles(shape))
        if isinstance(tiles, str):
            return tiles
        th, nb, tpi, box_bytes, pix_tiles, pitch = tiles
        kt = math.ceil(shape.c / 32) * shape.r * shape.s
        if self.resident_kt and kt > self.resident_kt:
            return f"GEMM-K of {kt} k32 steps does not fit the {self.resident_kt} of resident weight"
        if self.window_batches and shape.r * shape.s != 9:
            return "window batches: one batch is a 3x3 window's 9 taps"
        ch_tiles = math.ceil(round_up(shape.k, 32) / self.CHANNELS)
        if self.multicast and ch_tiles % 2:
            return "multicast: a cluster pairs a pixel tile's channel tiles, and there is an odd number of them"
        return WgmmaGeometry(th, nb, tpi, ch_tiles, kt, box_bytes, pix_tiles, groups_per_set, box_groups, pitch, group_images)

    def _row_tiles(self, shape: ConvShape):
        """(TH, NB, tiles per image, box bytes, pixel tiles, 0 (no window pitch)): TH full output rows of one image,
        balanced, or NB whole images (TH = OH), each one activation box per k32 step."""
        oh, ow = shape.out_hw
        sh, sw = shape.stride
        if sh > 8 or sw > 8 or ow * sw > 256:
            return "row boxes: strides up to 8 and output rows up to 256 input columns"
        if ow > self.bm:
            return f"an output row of {ow} pixels does not fit the tile's {self.bm}"
        if oh * ow <= self.bm:
            nb, th = min(self.bm // (oh * ow), shape.n, 256), oh
            if th * sh > 256:
                return "row boxes: a box spans at most 256 input rows"
            return th, nb, 1, nb * th * ow * 32, math.ceil(shape.n / nb), 0
        th_max = min(self.bm // ow, 256 // sh)
        tpi = math.ceil(oh / th_max)
        th = math.ceil(oh / tpi)
        return th, 1, tpi, th * ow * 32, shape.n * tpi, 0

    def _window_tiles(self, shape: ConvShape):
        """Window tiles: (TH, NB, tiles per image, box bytes, pixel tiles, pitch). The window holds TH + R - 1 input
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
        if shape.stride != (1, 1) or shape.r * shape.s < 4:
            return "stride-1 windows: stride-1 convs with at least 4 taps"
        if ow > self.bm or pitch > 256:
            return f"an output row of {ow} pixels (window pitch {pitch}) does not fit the tile's {self.bm} or a box's 256"

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
            return f"the last tap's view reaches past the window slot's {self.halo_rows} rows"
        if nb * th * ow * 2 < self.bm:
            return "under half the tile's positions would be pixels (the row-box tiles do better)"
        return th, nb, tpi, (th + shape.r - 1) * wh * 32, pix_tiles, pitch

    def _stride2_window_tiles(self, shape: ConvShape):
        """Stride-2 windows: (TH, NB, tiles per image, box bytes, pixel tiles, pitch) for a 3x3 stride-2 conv padded by 1 on an
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
        if (shape.r, shape.s, shape.stride, shape.pads) != (3, 3, (2, 2), (1, 1, 1, 1)) or shape.h % 2 or shape.w % 2:
            return "stride-2 windows: 3x3 stride-2 convs padded by 1 on even maps"
        if ow > self.bm:
            return f"an output row of {ow} pixels does not fit the tile's {self.bm}"
        if self.quad_windows and shape.w % 4:
            return "quad windows: the map's width must be a multiple of 4"
        # one wgmma's positions and a tile row's pixels among them: the whole row, or (quads) one column parity's half
        span, row_px = (self.bm // 2, ow // 2) if self.quad_windows else (self.bm, ow)
        pitch = row_px + 1
        if pitch > 256:
            return "a window row of more than 256 pairs or quads (the box limit)"
        image_rows = oh * pitch  # positions of one image
        if not self.quad_windows and 2 * image_rows <= self.bm:  # stacked images (the kernel tells the forms apart by NB > 1)
            nb = min(self.bm // image_rows, shape.n)
            while nb > 1 and nb * image_rows % 16:
                nb -= 1  # whole 1024-byte windows
            win = nb * image_rows
            if nb < 2 or win % 16 or 2 * oh > 256:
                return "stacked stride-2 windows: at least 2 images in whole 1024-byte windows of at most 256 rows"
            if 2 * win + self.bm + 1 > self.halo_rows:
                return f"tap (2, 2)'s view, from row {2 * win + 1}, reaches past the window slot's {self.halo_rows} rows"
            if nb * oh * ow * 2 < self.bm:
                return "under half the tile's positions would be pixels"
            return oh, nb, 1, 3 * win * self.window_row_bytes, math.ceil(shape.n / nb), pitch
        th_max = min((span - row_px) // pitch + 1, 255)  # TH + 1 window rows per phase <= 256 (box limit)
        tpi = math.ceil(oh / th_max)
        th = math.ceil(oh / tpi)
        phase_rows = (th + 1) * pitch
        if phase_rows + pitch + 1 + span > self.halo_rows:  # (quads: the odd half's view)
            return f"tap (2, 2)'s view, from row {phase_rows + pitch + 1}, reaches past the window slot's {self.halo_rows} rows"
        if th * ow * 2 < self.bm:
            return "under half the tile's positions would be pixels"
        return th, 1, tpi, 2 * phase_rows * self.window_row_bytes, shape.n * tpi, pitch


# One line per entry: what it is for. How each was measured, and what was tried and not kept:
# docs/design/wgmma-tactics.md.
_CM = dict(ks=4, a_box=128)  # channel-major tiles with 128-byte weight boxes
_PM = dict(ks=4, a_box=128, persistent=True, pixel_major=True)  # pixel-major tiles
_PP = dict(ks=4, a_box=128, persistent=True, staging=2, pingpong=True)  # the channel-major ping-pong tiles
_S2 = dict(ks=4, a_box=128, persistent=True, stride2_windows=True, window_warp=True)  # 128-channel stride-2 window tiles

WGMMA_TACTICS: tuple[WgmmaTactic, ...] = (
    # row-box tiles of 32-byte weight boxes, 2 k32 steps per slot: the first forms, kept as the autotuner's baselines
    WgmmaTactic(id=20, bm=256, bn=128, stages=6),
    WgmmaTactic(id=21, bm=224, bn=128, stages=6),
    WgmmaTactic(id=22, bm=208, bn=128, stages=6),
    WgmmaTactic(id=23, bm=128, bn=128, stages=8),
    WgmmaTactic(id=24, bm=208, bn=128, stages=6, persistent=True),
    WgmmaTactic(id=25, bm=256, bn=128, stages=6, persistent=True),
    # one 128-byte weight box per slot: the copy engine moves a quarter of the weight rows
    WgmmaTactic(id=26, bm=208, bn=128, stages=4, **_CM),
    WgmmaTactic(id=27, bm=256, bn=128, stages=3, **_CM),
    WgmmaTactic(id=28, bm=208, bn=128, stages=4, persistent=True, **_CM),  # long-K convs whose channel tiles do not pair up
    WgmmaTactic(id=29, bm=256, bn=128, stages=3, persistent=True, **_CM),
    # activation boxes multicast to a cluster of the two channel tiles of a pixel tile
    WgmmaTactic(id=30, bm=208, bn=128, stages=4, multicast=True, **_CM),
    WgmmaTactic(id=31, bm=208, bn=128, stages=4, multicast=True, persistent=True, **_CM),  # long-K convs (GEMM-K >= 1024)
    WgmmaTactic(id=32, bm=256, bn=128, stages=3, multicast=True, persistent=True, **_CM),
    # short GEMM-K with a residual: a second staging tile streams the next residual in under the last epilogue
    WgmmaTactic(id=33, bm=208, bn=128, stages=3, multicast=True, persistent=True, staging=2, **_CM),
    WgmmaTactic(id=34, bm=256, bn=128, stages=2, multicast=True, persistent=True, staging=2, **_CM),
    WgmmaTactic(id=35, bm=208, bn=128, stages=3, persistent=True, staging=2, **_CM),
    # pixel-major: the epilogue-bound 1x1 +residual layers and downsamples (GEMM-K < 512, 256+ channels)
    WgmmaTactic(id=40, bm=128, bn=256, stages=3, **_PM),
    WgmmaTactic(id=41, bm=128, bn=128, stages=4, **_PM),
    WgmmaTactic(id=42, bm=128, bn=256, stages=2, **_PM),
    WgmmaTactic(id=43, bm=128, bn=256, stages=4, residual_buffers=0, **_PM),  # ... w40 with a fourth slot, no residual (res3 downsample)
    WgmmaTactic(id=45, bm=64, bn=256, stages=8, resident_kt=8, **_PM),  # ... the weight resident, a tile per warpgroup
    WgmmaTactic(id=46, bm=128, bn=128, stages=4, consumers=4, resident_kt=8, **_PM),  # ... 4 consumer warpgroups
    WgmmaTactic(id=50, bm=64, bn=256, stages=8, resident_kt=8, pingpong=True, **_PM),  # ... w45's two groups in ping-pong
    # stride-1 windows (3x3 convs): res3 conv2 (28 x 28, 7-row tiles), res4 conv2 (14 x 14)
    WgmmaTactic(id=60, bm=208, bn=128, stages=4, persistent=True, halo_rows=288, **_CM),
    WgmmaTactic(id=61, bm=224, bn=128, stages=4, persistent=True, halo_rows=288, **_CM),
    WgmmaTactic(id=62, bm=208, bn=128, stages=6, persistent=True, halo_rows=288, halo_stages=4, **_CM),
    WgmmaTactic(id=64, bm=224, bn=128, stages=4, persistent=True, halo_rows=320, **_CM),  # 7 x 7 maps, 4 images side by side
    # channel-major ping-pong on stride-1 windows: res3 conv2 (w70), res4 conv2 (w71), res2's 56 x 56 conv2 (w73)
    WgmmaTactic(id=70, bm=208, bn=64, stages=1, resident_kt=36, halo_rows=288, halo_stages=8, pdl=1, **_PP),
    WgmmaTactic(id=71, bm=224, bn=64, stages=1, resident_kt=72, halo_rows=288, halo_stages=4, **_PP),
    WgmmaTactic(id=73, bm=176, bn=64, stages=1, resident_kt=36, halo_rows=320, halo_stages=8, window_batches=True, **_PP),
    # channel-major ping-pong on stride-2 windows: res3 first conv2 (28 x 28 outputs), pairs (w74) or quads (w89)
    WgmmaTactic(id=74, bm=208, bn=64, stages=1, resident_kt=36, halo_rows=480, halo_stages=4, stride2_windows=True,
                pp_inflight=1, window_batches=True, pdl=2, **_PP),
    WgmmaTactic(id=89, bm=224, bn=64, stages=1, resident_kt=36, halo_rows=248, halo_stages=4, stride2_windows=True,
                quad_windows=True, pp_inflight=1, window_batches=True, early_release=5, pdl=3, **_PP),
    # 128-channel stride-2 windows, the weights through the ring: res4 first conv2 (w65), res5 first conv2 stacked (w66)
    WgmmaTactic(id=65, bm=224, bn=128, stages=4, halo_rows=496, halo_stages=4, **_S2),
    WgmmaTactic(id=66, bm=224, bn=128, stages=4, halo_rows=688, **_S2),
    # ... w65, w66 and w64 storing by TMA
    WgmmaTactic(id=67, bm=224, bn=128, stages=4, halo_rows=496, halo_stages=4, tma_store=True, pdl=1, **_S2),
    WgmmaTactic(id=68, bm=224, bn=128, stages=4, halo_rows=688, tma_store=True, pdl=1, **_S2),
    WgmmaTactic(id=69, bm=224, bn=128, stages=4, persistent=True, halo_rows=320, halo_stages=4, tma_store=True, pdl=1, **_CM),
    # flat tiles of consecutive pixels for the 1x1 stride-1 layers whose maps come in 8-pixel groups (w50 / w45 / w42 / w46)
    WgmmaTactic(id=52, bm=64, bn=256, stages=8, resident_kt=8, pingpong=True, flat=True, **_PM),
    WgmmaTactic(id=53, bm=64, bn=256, stages=12, resident_kt=8, pingpong=True, flat=True, residual_buffers=0, **_PM),  # ... w52 with 12 slots, no residual (res2 downsample)
    WgmmaTactic(id=54, bm=64, bn=256, stages=8, resident_kt=8, flat=True, **_PM),
    WgmmaTactic(id=55, bm=128, bn=256, stages=3, flat=True, **_PM),
    WgmmaTactic(id=56, bm=128, bn=128, stages=4, consumers=4, resident_kt=8, flat=True, **_PM),
    WgmmaTactic(id=57, bm=64, bn=256, stages=3, resident_kt=16, pingpong=True, flat=True, **_PM),  # w52 with 16 k32 steps resident (res5 conv3)
    # ... w55 with a fourth ring slot where the residual buffers were: the long-K convs without a residual (res4 conv1)
    WgmmaTactic(id=59, bm=128, bn=256, stages=4, residual_buffers=0, flat=True, **_PM),
)
WGMMA_BY_ID = {t.id: t for t in WGMMA_TACTICS}


def flat_group_images(shape: ConvShape) -> int:
    """Images an 8-row group of a flat tile spans on `shape`'s output map: 1 (8 of its pixels) where the map's pixels
    come in 8s and the conv has stride 1, else 8 (one pixel of 8 images). At stride 2, 8 consecutive output pixels are
    one box of the input only where they lie in one output row, which a 28 x 28 map's 8-pixel groups do not."""
    oh, ow = shape.out_hw
    return 1 if oh * ow % 8 == 0 and shape.stride == (1, 1) else 8


def wgmma_cost(shape: ConvShape, tactic: WgmmaTactic, sms: int = H100_SMS) -> float | None:
    """Relative time of a wgmma tactic: waves of CTA tiles x each tile's computed work, pixel capacity x channels x
    k32 steps (so 64-channel tiles, twice as many, weigh the same as 128-channel ones)."""
    g = tactic.geometry(shape)
    if g is None:
        return None
    return math.ceil(g.ctas / sms) * tactic.bm * tactic.CHANNELS * g.kt


# The orders choose_wgmma prefers, as measured on the H200 at batch 256 (docs/design/wgmma-tactics.md):
# long GEMM-K (>= 1024): the multicast persistent tile where the channel tiles pair up, else 128-byte weight boxes
WGMMA_PREFERRED = (31, 28)
# stride-1 R x S convs and 3x3 stride-2 convs: the window tiles, the one computing least, this order between equals
WGMMA_HALO_PREFERRED = (70, 71, 73, 60, 61, 69, 64, 89, 74, 67, 65, 68, 66)
# GEMM-K under 1024: two staging tiles, the residual streaming in while the previous output waits
WGMMA_SHORT_K_PREFERRED = (33, 35)
# GEMM-K under 512 with 256+ output channels: the pixel-major tiles, first the ping-pong one where its weight fits;
# w43 before w40 where the conv has no residual (res3 downsample 0.1350 against 0.1474 ms at batch 512)
WGMMA_PIXEL_MAJOR_PREFERRED = (50, 42, 43, 40)
# GEMM-K under 1024, or any GEMM-K where 8-image groups fill whole boxes (14 x 14): the flat tiles, by "256+ output
# channels"; w59 (no residual buffers, a fourth ring slot) before w55 where the conv has no residual: res4 first conv1
# 0.1020 against 0.1125 ms at batch 512, res4 conv1 0.0516 against 0.0541, res5 first conv1 0.0944 against 0.0993;
# likewise w53 before w52 (res2 downsample 0.1500 against 0.1553)
WGMMA_FLAT_PREFERRED = {True: (53, 52, 59, 55), False: (56,)}
# ... 256+ channels on maps not in 8-pixel groups (8-image groups): w57's 16 k32 steps resident before w59 / w55
# (res5 conv3)
WGMMA_FLAT_IMAGE_GROUPS_PREFERRED = (53, 52, 57, 59, 55)


def choose_wgmma(shape: ConvShape, sms: int = H100_SMS) -> WgmmaTactic | None:
    """The wgmma tactic for a shape where it is expected to beat the mma.sync kernel, else None.

    Rule (measured on the H200 at batch 256, docs/wgmma.md): a grid of at least one full wave (two for the ping-pong
    tiles), and first the window tile of WGMMA_HALO_PREFERRED computing least where one fits (stride-1 R x S convs,
    64-channel ones included, and 3x3 stride-2 convs on even maps); then, for GEMM-K under 1024, or any GEMM-K where
    8-image groups fill whole 4-group boxes (14 x 14 maps, a batch in 8s), WGMMA_FLAT_PREFERRED's flat tile where one
    fits; otherwise
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
    windows = [t for i in WGMMA_HALO_PREFERRED if (g := (t := WGMMA_BY_ID[i]).geometry(shape)) is not None
               and g.ctas >= (2 if t.pingpong else 1) * sms]
    if windows:
        quads = [t for t in windows if t.quad_windows]
        return quads[0] if quads else min(windows, key=lambda t: wgmma_cost(shape, t, sms))
    image_groups = flat_group_images(shape) == 8
    # (the stride-2 flat tiles of the downsamples are autotune's candidates, not the rule's: --plans records which wins)
    flat_order = WGMMA_FLAT_IMAGE_GROUPS_PREFERRED if n >= 256 and image_groups else WGMMA_FLAT_PREFERRED[n >= 256]
    for i in flat_order if shape.stride == (1, 1) else ():
        geo = WGMMA_BY_ID[i].geometry(shape)
        if geo is None:
            continue
        # 8-image groups on 14 x 14 maps whatever the GEMM-K: res4 conv3 + residual 0.0912 against w40's 0.1099 ms at
        # batch 512, res4 conv1 0.0539 against w31's 0.0591; on 7 x 7 maps (sets rounded up to whole boxes) under 1024:
        # res5 conv3 + residual on w57 0.0744 / 0.0729 against w40's 0.0850 / 0.0827, but res5 conv1 (GEMM-K 2048) on
        # w31, not w55
        whole_boxes = geo.groups_per_set == shape.h * shape.w  # no set rounded up to whole boxes
        if kg < 1024 or image_groups and whole_boxes:
            return WGMMA_BY_ID[i] if geo.ctas >= sms else None
    if n < 128:
        return None
    if kg >= 1024:
        preferred = WGMMA_PREFERRED
    elif kg < 512 and n >= 256:
        preferred = WGMMA_PIXEL_MAJOR_PREFERRED
    else:
        preferred = WGMMA_SHORT_K_PREFERRED
    best = next((WGMMA_BY_ID[i] for i in preferred if WGMMA_BY_ID[i].geometry(shape) is not None), None)
    if best is None:
        costs = [(c, t) for t in WGMMA_TACTICS if (c := wgmma_cost(shape, t, sms)) is not None]
        if not costs:
            return None
        best = min(costs, key=lambda ct: ct[0])[1]
    if best.geometry(shape).ctas < sms:
        return None
    return best
