// Consumer finish, pixel-major tiles: each thread's accumulators are 8 consecutive channels of a pixel (the weight
// map's row order, plugins/wgmma.py), requantized with their residual straight from registers to 8-byte CHW32 stores.
#pragma once
#include "wgmma_epilogue.cuh"
#include "wgmma_pixel_requantize.cuh"
#include "wgmma_tile.cuh"

namespace trtfuse {

// Where a consumer warp's 16 pixels x CH channels of residual sit in a residual tile: its own slice
// [block][16 pixels][32], filled by the warp's own cp.asyncs, so only __syncwarp orders them.
template <int CH>
struct ResidualSlice {
  static constexpr int BYTES = 16 * CH;
  // Lane l copies 16-byte half l % 2 of slice pixel l / 2, for every block.
  __device__ __forceinline__ static void load(int8_t* slice, const ConvParams& p, const WgmmaTile& t, const TileCoord& tc,
                                              int first_px, int ohw, int kpad, int lane) {
    const int px = first_px + lane / 2;
    bool ok = px < tc.valid_px;
    const size_t offset = tile_row_offset(p, t, tc.m0 + px, tc.c0, ohw, kpad, ok);
    const size_t row = (ok ? offset : 0) + 16 * (lane % 2);
    const int blocks = (kpad - tc.c0) / 32;
#pragma unroll
    for (int b = 0; b < CH / 32; ++b) {
      const bool copy = ok && b < blocks;
      cp_async_16(smem_u32(slice + (16 * b + lane / 2) * 32 + 16 * (lane % 2)),
                  copy ? p.residual + row + (size_t)b * ohw * 32 : p.residual, copy);
    }
  }
  // Lane (g, q) = (lane / 4, lane % 4) reads channels 8q .. 8q + 7 of slice pixel g + 8h, block b.
  __device__ __forceinline__ static uint2 read(const int8_t* slice, int b, int h, int lane) {
    return *reinterpret_cast<const uint2*>(slice + (16 * b + lane / 4 + 8 * h) * 32 + 8 * (lane % 4));
  }
};

// The pixel-major epilogue of one thread: straight-line code over every (block, pixel) of its
// accumulators (blocks past Kpad are computed and not stored), so the scheduler interleaves 16 x 8
// independent chains instead of branching between groups of 8.
template <int CH, bool RES>
__device__ __forceinline__ void pixel_major_epilogue(const int (&acc)[CH / 2], const ConvParams& p, const WgmmaTile& t, const TileCoord& tc,
                                                     const float* s_scale, const float* s_bias, const int8_t* slice,
                                                     const int (&px)[2], int ohw, int kpad, int lane, float rs,
                                                     float relu_min) {
  bool ok[2];
  size_t out_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ok[h] = px[h] < tc.valid_px;
    const size_t offset = tile_row_offset(p, t, tc.m0 + px[h], tc.c0, ohw, kpad, ok[h]);
    out_off[h] = !ok[h] ? 0 : offset + 8 * (lane % 4);
  }
  const int blocks = (kpad - tc.c0) / 32;  // < CH / 32 only on the last channel tile
  uint32_t folded = 0;  // Profiling::no_stores only
#pragma unroll
  for (int b = 0; b < CH / 32; ++b) {
    const float4* f = reinterpret_cast<const float4*>(s_scale + 32 * b + 8 * (lane % 4));
    const float4* g = reinterpret_cast<const float4*>(s_bias + 32 * b + 8 * (lane % 4));
    const float4 sc[2] = {f[0], f[1]}, bi[2] = {g[0], g[1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 res = RES ? ResidualSlice<CH>::read(slice, b, h, lane) : make_uint2(0, 0);
      const uint2 out = requantize_8_channels<kAccOnXu, CH / 2, RES>(acc, b, h, sc, bi, res, rs, relu_min);
      if (Profiling::no_stores)
        folded ^= out.x ^ out.y;
      else if (ok[h] && b < blocks)
        *reinterpret_cast<uint2*>(p.y + out_off[h] + (size_t)b * ohw * 32) = out;
    }
  }
  if (Profiling::no_stores && folded == 0x7fffffffu) p.y[lane] = 1;
}

}  // namespace trtfuse
