// What the two stem + max-pool kernels share (stem_pool.cu: a conv tile staged and pooled in shared memory;
// stem_pool_rows.cu: the pool taken on the accumulators): the folded conv's shape, a tile's origin and input patch,
// and the folded requantize factors.
#pragma once
#include "conv_epilogue.cuh"
#if defined(STEM_POOL_WGMMA) || defined(STEM_POOL_ROWS)
#include "sm90_primitives.cuh"
#endif

namespace trtfuse {
namespace stem {

constexpr int PK = 3, PS = 2, PP = 1;             // the max-pool window, stride and padding
constexpr int R = 4, S = 4, VEC = 16;             // the folded conv: 4x4 taps of 16 channels
constexpr int KSTEPS = R * S * VEC / 32;          // k32 steps: two taps each (same filter row: S is even)
constexpr int KG = R * S * VEC;                   // weight row bytes
constexpr int CH = 64;                            // output channels
constexpr int FACTOR_BYTES = 2 * CH * 4;          // per-channel a, b of the requantize

// docs/ops.md step 2.1 for the 64 channels into shared memory (read after the caller's next barrier).
__device__ __forceinline__ void fold_factors(float* factor_a, float* factor_b, const ConvParams& p, int tid, int nthreads) {
  const float out_scale = *p.out_scale, out_scale_inv = __frcp_rn(out_scale);
  for (int c = tid; c < CH; c += nthreads) {
    factor_a[c] = fold_scale(p.scale[c], out_scale, out_scale_inv);
    factor_b[c] = fold_scale(p.bias[c], out_scale, out_scale_inv);
  }
}

// Tile `tile` of a grid of tiles_h x tiles_w tiles per image, each TPH x TPW pooled pixels: its image, and the folded
// input row and column its patch starts at (the pool's padding, then the conv's).
struct StemTile {
  int n, ir0, ic0;
  template <int TPH, int TPW>
  __device__ __forceinline__ static StemTile at(int tile, int tiles_h, int tiles_w, const ConvParams& p) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    return {n, (t / tiles_w) * TPH * PS - PP - p.pad_top, (t % tiles_w) * TPW * PS - PP - p.pad_left};
  }
};

// The input patch of a tile: IR x IC folded 16-byte pixels of `image` from row ir0 and column ic0 (zero outside the
// image: the conv's padding) by cp.async into `patch`, pixel v = (row, col) = (v / IC, v % IC) at byte
// offset(v, row, col); committed, not waited for.
template <int IR, int IC, int NTHREADS, typename Offset>
__device__ __forceinline__ void load_input_patch(int8_t* patch, const int8_t* image, const ConvParams& p, int ir0, int ic0,
                                                 int tid, Offset&& offset) {
  for (int v = tid; v < IR * IC; v += NTHREADS) {
    const int row = v / IC, col = v % IC, ih = ir0 + row, iw = ic0 + col;
    const bool in_image = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
    const int8_t* src = image + ((size_t)(in_image ? ih : 0) * p.W + (in_image ? iw : 0)) * VEC;
    cp_async_16(smem_u32(patch + offset(v, row, col)), src, in_image);
  }
  cp_async_commit();
}

}  // namespace stem
}  // namespace trtfuse
