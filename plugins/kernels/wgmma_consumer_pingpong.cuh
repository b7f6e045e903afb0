// Consumer compute and finish, the channel-major ping-pong tile: each consumer warpgroup a whole 64-channel window tile
// of its own, the two taking the tensor cores in turn, the epilogue of one under the other's main loop.
#pragma once
#include "wgmma_staging.cuh"
#include "wgmma_windows.cuh"

namespace trtfuse {

// ---------------- channel-major ping-pong consumers (Tactic::pingpong, channel-major) ----------------
// Warpgroup g takes the CTA's tiles g, g + 2, ...: each a whole tile of CH = 64 channels (its wgmma M) x BN window
// positions (its N), operand A the resident weight, B the window views. Before issuing tile i > 0 it waits on
// barrier kTurn + g for the other warpgroup to have issued tile i - 1 (the CTA's tile order, the producer's), and
// once its last batch is committed it hands the turn on, so the tensor cores take the tiles back to back while
// the warpgroup drains its last batch, requantizes into its own staging tile and hands it to the copy engine (a TMA
// store per channel block), all under the other's main loop. The turn barrier also orders the store's reads of the
// staging tile (its issuing thread waits for them first) before the next tile's residual copies and staging writes
// (every one of the warpgroup's threads takes part in it).
template <int BN, int STAGES, int KS, int CH>
__device__ __forceinline__ void consume_channel_pingpong(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base,
                                                         const sm90::TensorMap* tmap_y) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, false>;
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = threadIdx.x, lane = tid % 32, warp = (tid % 128) / 32, ct = tid % 128;
  // Warp-uniform as the compiler sees it: the tile loop starts at a warpgroup-dependent tile (see consume_pixel_major).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int ohw = p.OH * p.OW, kpad = (p.K + 31) / 32 * 32;
  const int kblocks = (t.kt + KS - 1) / KS, windows = t.kt / (p.R * p.S), wh = t.nb * t.pitch;
  const uint32_t wres_full = base + L::BAR_OFFSET + 2 * STAGES * 8;
  const typename WindowCursor<L>::Ring window_ring{base + L::HALO_BARS, base + L::HALO_BARS + L::HALO_STAGES * 8};
  int8_t* const staging = smem + L::OUT_OFFSET + wg * L::OUT_BYTES;
  const bool has_res = p.residual != nullptr && Profiling::channel_major_residual;
  const EpilogueScalars es(p, has_res);
  // The weight rows are permuted (plugins/wgmma.py): accumulator rows 16w + g and 16w + g + 8 of warp w are channels
  // 16w + 2g and 16w + 2g + 1, adjacent bytes of staging block w / 2 (32-byte swizzle: the half flips in rows 4-7).
  const int c_pair = warp * 16 + 2 * (lane / 4);
  int8_t* const cells = staging + (warp / 2) * BN * 32 + 2 * (lane % 4) * 32 + ((16 * (warp % 2) + 2 * (lane / 4)) ^ (lane % 4 >= 2 ? 16 : 0));
  constexpr int kStagingBar = 1, kTurn = 3;  // named barriers: 1 + g (the warpgroup), 3 + g (its turn)
  constexpr int kInFlight = Tactic::pp_inflight;  // batches left in flight while the next is prepared
  constexpr bool kWindowBatches = Tactic::window_batches != 0;
  constexpr int kEarlyRelease = Tactic::early_release;  // (stride-2 window batches) taps issued before the last window goes back
  constexpr int kTaps = 9;  // (Tactic::window_batches) 3x3 windows: the host takes no other filter for it
  if (kWindowBatches && p.R * p.S != kTaps) __trap();
  // The CTA stays on one channel tile (its resident weights): the host's grid is a multiple of the channel tiles.
  if ((int)gridDim.x < t.tiles && gridDim.x % t.ch_tiles != 0) __trap();
  auto tile_of = [&](int i) { return (int)blockIdx.x + i * (int)gridDim.x; };  // the CTA's i-th tile
  int acc[BN / 2];  // zeroed once: a tile's first wgmma overwrites them (accumulate = false)
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
  if (!Profiling::no_copies) sm90::mbar_wait(wres_full, 0);
  for (int i = wg, tile = tile_of(wg); tile < t.tiles; i += 2, tile += 2 * gridDim.x) {
    const TileCoord tc(tile, p, t, ohw, CH);
    const ChannelPairFactors factors(p, tc.c0 + c_pair, kpad, 1);  // loaded now, used in the epilogue
    if (Profiling::epilogue_alone) Profiling::opaque_accumulators(acc);
    auto stamp = [&](int point) { Profiling::stamp_tile(ct, wg, i, point); };  // the timeline build's clocks
    if (ct == 0) sm90::bulk_wait_group_read_all();  // this warpgroup's previous TMA store has read the staging tile
    stamp(0);
    if (i > 0) sm90::named_barrier(kTurn + wg, 256);  // the CTA's tile i - 1 is issued; the staging tile is free
    stamp(1);
    if (has_res) residual_to_staging<BN, CH, 128, L::OUT_STRIDE>(p, tc, ohw, kpad, ct, t, staging);
    cp_async_commit();
    WindowCursor<L> win(i * windows, t);
    if constexpr (kWindowBatches) {
      // One batch per window (its R * S = 9 taps), so no batch reads two windows: a window goes back as soon as its own
      // batch is done. When the next window has not landed, the warpgroup first drains and releases the last one, so
      // its slot goes back to the copy engine while the warpgroup waits (with batches of 4 steps, the batch that
      // straddled two windows held the first until the second had landed).
      for (int w = 0; w < windows; ++w) {
        if (!Profiling::no_ring) {
          if (w > 0 && !win.next_landed(window_ring)) {
            sm90::wgmma_wait<0>();
            win.release_before(w * kTaps, windows, p, window_ring, lane);
          }
          win.wait_for_steps_before((w + 1) * kTaps, p, window_ring);
        }
        if (w == 0) stamp(2);
        __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
        sm90::wgmma_fence();
        if constexpr (kEarlyRelease > 0) {
          // The batch's first taps, then window w - 1 goes back as soon as its batch is done, then the rest: a wgmma's
          // issue waits for room in the tensor cores' queue, so issuing the whole batch first held the last window
          // about a batch's time longer (the timeline's window held ~2,700 clocks, its batch ~1,230).
          issue_window_taps<0, kEarlyRelease, BN>(acc, base, win, w * kTaps);
          sm90::wgmma_commit();
          sm90::wgmma_wait<1>();  // window w - 1's batch is done
          if (!Profiling::no_ring) win.release_before(w * kTaps, windows, p, window_ring, lane);
          issue_window_taps<kEarlyRelease, kTaps, BN>(acc, base, win, w * kTaps);
          win.next_window();
        } else {
          issue_resident_steps<kTaps, false, BN>(acc, base, win, w * kTaps, p, wh);
        }
        sm90::wgmma_commit();
        if (w == windows - 1 && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - wg, 256);
        if (w == windows - 1) stamp(3);
        if constexpr (kEarlyRelease == 0) {
          sm90::wgmma_wait<1>();  // window w - 1's batch is done
          if (!Profiling::no_ring) win.release_before(w * kTaps, windows, p, window_ring, lane);
        }
        __syncwarp();
      }
    } else
    for (int kb = 0; kb < kblocks; ++kb) {
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      if (!Profiling::no_ring) win.wait_for_steps_before(kb * KS + steps, p, window_ring);
      if (kb == 0) stamp(2);
      __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
      sm90::wgmma_fence();
      issue_resident_steps<KS, true, BN>(acc, base, win, kb * KS, p, wh);  // steps past the GEMM-K have zero weights
      sm90::wgmma_commit();
      // Every wgmma of the tile is issued: the other warpgroup's next tile may queue behind them.
      if (kb == kblocks - 1 && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - wg, 256);
      if (kb == kblocks - 1) stamp(3);
      sm90::wgmma_wait<kInFlight>();  // batches up to kb - kInFlight are done: their windows may go back
      if (!Profiling::no_ring) win.release_before((kb + 1 - kInFlight) * KS, windows, p, window_ring, lane);
      __syncwarp();
    }
    sm90::wgmma_wait<0>();
    stamp(4);
    if (!Profiling::no_ring) win.release_before(t.kt, windows, p, window_ring, lane);
    __syncwarp();
    if (Profiling::skips_epilogue) {
      Profiling::keep_accumulators_live(acc, p, tid);
      stamp(5);
      continue;
    }
    cp_async_wait<0>();
    sm90::named_barrier(kStagingBar + wg, 128);  // the warpgroup's residual copies have landed
    factors.requantize_for_tma<BN>(acc, cells, es, has_res);
    sm90::named_barrier(kStagingBar + wg, 128);  // the whole staging tile is written before it is stored
    // The tile leaves by TMA store. Stored by the consumer threads, 16 bytes each, the stores made the epilogue outlast
    // the other warpgroup's main loop (res3 conv2 w70 0.0578 ms, 0.0480 without them:
    // bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/40-pingpong-epilogue.json).
    if (ct == 0 && !Profiling::no_stores) store_staging_by_tma<BN, CH>(tmap_y, staging, tc, t, kpad);
    stamp(5);
  }
  cp_async_wait<0>();
  if (ct == 0) sm90::bulk_wait_group_all();  // the stores are done before the CTA's shared memory goes
}

}  // namespace trtfuse
