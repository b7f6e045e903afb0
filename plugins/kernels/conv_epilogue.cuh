// The fused epilogue (docs/ops.md): int32 accumulators -> fma(acc, scale/out_scale, bias/out_scale),
// + fma(residual, residual_scale/out_scale), ReLU, round half to even, saturate -> int8 CHW32.
//
// The output tile is staged in shared memory (rows of BN + 16 bytes: the 16-byte pad spreads the
// 8 rows an MMA fragment touches over distinct banks and keeps 16-byte alignment), then written
// back as whole 16-byte vectors, consecutive threads taking consecutive halves of consecutive
// pixels' 32-channel vectors, so a warp stores 512 contiguous bytes. The residual tile is copied
// into the same staging buffer first: each thread reads its residual element and overwrites it
// with its output element in place.
#pragma once
#include "conv_params.cuh"
#include "mma_sm80.cuh"

namespace trtfuse {

template <int BM, int BN>
struct OutputTile {
  static constexpr int STRIDE = BN + 16;
  static constexpr int BYTES = BM * STRIDE;

  // Visit every 16-byte vector of the tile with its global CHW32 address (nullptr: outside tensor).
  template <int NTHREADS, typename F>
  __device__ __forceinline__ static void for_each_vector(const ConvParams& p, const ConvShape& sh, int m0, int n0,
                                                         int tid, int8_t* gbase, F&& f) {
    constexpr int VECTORS = BM * BN / 16;
    static_assert(VECTORS % NTHREADS == 0, "output tile must split evenly over threads");
#pragma unroll
    for (int v = tid; v < VECTORS; v += NTHREADS) {
      const int block32 = v / (BM * 2), rem = v % (BM * 2);
      const int row = rem / 2, half = rem % 2;
      const int col = block32 * 32 + half * 16;
      const int m = m0 + row, chan = n0 + col;
      int8_t* g = nullptr;
      if (m < sh.M && chan < sh.Kpad) {
        const int n = p.div_ohw.div(m), pix = m - n * sh.OHW;
        g = gbase + ((size_t)(n * (sh.Kpad / 32) + chan / 32) * sh.OHW + pix) * 32 + half * 16;
      }
      f(row * STRIDE + col, g);
    }
  }

  template <int NTHREADS>
  __device__ __forceinline__ static void prefetch_residual(int8_t* tile, const ConvParams& p, const ConvShape& sh,
                                                           int m0, int n0, int tid) {
    for_each_vector<NTHREADS>(p, sh, m0, n0, tid, const_cast<int8_t*>(p.residual), [&](int s, int8_t* g) {
      cp_async_16(smem_u32(tile + s), g ? g : p.residual, g != nullptr);
    });
  }

  template <int NTHREADS>
  __device__ __forceinline__ static void store(const int8_t* tile, const ConvParams& p, const ConvShape& sh, int m0,
                                               int n0, int tid) {
    for_each_vector<NTHREADS>(p, sh, m0, n0, tid, p.y, [&](int s, int8_t* g) {
      if (g) *reinterpret_cast<int4*>(g) = *reinterpret_cast<const int4*>(tile + s);
    });
  }
};

// v / s correctly rounded, branch-free: with s_inv = RN(1/s) and q0 = RN(v * s_inv), the FMA residual
// e = v - s*q0 is exact and RN(q0 + e * s_inv) is the correctly rounded quotient (Markstein's
// theorem; no overflow or underflow for the |v| an int32 accumulator can produce). CUDA's own
// __fdiv_rn adds a slow-path branch per element, which stops the compiler from interleaving
// elements: this form lets the epilogue's 64 elements per thread issue back to back.
__device__ __forceinline__ float div_rn(float v, float s, float s_inv) {
  const float q0 = __fmul_rn(v, s_inv);
  const float e = __fmaf_rn(-s, q0, v);
  return __fmaf_rn(e, s_inv, q0);
}

// Round half to even and saturate to [-128, 127] in one instruction.
__device__ __forceinline__ int8_t round_saturate_s8(float v) {
  short q;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=h"(q) : "f"(v));
  return static_cast<int8_t>(q);
}

// docs/ops.md step 2: the per-channel factors with out_scale folded in, each a correctly rounded
// division (done once per channel a thread owns, not per element).
__device__ __forceinline__ float fold_scale(float s, float out_scale, float out_scale_inv) {
  return div_rn(s, out_scale, out_scale_inv);
}

// One element, exactly as docs/ops.md orders it: two correctly rounded FMAs, ReLU, round, saturate.
// `res` is float(residual byte), `rs` the folded residual scale.
__device__ __forceinline__ int8_t requantize(int acc, float a, float b, float res, float rs, bool has_res, bool relu) {
  float v = __fmaf_rn(__int2float_rn(acc), a, b);
  if (has_res) v = __fmaf_rn(res, rs, v);
  if (relu) v = fmaxf(v, 0.0f);
  return round_saturate_s8(v);
}

}  // namespace trtfuse
