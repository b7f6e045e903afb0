// The channel-major epilogue's memory streams through the staging tile: the residual in (cp.async), the output out
// (the consumer threads' 16-byte CHW32 vectors, or one thread's TMA store per channel block).
#pragma once
#include "wgmma_epilogue.cuh"
#include "wgmma_tile.cuh"

namespace trtfuse {

// Visit the 16-byte vectors of a tile's staging tile [pixel][CH + 16] with their global CHW32 offsets:
// consumer thread ct (of THREADS) takes half ct % 2 of pixel rows ct / 2 + (THREADS / 2) j and the tile's CH / 32
// channel blocks of each, so a row's address costs one multiply-high (chw32_offset) and the blocks step by
// OH*OW*32 bytes. f(staging offset, in the tensor?, global byte offset); consecutive threads cover consecutive
// 16-byte halves of consecutive pixels, i.e. a warp moves 512 contiguous bytes per channel block. With kWindows
// staging row n is window position n (tile_pixel).
// Staging byte of (tile position px, channel block b, 16-byte half): [px][OUT_STRIDE] rows of the tile's channels, or
// (OUT_STRIDE == 32, the channel-major ping-pong's) [b][px][32] blocks of BN 32-byte rows, 32-byte swizzled (the half
// flips in rows 4-7 of each 8: the layout its TMA store reads, conflict-free for its 2-byte requantize stores).
template <int BN, int OUT_STRIDE>
__device__ __forceinline__ int staging_offset(int px, int b, int half) {
  if (OUT_STRIDE == 32) return b * BN * 32 + px * 32 + 16 * (half ^ ((px >> 2) & 1));
  return px * OUT_STRIDE + b * 32 + half * 16;
}
template <int BN, int CH, int THREADS, int OUT_STRIDE, typename F>
__device__ __forceinline__ void for_each_tile_vector(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                                     const WgmmaTile& t, F&& f) {
  constexpr int kRows = THREADS / 2;  // pixel rows per pass
  const int half = ct % 2;
  const int blocks = (kpad - tc.c0) / 32;  // channel blocks of this tile inside Kpad (< CH / 32 only on the last tile)
  const size_t block_bytes = (size_t)ohw * 32;
#pragma unroll
  for (int j = 0; j < (BN + kRows - 1) / kRows; ++j) {
    const int px = ct / 2 + kRows * j;
    if (BN % kRows != 0 && px >= BN) break;
    bool row_ok;
    const int pix = tile_pixel(px, p, tc, t, ohw, row_ok);
    const size_t row = row_ok ? chw32_offset(p, tc.m0 + pix, tc.c0, ohw, kpad) + half * 16 : 0;
#pragma unroll
    for (int b = 0; b < CH / 32; ++b) f(staging_offset<BN, OUT_STRIDE>(px, b, half), row_ok && b < blocks, row + b * block_bytes);
  }
}


// The channel-major epilogue's two memory streams through the staging tile, THREADS consumer threads (ct their
// index among them): the residual in (cp.async, one group), the output out as 16-byte CHW32 vectors, from the
// paired order (requantize_to_paired_staging, no residual) or the natural one (requantize_to_staging).
template <int BN, int CH, int THREADS, int OUT_STRIDE>
__device__ __forceinline__ void residual_to_staging(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                                    const WgmmaTile& t, int8_t* staging) {
  for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
    cp_async_16(smem_u32(staging + s), ok ? p.residual + g : p.residual, ok);
  });
}
template <int BN, int CH, int THREADS, int OUT_STRIDE>
__device__ __forceinline__ void store_staging(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                              const WgmmaTile& t, const int8_t* staging, bool paired) {
  if (!paired) {  // one branch per tile, not per vector
    for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
      if (ok) *reinterpret_cast<int4*>(p.y + g) = *reinterpret_cast<const int4*>(staging + s);
    });
  } else {
    for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
      if (ok) *reinterpret_cast<int4*>(p.y + g) = unpair_16_channels(*reinterpret_cast<const int4*>(staging + s));
    });
  }
}
// The TMA-storing tiles' output, issued by one thread: one box per channel block of the output's view, (32, pitch, NB, TH)
// of (32, OW, N, OH, KB), or with stacked stride-2 windows (32, pitch, TH, NB) of (32, OW, OH, N, KB) (plugins/wgmma.py);
// the copy engine drops the positions past a row (ow >= OW), the images past the batch and the blocks past Kpad.
template <int BN, int CH>
__device__ __forceinline__ void store_staging_by_tma(const sm90::TensorMap* tmap_y, const int8_t* staging, const TileCoord& tc,
                                                     const WgmmaTile& t, int kpad) {
  for (int b = 0; b < CH / 32 && tc.c0 + 32 * b < kpad; ++b) {
    const uint32_t src = smem_u32(staging + b * BN * 32);
    if (kQuadWindows) {  // one store per column parity e (positions e * BN / 2 ..)
      for (int e = 0; e < 2; ++e)
        sm90::tma_store_5d(tmap_y, src + e * (BN / 2) * 32, 0, 0, e, tc.oh0, tc.n0 * (kpad / 32) + tc.c0 / 32 + b);
    } else if (Tactic::stride2_windows && t.nb > 1)
      sm90::tma_store_5d(tmap_y, src, 0, 0, tc.oh0, tc.n0, tc.c0 / 32 + b);
    else
      sm90::tma_store_5d(tmap_y, src, 0, 0, tc.n0, tc.oh0, tc.c0 / 32 + b);
  }
  sm90::bulk_commit_group();
}

}  // namespace trtfuse
