// Consumer compute on input windows: the operands of a window tile's taps as views of one window per 32-channel
// block, and the wgmma batches that read them.
//
// Window tiles (channel-major, 128-byte weight boxes, stride-1 convs with R*S > 1). Without them,
// every k32 step loads its own activation box, so one 32-channel block of a 3x3 conv costs the copy engine 9
// boxes of P rows each: the engine's rows, not the tensor cores, bound the 3x3 layers (docs/wgmma.md, ~0.4
// rows per clock per SM). With them, a channel block's input window (TH + R - 1 rows x WH columns, zero-filled
// padding) lands once, as dense 32-byte rows, in a ring of its own, and the operand of tap (r, s) is a shifted
// view of it: tile position n = oh * WH + ow reads window row n + r * WH + s, which is one descriptor whose start
// moves by (r * WH + s) * 32 bytes. A window row is NB images side by side, each W + max(pad_left, pad_right)
// columns (the pitch), so one padding column serves as an image's left and its neighbour's right padding and
// small maps put several images in one tile (WgmmaTile::pitch; plugins/wgmma_tactics.py: _window_tiles). The 32-byte
// swizzle is applied by TMA and wgmma alike to the absolute shared-memory address (as for any K offset inside
// a swizzle atom), so a view may start at any row. Positions with ow >= OW are computed and never stored;
// the window ring's slots hold Tactic::halo_rows rows (>= the tile's positions + (R - 1) * WH + S - 1), the rows
// past the window zeroed once. Weight slots carry weights only.
//
// Stride-2 windows (3x3 stride-2 convs padded by 1 on even maps). A strided conv's taps are not
// shifts of one window of input columns, but they are of a window of column PAIRS: output column ow's taps s = 0, 1, 2
// read input columns 2ow - 1 + s, i.e. bytes (1 + s) * 32 of the 64-byte pair row ow (pairs from -1), and its rows
// 2oh - 1 + r are phase-1 row oh - 1 (r = 0), phase-0 row oh (r = 1) and phase-1 row oh (r = 2) of the input split by
// row parity. One box (64, pitch, TH + 1, 2, 1) of the view (64, W / 2, H / 2, 2, N * CB) brings a channel block's
// window [phase][TH + 1 rows][pitch pairs][64] (64-byte swizzle), and tap (r, s)'s operand is the descriptor of 64-byte
// rows (wgmma's 64-byte-swizzle K-major layout, 8-row groups 512 bytes apart) from byte phase(r) + row(r) + (1 + s) * 32:
// the K offset inside a 64-byte row, as for any K step inside a swizzle atom (plugins/wgmma_tactics.py:
// _stride2_window_tiles). The copy engine then moves 2 (TH + 1) pitch rows per channel block instead of 9 boxes of
// TH * OW rows; Tactic::halo_rows counts 64-byte rows. Small maps stack NB whole images instead (7 x 7 outputs: 4 in N 224),
// positions (i * OH + oh) * pitch + ow: there each tap row r has a window of its own, one box (64, pitch, 2 OH, NB, 1)
// with element strides (1, 1, 2, 1, 1) of the view (64, W / 2, H, N, CB) bringing rows 2oh + r - 1 of the NB images,
// the three box_bytes / 3 apart (an image's phase-1 rows with the padding row above are OH + 1, one more than its rows
// of positions). (Not kept: the two channel tiles' CTAs of a cluster sharing the
// windows, each copy engine loading one phase and multicasting it: res3 first conv2 0.0587 ms against 0.0555,
// bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/47-stride2-multicast-not-kept.json.)
// Quad windows (one image per tile, window batches): 128-byte window rows of column quads (128-byte swizzle), half the
// pairs' rows. A quad row holds two output columns' taps, so the tile's positions split by output column parity e into
// two wgmmas of N / 2 per tap: position e * N / 2 + oh * pitch + t is pixel (oh0 + oh, 2t + e), and tap (r, s) of half e
// reads 32 bytes at phase(r) + row(r) + (3 + s + 2e) * 32 (plugins/wgmma_tactics.py: _stride2_window_tiles). The output leaves by
// one TMA store per channel block and parity, of the view (32, OW / 2, 2, OH, N * KB).
#pragma once
#include "wgmma_pipeline.cuh"
#include "wgmma_s8.cuh"
#include "wgmma_tile.cuh"

namespace trtfuse {

// kWindows, consumer side, one tile: its windows are uses first .. first + windows - 1 of the window ring (the
// producer issues them in the CTA's tile order). A batch waits for every window it reads before its first
// wgmma (no spin between wgmmas), and a window goes back once every wgmma that reads it is done. `view` is
// the operand of the next k32 step: the current channel block's window (ring slot `slot`) from row r * wh + s.
// `advance` selects rather than branches: a branch between two wgmmas of a batch makes ptxas fence each one
// (WARPGROUP.ARRIVE), and with one warpgroup issuing at a time (Tactic::pingpong) the issue then falls behind the
// tensor cores.
// With Tactic::stride2_windows, tap (r, s)'s view starts at byte row_view(r) + (1 + s) * 32 of the window (see Tactic::stride2_windows): `offset`
// is kept as those bytes, the stride-1 windows' as (r * wh + s) * 32.
template <class L>
struct WindowCursor {
  // row_view0..2: where tap row r's view starts in a stride-2 window. One image: phase 1 from pair row oh - 1, phase 0
  // from oh, phase 1 from oh (phases TH + 1 rows of `pitch` pairs apart); stacked images: window r of three, each
  // box_bytes / 3 (plugins/wgmma_tactics.py: _stride2_window_tiles).
  int first, waited = 0, released = 0, slot, r = 0, s = 0, row_view0, row_view1, row_view2, offset;
  __device__ __forceinline__ WindowCursor(int first_use, const WgmmaTile& t)
      : first(first_use), slot(first_use % L::HALO_STAGES) {
    const int phase_bytes = (t.th + 1) * t.pitch * L::HALO_ROW_BYTES, row_bytes = t.pitch * L::HALO_ROW_BYTES;
    const int stacked = t.box_bytes / 3;
    row_view0 = t.nb > 1 ? 0 : phase_bytes;
    row_view1 = t.nb > 1 ? stacked : row_bytes;
    row_view2 = t.nb > 1 ? 2 * stacked : phase_bytes + row_bytes;
    offset = Tactic::stride2_windows ? s2_offset() : 0;
  }
  // the current tap (r, s) of a stride-2 window (quads: of its even half; the odd half's is 64 bytes on)
  static constexpr int kFirstTap = kQuadWindows ? 96 : 32;  // column 2ow - 1's bytes in the first window row
  __device__ __forceinline__ int s2_offset() const {
    return (r == 0 ? row_view0 : r == 1 ? row_view1 : row_view2) + kFirstTap + 32 * s;
  }
  using Ring = MbarrierRing<L::HALO_STAGES>;
  __device__ __forceinline__ void wait_for_steps_before(int k_end, const ConvParams& p, const Ring& ring) {
    for (; waited * p.R * p.S < k_end; ++waited) {
      const int use = first + waited;
      ring.wait_full({use});
      if (Profiling::timeline && threadIdx.x % 128 == 0) Profiling::stamp_window(use, 1);
    }
  }
  // Whether the next window to wait for has landed (no waiting)
  __device__ __forceinline__ bool next_landed(const Ring& ring) const { return ring.test_full({first + waited}); }
  // Every window whose k32 steps all lie before step k: one arrive per consumer warp.
  __device__ __forceinline__ void release_before(int k, int windows, const ConvParams& p, const Ring& ring, int lane) {
    for (; released < windows && (released + 1) * p.R * p.S <= k; ++released) {
      if (lane == 0) sm90::mbar_arrive(ring.empty({first + released}));
      if (Profiling::timeline && threadIdx.x % 128 == 0) Profiling::stamp_window(first + released, 2);
    }
  }
  __device__ __forceinline__ uint32_t view(uint32_t base) const {
    return base + L::HALO_OFFSET + slot * L::HALO_SLOT + offset;
  }
  // Tactic::stride2_windows, a batch of one whole 3x3 window: the descriptor of the window's slot, computed once per batch; tap j's
  // (r = j / 3, s = j % 3, compile-time constants once the batch is unrolled) is it plus s2_tap_quads(j), so no cursor
  // arithmetic runs between the wgmmas (the address field, bits 0-13, cannot carry: shared memory is under 256 KB).
  __device__ __forceinline__ uint64_t s2_window_desc(uint32_t base) const {
    const uint32_t slot_addr = base + L::HALO_OFFSET + slot * L::HALO_SLOT;
    return kQuadWindows ? sm90::desc_kmajor_sw128(slot_addr) : sm90::desc_kmajor_sw64(slot_addr);
  }
  __device__ __forceinline__ uint32_t s2_tap_quads(int j) const {
    return (uint32_t)((j / 3 == 0 ? row_view0 : j / 3 == 1 ? row_view1 : row_view2) + kFirstTap + 32 * (j % 3)) >> 4;
  }
  // past the current window: the next slot's tap (0, 0)
  __device__ __forceinline__ void next_window() {
    slot = slot + 1 == L::HALO_STAGES ? 0 : slot + 1;
    r = 0;
    s = 0;
    offset = s2_offset();
  }
  // The wgmma operand B of the current tap
  __device__ __forceinline__ uint64_t desc(uint32_t base) const {
    return Tactic::stride2_windows ? sm90::desc_kmajor_sw64(view(base)) : sm90::desc_kmajor_sw32(view(base));
  }
  // The next tap: (r, s + 1), (r + 1, 0), or the next channel block's (0, 0). Past the tile's last window the
  // views point into the ring's next slot: only steps past the GEMM-K read them, against zero weights. wh: the
  // window's width (stride 1).
  __device__ __forceinline__ void advance(const ConvParams& p, int wh) {
    const bool next_row = s + 1 == p.S, next_window = next_row && r + 1 == p.R;
    s = next_row ? 0 : s + 1;
    r = next_window ? 0 : (next_row ? r + 1 : r);
    if (Tactic::stride2_windows)
      offset = s2_offset();
    else
      offset = next_window ? 0 : offset + 32 * (next_row ? wh - p.S + 1 : 1);
    slot = next_window ? (slot + 1 == L::HALO_STAGES ? 0 : slot + 1) : slot;
  }
};

// Taps J0 .. J1 - 1 of the cursor's stride-2 3x3 window (its first k32 step k0), the views from one descriptor.
template <int J0, int J1, int BN, class L>
__device__ __forceinline__ void issue_window_taps(int (&acc)[BN / 2], uint32_t base, const WindowCursor<L>& win, int k0) {
  const uint64_t window = win.s2_window_desc(base);
#pragma unroll
  for (int j = J0; j < J1; ++j) {
    const int k = k0 + j;
    const uint64_t weight = sm90::desc_kmajor_sw128(base + (k >> 2) * L::WRES_CHUNK + 32 * (k & 3));
    if (Profiling::no_wgmma) {
    } else if constexpr (kQuadWindows) {  // the even columns' positions, then the odd ones' 64 bytes on (4 x 16)
      sm90::WgmmaS8<BN / 2>::template mma<0>(acc, weight, window + win.s2_tap_quads(j), k > 0);
      sm90::WgmmaS8<BN / 2>::template mma<BN / 4>(acc, weight, window + win.s2_tap_quads(j) + 4, k > 0);
    } else {
      sm90::WgmmaS8<BN>::mma(acc, weight, window + win.s2_tap_quads(j), k > 0);
    }
  }
}

// The channel-major ping-pong's batch body: N wgmmas of k32 steps k0 .. k0 + N - 1, operand A the resident weight (chunk
// k / 4 of 4 steps in 128-byte rows, step k % 4 in it), operand B the window cursor's taps, with no branch between them (a
// branch makes ptxas fence each wgmma). A tile's first step overwrites the accumulators. ONE_CHUNK: k0 is a multiple of 4
// and N <= 4, so the batch reads one chunk, its address computed once (the per-step k / 4, k % 4 cost w70 and w71 2 %:
// res3 conv2 0.0486 -> 0.0496 ms, res4 conv2 0.0458 -> 0.0466 in one A/B call).
template <int N, bool ONE_CHUNK, int BN, class L>
__device__ __forceinline__ void issue_resident_steps(int (&acc)[BN / 2], uint32_t base, WindowCursor<L>& win, int k0,
                                                     const ConvParams& p, int wh) {
  static_assert(!ONE_CHUNK || N <= 4, "one chunk holds 4 k32 steps");
  static_assert(!kQuadWindows || Tactic::window_batches, "quad windows: a batch per window");
  if constexpr (Tactic::stride2_windows && N == 9) {  // one stride-2 3x3 window (Tactic::window_batches)
    issue_window_taps<0, 9, BN>(acc, base, win, k0);
    win.next_window();
    return;
  }
  const uint32_t chunk = base + (k0 >> 2) * L::WRES_CHUNK;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int k = k0 + j;
    const uint32_t a = ONE_CHUNK ? chunk + 32 * j : base + (k >> 2) * L::WRES_CHUNK + 32 * (k & 3);
    if (!Profiling::no_wgmma) sm90::WgmmaS8<BN>::mma(acc, sm90::desc_kmajor_sw128(a), win.desc(base), k > 0);
    win.advance(p, wh);
  }
}

}  // namespace trtfuse
