// Consumer compute and finish, channel-major tiles (the default): consumer warpgroups 0 and 1 own 64 of the tile's
// 128 output channels each and issue wgmma.m64n{BN}k32 on one ring slot's batch of KS k32 steps at a time, keeping
// one batch in flight before releasing the previous slot. The epilogue requantizes into the staging tile, whose
// stores go out under the NEXT tile's first wgmma batch (or, kTmaOut, by one thread's TMA store).
#pragma once
#include "wgmma_producer.cuh"
#include "wgmma_staging.cuh"
#include "wgmma_windows.cuh"

namespace trtfuse {

template <int BN, int STAGES, int KS, int CH>
__device__ __forceinline__ void consume_channel_major(const sm90::TensorMap* tmap_y, const ConvParams& p, const WgmmaTile& t,
                                                      int8_t* s_out, uint32_t base, const CtaWork& cta) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, false>;
  constexpr int CONSUMERS = 128 * Tactic::consumers;
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = cta.tid, wg = cta.wg, lane = tid % 32, warp = (tid % 128) / 32;
  const int ohw = cta.ohw, kpad = cta.kpad, kblocks = cta.kblocks, windows = cta.windows, wh = cta.wh;
  const MbarrierRing<STAGES> ring{base + L::BAR_OFFSET, base + L::BAR_OFFSET + STAGES * 8};
  const typename WindowCursor<L>::Ring window_ring{base + L::HALO_BARS, base + L::HALO_BARS + L::HALO_STAGES * 8};
  // A slot is free for the copy engines once every consumer warp that reads it is done: with multicast,
  // those of both CTAs (the partner's engine writes into this CTA's slot too).
  auto release_slot = [](uint32_t empty) {
    if (Tactic::multicast) {
      sm90::mbar_arrive_cluster(empty, 0);
      sm90::mbar_arrive_cluster(empty, 1);
    } else {
      sm90::mbar_arrive(empty);
    }
  };
  const bool has_res = p.residual != nullptr;
  const int c_lo = wg * 64 + warp * 16 + lane / 4;  // tile channel of this thread's accumulator rows (and + 8)
  // kTmaOut: the weight rows are permuted, so accumulator rows 16w + g and 16w + g + 8 of the warpgroup's warp w are its
  // channels 16w + 2g and 16w + 2g + 1, adjacent bytes of staging block 2 wg + w / 2 (32-byte swizzle: the half flips in
  // rows 4-7); `pair_cell` is the thread's pixel 2(lane % 4) there.
  const int c_pair = wg * 64 + warp * 16 + 2 * (lane / 4);
  const int pair_cell = (2 * wg + warp / 2) * BN * 32 + 2 * (lane % 4) * 32 + ((16 * (warp % 2) + 2 * (lane / 4)) ^ (lane % 4 >= 2 ? 16 : 0));
  const EpilogueScalars es(p, has_res);
  const uint32_t a_rows = wg * 64 * (kWeightBox128 ? 128 : 32);  // this warpgroup's 64 weight rows inside the A tile
  using Tile = TileCoord;
  auto issue_residual = [&](const Tile& tc, int8_t* staging) {
    residual_to_staging<BN, CH, CONSUMERS, L::OUT_STRIDE>(p, tc, ohw, kpad, tid, t, staging);
  };
  auto store = [&](const Tile& tc, const int8_t* staging) {
    store_staging<BN, CH, CONSUMERS, L::OUT_STRIDE>(p, tc, ohw, kpad, tid, t, staging, !has_res);
  };
  // A tile's output leaves the staging tile during the NEXT tile's first wgmma batch (the tensor cores
  // work while the consumers store), so the epilogue's stores never idle the tensor cores.
  bool pending = false;
  Tile pending_tc(blockIdx.x, p, t, ohw, CH);
  const int8_t* pending_staging = s_out;
  PipelineState<STAGES> it{0};  // continuous across tiles, the producer's sequence
  int local = 0;  // tiles this CTA has done
  // Zeroed once: a tile's first wgmma overwrites them (accumulate = false).
  int acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
  for (int tile = blockIdx.x; tile < t.tiles; tile += cta.tile_step, ++local) {
    const Tile tc(tile, p, t, ohw, CH);
    int8_t* staging = s_out + (Tactic::staging == 2 ? (local & 1) * L::OUT_BYTES : 0);
    const bool res_now = has_res && Profiling::channel_major_residual;
    // Two staging tiles: this tile's residual can stream in now (the other tile holds the pending output).
    if (Tactic::staging == 2 && res_now) issue_residual(tc, staging);
    cp_async_commit();
    const ChannelPairFactors factors(p, tc.c0 + (kTmaOut ? c_pair : c_lo), kpad, kTmaOut ? 1 : 8);  // used in the epilogue

    WindowCursor<L> win(local * windows, t);  // kWindows
    // One ring slot's batch of k32 steps. `whole`: all KS of them, with no branch between the wgmmas (a branch makes
    // ptxas fence each wgmma, and a merge after a batch costs it a dummy wgmma); steps past the GEMM-K then read the
    // 128-byte weight box's zero fill (windows: against the next window slot) and add nothing. Windows always take
    // whole batches; the other tiles peel the GEMM-K's short last batch off the loop instead, since issuing its
    // zero-weight steps cost res2 conv3 +res (GEMM-K 64) 6 % (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/
    // 35-unbranched-batches-res-*.json).
    auto batch = [&](int kb, bool whole) {
      const int slot = it.index();
      if (!Profiling::no_ring) ring.wait_full(it);
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      if (L::HALO && !Profiling::no_ring) win.wait_for_steps_before(kb * KS + steps, p, window_ring);
      __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
      const uint32_t sa = base + slot * L::STAGE + a_rows, sb = base + slot * L::STAGE + L::A_IN_SLOT;
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        if (!whole && j >= steps) continue;
        if (!Profiling::no_wgmma)
          sm90::WgmmaS8<BN>::mma(acc, kWeightBox128 ? sm90::desc_kmajor_sw128(sa + j * 32) : sm90::desc_kmajor_sw32(sa + j * L::A_STEP),
                                 L::HALO ? win.desc(base) : sm90::desc_kmajor_sw32(sb + j * L::B_STEP), kb * KS + j > 0);
        if (L::HALO) win.advance(p, wh);
      }
      sm90::wgmma_commit();
      if (kb == 0) {
        // Under the first batch: the previous tile's stores, then (one staging tile) this tile's residual
        // into the staging tile they have just emptied.
        if (pending && !Profiling::no_stores) store(pending_tc, pending_staging);
        pending = false;
        if (Tactic::staging == 1 && res_now) {
          if (kTmaOut && tid == 0) sm90::bulk_wait_group_read_all();  // the previous tile's TMA store has read it
          sm90::named_barrier(1, CONSUMERS);  // every consumer's stores have read the staging tile
          issue_residual(tc, staging);
        }
        cp_async_commit();
      }
      sm90::wgmma_wait<1>();  // the previous slot's batch is done: hand that slot back to the producer
      if (kb > 0 && lane == 0 && !Profiling::no_ring) release_slot(ring.empty(it.previous()));
      if (L::HALO && !Profiling::no_ring) win.release_before(kb * KS, windows, p, window_ring, lane);
      __syncwarp();
      ++it;
    };
    // (Only 128-byte weight boxes read as zeros past the GEMM-K: the 32-byte-box tactics take every batch with steps.)
    const int whole_batches = !kWeightBox128 ? 0 : L::HALO ? kblocks : t.kt / KS;
    for (int kb = 0; kb < whole_batches; ++kb) batch(kb, true);
    for (int kb = whole_batches; kb < kblocks; ++kb) batch(kb, false);
    sm90::wgmma_wait<0>();
    if (lane == 0 && !Profiling::no_ring) release_slot(ring.empty(it.previous()));  // the tile's last slot
    if (L::HALO && !Profiling::no_ring) win.release_before(t.kt, windows, p, window_ring, lane);
    __syncwarp();

    if (Profiling::skips_epilogue) {
      Profiling::keep_accumulators_live(acc, p, tid);
      continue;
    }
    // ---------- epilogue: requantize into the staging tile; the stores go out under the next tile (kTmaOut: by TMA) ----------
    cp_async_wait<0>();
    if (kTmaOut && tid == 0) sm90::bulk_wait_group_read_all();  // the previous tile's TMA store has read the staging tile
    sm90::named_barrier(1, CONSUMERS);  // every consumer's residual copies have landed (and the stores read their tile)
    if constexpr (kTmaOut) {
      factors.requantize_for_tma<BN>(acc, staging + pair_cell, es, has_res);
    } else {
      factors.requantize<BN, L::OUT_STRIDE>(acc, staging + 2 * (lane % 4) * L::OUT_STRIDE + c_lo, lane, es, has_res);
    }
    sm90::named_barrier(1, CONSUMERS);  // the whole staging tile is written before anyone stores from it
    if (kTmaOut && tid == 0 && !Profiling::no_stores) store_staging_by_tma<BN, CH>(tmap_y, staging, tc, t, kpad);
    pending = !kTmaOut;
    pending_tc = tc;
    pending_staging = staging;
  }
  if (pending && !Profiling::no_stores) store(pending_tc, pending_staging);
  if (kTmaOut && tid == 0) sm90::bulk_wait_group_all();  // the stores are done before the CTA's shared memory goes
  // No CTA of a pair leaves while its partner may still arrive on its barriers.
  if (Tactic::multicast) sm90::cluster_sync();
}

}  // namespace trtfuse
