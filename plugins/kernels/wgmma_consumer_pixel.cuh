// Consumer compute and finish, pixel-major tiles: pixels on wgmma's M, channels on its N, the weight slot operand B
// shared by the tile's warpgroups, the epilogue straight from registers (wgmma_pixel_epilogue.cuh).
#pragma once
#include "wgmma_pipeline.cuh"
#include "wgmma_pixel_epilogue.cuh"
#include "wgmma_s8.cuh"

namespace trtfuse {

// ---------------- pixel-major consumers (Tactic::pixel_major) ----------------
// A tile is BN pixels x CH channels, computed by a group of BN / 64 consumer warpgroups (warpgroup `part` of
// the group owning tile pixels 64 part .. 64 part + 63); the CTA's GROUPS groups take its tiles in turn
// (group g: the CTA's tiles g, g + GROUPS, ...), so while one group requantizes the others keep the tensor
// cores busy. Thread (warp, lane) holds pixels px_h = 64 part + 16 warp + lane / 4 + 8 h (h = 0, 1) and,
// per 32-channel block b, channels 32b + 8 (lane % 4) .. + 7 of each: one 8-byte residual read and one
// 8-byte CHW32 store per (pixel, block), the 8 lanes of a lane%4 class covering 8 consecutive pixels'
// 32-byte vectors. No CTA-wide barrier per tile: each warp prefetches its own residual slice of its group's
// NEXT tile right after this tile's main loop (two residual buffers), so it has this tile's epilogue and
// the next tile's main loop to land.
template <int BN, int STAGES, int KS, int CH, bool PERSISTENT>
__device__ __forceinline__ void consume_pixel_major(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, true>;
  constexpr int TILE_WGS = BN / 64, GROUPS = L::GROUPS;
  static_assert(BN % 64 == 0 && Tactic::consumers % TILE_WGS == 0, "whole consumer warpgroups x m64 pixels per tile");
  static_assert(L::OUT_BYTES == 4 * Tactic::consumers * ResidualSlice<CH>::BYTES, "a residual buffer is every consumer warp's slice");
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  // Warp-uniform as the compiler sees it (a shuffle from lane 0): the tile loop below starts at a
  // group-dependent tile, and a trip count that might differ inside a warp would serialize the wgmmas.
  const int group = __shfl_sync(0xffffffffu, wg / TILE_WGS, 0), part = wg % TILE_WGS;
  const int ohw = p.OH * p.OW, kpad = (p.K + 31) / 32 * 32;
  const int kblocks = (t.kt + KS - 1) / KS;
  const int tile_step = PERSISTENT ? gridDim.x : t.tiles;
  const MbarrierRing<STAGES> ring{base + L::BAR_OFFSET, base + L::BAR_OFFSET + STAGES * 8};
  const uint32_t wres_full = ring.empty0 + STAGES * 8;
  float* s_scale = reinterpret_cast<float*>(smem + L::FACTOR_OFFSET) + group * 2 * CH;
  float* s_bias = s_scale + CH;
  if (L::BUFFERS == 0 && p.residual != nullptr) __trap();  // a tactic without residual buffers given a residual layer
  const bool has_res = L::BUFFERS > 0 && p.residual != nullptr && Profiling::pixel_major_residual;
  const bool load_res = has_res && !Profiling::no_residual_loads;
  const EpilogueScalars es(p, has_res);
  const int first_px = 64 * part + 16 * warp;  // this warp's 16 pixels of the tile
  const int px[2] = {first_px + lane / 4, first_px + lane / 4 + 8};
  int8_t* const slice0 = smem + L::OUT_OFFSET + (tid / 32) * ResidualSlice<CH>::BYTES;  // + L::OUT_BYTES: the other buffer
  // this warpgroup's 64 activation rows inside a k32 step (Tactic::flat: 8 groups of [KS][8][32] inside the slot)
  const uint32_t a_rows = part * 64 * (Tactic::flat ? KS * 32 : 32);
  auto tile_of = [&](int i) { return (int)blockIdx.x + i * tile_step; };  // the CTA's i-th tile
  // Tactic::pingpong: group g waits for its turn on barrier kTurn + g, which the other group's arrival completes.
  constexpr bool PINGPONG = Tactic::pingpong != 0;
  static_assert(!PINGPONG || GROUPS == 2, "ping-pong alternates two tile groups");
  constexpr int kTurn = 1 + 2 * GROUPS, kTurnThreads = 2 * 128 * TILE_WGS;
  if (load_res && tile_of(group) < t.tiles)
    ResidualSlice<CH>::load(slice0, p, t, TileCoord(tile_of(group), p, t, ohw, CH), first_px, ohw, kpad, lane);
  cp_async_commit();
  // Resident weights: the CTA stays on one channel tile (the host's grid is a multiple of the channel tiles,
  // or covers every tile once), so its folded factors are loaded once, here.
  if (L::WRES && (int)gridDim.x < t.tiles && gridDim.x % t.ch_tiles != 0) __trap();
  auto load_factors = [&](int c0) {
    for (int c = tid % (128 * TILE_WGS); c < CH; c += 128 * TILE_WGS) {
      const int cc = min(c0 + c, kpad - 1);  // channels past Kpad: computed, never stored
      s_scale[c] = es.fold(p.scale[cc]);
      s_bias[c] = es.fold(p.bias[cc]);
    }
    sm90::named_barrier(1 + group, 128 * TILE_WGS);
  };
  if (L::WRES) {
    load_factors(TileCoord(blockIdx.x, p, t, ohw, CH).c0);
    sm90::mbar_wait(wres_full, 0);
  }
  int factors_c0 = -1;  // without resident weights: the channel tile whose folded factors are in s_scale / s_bias
  // Zeroed once: a tile's first wgmma overwrites them (accumulate = false), so a tile costs no zeroing
  // instructions (half an instruction per element on the epilogue-bound layers).
  int acc[CH / 2];
#pragma unroll
  for (int k = 0; k < CH / 2; ++k) acc[k] = 0;
  for (int i = group, j = 0, tile = tile_of(group); tile < t.tiles; i += GROUPS, ++j, tile += GROUPS * tile_step) {
    const TileCoord tc(tile, p, t, ohw, CH);
    if (Profiling::epilogue_alone) Profiling::opaque_accumulators(acc);
    PipelineState<STAGES> it{i * kblocks};  // this tile's first k-block's (the producer walks the tiles in order)
    if (PINGPONG && i > 0) sm90::named_barrier(kTurn + group, kTurnThreads);  // the CTA's tile i - 1 is issued
    auto batch = [&](int kb, bool whole) {  // as the channel-major loop's: whole batches have no branch between wgmmas
      const int slot = it.index();
      ring.wait_full(it);
      __syncwarp();
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      const uint32_t sa = base + L::RING_OFFSET + slot * L::STAGE, sb = sa + L::A_IN_SLOT + a_rows;
      sm90::wgmma_fence();
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int k = kb * KS + s;  // resident: chunk k / 4, k32 step k % 4 of it
        const uint32_t w = L::WRES ? base + (k / 4) * L::WRES_CHUNK + (k % 4) * 32 : sa + s * 32;
        if ((whole || s < steps) && !Profiling::no_wgmma)
          sm90::WgmmaS8<CH>::mma(acc, Tactic::flat ? sm90::desc_kmajor(sb + s * 256, KS * 256, 3) : sm90::desc_kmajor_sw32(sb + s * L::B_STEP),
                                 sm90::desc_kmajor_sw128(w), k > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      if (kb > 0 && lane == 0) sm90::mbar_arrive(ring.empty(it.previous()));
      __syncwarp();
      ++it;
    };
    const int whole_batches = t.kt / KS;
    for (int kb = 0; kb < whole_batches; ++kb) batch(kb, true);
    for (int kb = whole_batches; kb < kblocks; ++kb) batch(kb, false);
    // Every wgmma of this tile is issued: the other group's next tile may queue behind them.
    if (PINGPONG && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - group, kTurnThreads);
    sm90::wgmma_wait<0>();
    if (lane == 0) sm90::mbar_arrive(ring.empty(it.previous()));
    __syncwarp();
    // The group's next tile's residual into the other buffer (read by this warp a tile ago, __syncwarp'd).
    const int next = tile + GROUPS * tile_step;
    if (load_res && next < t.tiles)
      ResidualSlice<CH>::load(slice0 + ((j + 1) & 1) * L::OUT_BYTES, p, t, TileCoord(next, p, t, ohw, CH), first_px, ohw, kpad, lane);
    cp_async_commit();

    // Folded factors of the tile's channels: refreshed only when the channel tile changes (never after
    // the first tile when the grid is a multiple of the channel tiles, plugins/wgmma.py).
    if (!L::WRES && tc.c0 != factors_c0) {
      sm90::named_barrier(1 + group, 128 * TILE_WGS);  // nobody in the group still reads the previous tile's factors
      load_factors(tc.c0);
      factors_c0 = tc.c0;
    }
    if (Profiling::skips_epilogue) {
      Profiling::keep_accumulators_live(acc, p, tid);
      continue;
    }
    cp_async_wait<1>();  // this tile's slice (the group before the one just committed) has landed
    __syncwarp();
    const int8_t* slice = slice0 + (j & 1) * L::OUT_BYTES;
    if (has_res) {
      pixel_major_epilogue<CH, true>(acc, p, t, tc, s_scale, s_bias, slice, px, ohw, kpad, lane, es.rs, es.relu_min);
    } else {
      pixel_major_epilogue<CH, false>(acc, p, t, tc, s_scale, s_bias, slice, px, ohw, kpad, lane, es.rs, es.relu_min);
    }
    __syncwarp();  // every lane's reads of this slice come before its refill two tiles on
  }
  cp_async_wait<0>();
}

}  // namespace trtfuse
