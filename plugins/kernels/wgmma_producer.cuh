// Producer load: the producer warpgroup's thread that drives the copy engine (and, with Tactic::window_warp, a second
// one that issues the windows only). Per ring slot it waits for the consumers to release the slot, then issues the
// slot's weight box(es) and activation boxes onto its "full" mbarrier; window tiles load one window per 32-channel
// block into a ring of its own, and resident weights land once per CTA.
//
// Loaders, one per way the activation reaches shared memory:
//   row boxes      one box per k32 step of the 5-D view (32, W, H, CB, N): TH output rows (or NB images) of one tap;
//   multicast      the same, each CTA of a cluster loading every other k32 step into both CTAs;
//   flat           groups of 8 consecutive pixels, one box per box_groups groups x a slot's KS channel blocks;
//   windows        one window per channel block (wgmma_windows.cuh): stride 1, stride-2 pairs or quads, or stacked images.
// Flat tiles (pixel-major, 1x1 unpadded convs; stride 1, or stride 2 in 8-image groups): a row tile holds whole output rows,
// so a map whose rows do not fill the tile's 64 or 128 wgmma rows computes rows that are never stored, and the
// epilogue, which bounds these layers (docs/PERF.md), pays for every computed row. A flat tile is Tactic::bm
// consecutive pixels of the linear output index: Tactic::bm / 8 groups of 8 pixels, group q = pixels 8(q % G) .. of
// image q / G (G = OH * OW / 8 groups per image), so only the batch's last tile has rows that are not pixels. The
// activation is viewed as (32, 8, CB, G, N) and one box (32, 8, KS, GB, 1) brings GB groups x a slot's KS channel
// blocks; GB divides G, so no box crosses an image. A box lands [group][block][8 pixels][32], so a slot is
// [group][k32 step][8][32]: k32 step s of the tile is the 32-byte-swizzled K-major operand from s * 256 with 8-row
// groups KS * 256 bytes apart (the descriptor's stride byte offset). Maps whose pixels do not come in 8s (14 x 14,
// 7 x 7) with a batch of whole 8s take a group as one pixel of 8 images instead (t.group_images 8): the view
// (32, 8 images, CB, OH * OW, N / 8), boxes of 4 groups, each set's OH * OW groups rounded up to whole boxes (7 x 7: 52,
// the 3 past the map zero-filled and not stored), so these maps compute few rows that are not pixels; tile row 8q + i is
// image 8 (q / G) + i (tile_row_offset). At stride 2 (the downsamples; 8-image groups on every map, since 8 pixels of a
// 28-pixel row may span two rows) the view is (32, N, CB, OW, OH) with the input's doubled column and row strides, and a
// box brings 8 images x the slot's blocks x 1, 2 or 4 pixels of one output row (the most that divide OW, so no box
// crosses a row); it lands the same [group][block][8][32]. Bigger boxes than one group per k32 step matter:
// the copy engine takes ~150 clocks per 512-byte box, so one box per group and k32 step left res3 conv3 bound by the
// copies (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/17-flat-per-group-boxes-not-kept.json).
#pragma once
#include "wgmma_pipeline.cuh"
#include "wgmma_tile.cuh"

namespace trtfuse {

// The CTA's channel tile's whole weight (the same for all its tiles), once, as 128-byte chunks: pixel-major rows
// permuted as the slot's box (load_slot_weights), the ping-pong tile's in pairs, else plain CH rows x 128 bytes per
// chunk, 128-byte swizzle, the A operand of all 4 steps.
template <class L, int CH, bool PIXM>
__device__ __forceinline__ void load_resident_weights(const sm90::TensorMap* tmap_w, uint32_t base, uint32_t wres_full,
                                                      const ConvParams& p, const WgmmaTile& t, int ohw) {
  const int chunks = (t.kt + 3) / 4, c0 = TileCoord(blockIdx.x, p, t, ohw, CH).c0;
  sm90::mbar_arrive_expect_tx(wres_full, chunks * L::WRES_CHUNK);
  for (int c = 0; c < chunks; ++c) {
    if (PIXM)
      sm90::tma_load_5d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, 0, 0, 0, c0 / 32);
    else if (kChannelPingpong)  // (KGpad, 8, 2, Kpad/16, 1): box row 16u + 8h + g is channel 16u + 2g + h
      sm90::tma_load_5d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, 0, 0, c0 / 16, 0);
    else
      sm90::tma_load_2d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, c0);
  }
}

// Channel block cb's window into window slot `slot`: stacked images, stride-2 pairs / quads, or stride-1 rows.
template <class L>
__device__ __forceinline__ void load_window(uint32_t slot, const sm90::TensorMap* tmap_x, uint32_t full, const TileCoord& tc,
                                            const WgmmaTile& t, int cb, int windows, int h0, int w0) {
  if (Tactic::stride2_windows && t.nb > 1) {  // stacked images, the view (64, W / 2, H, N, CB): tap row r's rows 2oh + r - 1
    for (int r = 0; r < 3; ++r)
      sm90::tma_load_5d(slot + r * (t.box_bytes / 3), tmap_x, full, 0, -1, r - 1, tc.n0, cb);
  } else if (Tactic::stride2_windows) {  // the pair view (64, W / 2, H / 2, 2, N * CB): pairs from -1, rows of both phases from oh0 - 1
    sm90::tma_load_5d(slot, tmap_x, full, 0, -1, tc.oh0 - 1, 0, tc.n0 * windows + cb);
  } else  // the window view (32, W, N, H, CB) of the activation (plugins/wgmma.py): NB images side by side
    sm90::tma_load_5d(slot, tmap_x, full, 0, w0, tc.n0, h0, cb);
}

// A ring slot's weights as whole 128-byte boxes (k32 steps past the GEMM-K read as zeros).
template <class L, int KS, bool PIXM>
__device__ __forceinline__ void load_slot_weights(uint32_t sa, const sm90::TensorMap* tmap_w, uint32_t full, int kb, const TileCoord& tc) {
  if (PIXM) {
    // 5-D view (KGpad, 2, 4, 4, Kpad/32) of the packed weight: row e + 2q + 8jj + 32b of the box is
    // channel c0 + 32b + 8q + 2jj + e (plugins/wgmma.py), which is wgmma column 8(4b + jj) + 2q + e.
    sm90::tma_load_5d(sa, tmap_w, full, kb * KS * 32, 0, 0, 0, tc.c0 / 32);
  } else if (kWeightBox128 && kTmaOut) {  // (KGpad, 8, 2, Kpad/16, 1): box row 16u + 8h + g is channel 16u + 2g + h
    sm90::tma_load_5d(sa, tmap_w, full, kb * KS * 32, 0, 0, tc.c0 / 16, 0);
  } else if (kWeightBox128) {
    sm90::tma_load_2d(sa, tmap_w, full, kb * KS * 32, tc.c0);
  }
}

// The flat tile's slot: its boxes, each GB groups x the slot's KS channel blocks (1x1: k32 step k is block k; blocks
// past CB zero-filled). Boxes past the batch (its last tile) load the batch's last box again: their rows are never
// stored, and no box lies wholly outside the tensor.
template <int KS>
__device__ __forceinline__ void load_flat_slot(uint32_t sb, const sm90::TensorMap* tmap_x, uint32_t full, int kb, const TileCoord& tc,
                                               const ConvParams& p, const WgmmaTile& t, bool first_step) {
  const int last_box = flat_groups(p, t) - t.box_groups;
  for (int g = 0; first_step && g < kFlatGroupsPerTile; g += t.box_groups) {
    const int q = min(tc.m0 / kFlatGroup + g, last_box), n = t.div_groups.div(q), pix = q - n * t.groups_per_set;
    if (p.stride_w == 1) {
      sm90::tma_load_5d(sb + g * KS * 256, tmap_x, full, 0, 0, kb * KS, pix, n);
    } else {  // the strided view (32, N, CB, OW, OH): images 8n .. 8n + 7 at output pixel (oh, ow) of one row
      const int oh = p.div_ow.div(pix);
      sm90::tma_load_5d(sb + g * KS * 256, tmap_x, full, 0, 8 * n, kb * KS, pix - oh * p.OW, oh);
    }
  }
}

template <int BN, int STAGES, int KS, bool PERSISTENT, int CH, bool PIXM>
__device__ __forceinline__ void produce(const sm90::TensorMap* tmap_w, const sm90::TensorMap* tmap_x, const ConvParams& p,
                                        const WgmmaTile& t, uint32_t base, const CtaWork& cta, uint32_t rank, bool weight_thread) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, PIXM>;
  constexpr int CONSUMERS = 128 * Tactic::consumers;
  constexpr bool kWindowWarp = Tactic::window_warp && L::HALO && !kChannelPingpong;
  const MbarrierRing<STAGES> ring{base + L::BAR_OFFSET, base + L::BAR_OFFSET + STAGES * 8};
  const uint32_t wres_full = ring.empty0 + STAGES * 8;
  const MbarrierRing<L::HALO_STAGES> window_ring{base + L::HALO_BARS, base + L::HALO_BARS + L::HALO_STAGES * 8};
  const int ohw = cta.ohw, kblocks = cta.kblocks, windows = cta.windows;
  sm90::regs_dealloc<kProducerRegs>();
  const bool window_thread = kWindowWarp && cta.tid == CONSUMERS + 32;  // (Tactic::window_warp) issues the windows only
  if ((weight_thread || window_thread) && !Profiling::no_ring) {
    // What the copy engine moves (profiling builds: nothing, only weights or only activations); resident weights
    // once, below, instead of in every slot.
    constexpr bool kCopyWeights = !Profiling::no_copies && !Profiling::no_weight_copies && Profiling::copies_weights;
    constexpr bool kLoadActivations = !Profiling::no_copies && Profiling::loads_activations;
    constexpr bool kLoadWeights = kCopyWeights && !L::WRES;  // per ring slot
    sm90::prefetch_tensor_map(tmap_w);
    sm90::prefetch_tensor_map(tmap_x);
    if (L::WRES && (int)blockIdx.x < t.tiles && kCopyWeights) {  // (never the window thread: its tiles stream weights)
      load_resident_weights<L, CH, PIXM>(tmap_w, base, wres_full, p, t, ohw);
    } else if (L::WRES) {
      sm90::mbar_arrive(wres_full);
    }
    if (Tactic::pdl && weight_thread) sm90::wait_for_prerequisites();
    PipelineState<STAGES> it{0};
    for (int tile = blockIdx.x, local = 0; tile < t.tiles; tile += cta.tile_step, ++local) {
      const TileCoord tc(tile, p, t, ohw, CH);
      const int h0 = tc.oh0 * p.stride_h - p.pad_top, w0 = -p.pad_left;
      // channel block cb's window, the tile's (local * windows + cb)-th use of the window ring
      auto issue_window = [&](int cb) {
        const PipelineState<L::HALO_STAGES> use{local * windows + cb};
        const uint32_t full = window_ring.full(use);
        if (Profiling::timeline) Profiling::stamp_window(use.count, 3);
        window_ring.wait_empty(use);
        if (Profiling::timeline) Profiling::stamp_window(use.count, 0);
        if (!kLoadActivations) {
          sm90::mbar_arrive(full);
        } else {
          sm90::mbar_arrive_expect_tx(full, t.box_bytes);
          load_window<L>(base + L::HALO_OFFSET + use.index() * L::HALO_SLOT, tmap_x, full, tc, t, cb, windows, h0, w0);
        }
      };
      if (kChannelPingpong || window_thread) {  // resident weights (or the window thread): windows only
        for (int cb = 0; cb < windows; ++cb) issue_window(cb);
        continue;
      }
      int cb = 0, r = 0, s = 0;  // tap of k32 step k = (cb * R + r) * S + s (the packed weight's GEMM-K order)
      for (int kb = 0; kb < kblocks; ++kb, ++it) {
        const int slot = it.index();
        ring.wait_empty(it);
        const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
        const uint32_t full = ring.full(it);
        // A 128-byte weight box always lands whole (k32 steps past the GEMM-K read as zeros). Profiling
        // builds without copies still arrive on every barrier, so the ring keeps its turns.
        const int a_bytes = !kLoadWeights ? 0 : (kWeightBox128 ? KS * L::A_STEP : steps * L::A_STEP);
        const int act_steps = Tactic::flat ? KS : steps;  // a flat box brings KS blocks, those past CB zero-filled
        sm90::mbar_arrive_expect_tx(full, a_bytes + (L::HALO || !kLoadActivations ? 0 : act_steps * t.box_bytes));
        const uint32_t sa = base + L::RING_OFFSET + slot * L::STAGE, sb = sa + L::A_IN_SLOT;
        if (kLoadWeights) load_slot_weights<L, KS, PIXM>(sa, tmap_w, full, kb, tc);
        for (int j = 0; j < steps; ++j) {
          const int k = kb * KS + j;
          if (kLoadWeights && !kWeightBox128) sm90::tma_load_2d(sa + j * L::A_STEP, tmap_w, full, k * 32, tc.c0);
          if (L::HALO) {
            if (!kWindowWarp && r == 0 && s == 0) issue_window(cb);  // after the weight slot it is first used with
          } else if (!kLoadActivations) {
          } else if (Tactic::flat) {
            load_flat_slot<KS>(sb, tmap_x, full, kb, tc, p, t, j == 0);
          } else if (!Tactic::multicast) {
            sm90::tma_load_5d(sb + j * L::B_STEP, tmap_x, full, 0, w0 + s, h0 + r, cb, tc.n0);
          } else if ((j & 1) == (int)rank) {
            sm90::tma_load_5d_multicast(sb + j * L::B_STEP, tmap_x, full, 0, w0 + s, h0 + r, cb, tc.n0, 0x3);
          }
          if (++s == p.S) {
            s = 0;
            if (++r == p.R) { r = 0; ++cb; }
          }
        }
      }
    }
  }
  if (Tactic::pdl == 3 && weight_thread) sm90::launch_dependents();  // every copy of the CTA's is issued
  __syncwarp();
  if (Tactic::multicast) sm90::cluster_sync();  // matches the consumers' final one
}

}  // namespace trtfuse
