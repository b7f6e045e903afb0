// Global -> shared iterators of the implicit GEMM (CUTLASS's "predicated tile iterators", small).
//
// A (activations, BM x 64 bytes per stage): row m of the tile is output pixel m, its 64 bytes are
// GEMM-K bytes [kt*64, kt*64+64). A GEMM-K byte k belongs to filter tap k / VEC (one (cb, r, s)) and
// channel slot k % VEC. The tap table, built once per CTA in shared memory, turns a tap index into
// (r, s, offset) so the main loop gathers with adds and compares only. Taps past the real K are
// marked with r = PAD_TAP so they read as zeros, like spatial padding.
//
// B (weights, BN x 64 bytes per stage): plain 16-byte rows of the packed weight matrix.
#pragma once
#include "conv_params.cuh"
#include "mma_sm80.cuh"

namespace trtfuse {

constexpr int PAD_TAP = 1 << 20;

struct Tap { int r, s, offset, unused; };

template <int VEC>
__device__ void build_tap_table(Tap* table, const ConvParams& p, const ConvShape& sh, int tid, int nthreads) {
  const int taps = sh.ktiles * 64 / VEC;
  const int real_taps = sh.CB * p.R * p.S;
  for (int t = tid; t < taps; t += nthreads) {
    Tap e;
    if (t < real_taps) {
      const int s = t % p.S, r = (t / p.S) % p.R, cb = t / (p.S * p.R);
      e.r = r; e.s = s; e.offset = ((cb * p.H + r) * p.W + s) * VEC;
    } else {
      e.r = PAD_TAP; e.s = 0; e.offset = 0;
    }
    e.unused = 0;
    table[t] = e;
  }
}

// Each thread owns fixed rows of the A tile and one fixed granule column: its per-row pixel
// coordinates are computed once, here, with the only divisions of the gather.
template <int BM, int NTHREADS, int VEC>
struct ActivationIterator {
  static constexpr int GRANULE = VEC >= 16 ? 16 : 4;  // bytes per cp.async
  static constexpr int GRANULES_PER_ROW = 64 / GRANULE;
  static constexpr int ROWS_PER_PASS = NTHREADS / GRANULES_PER_ROW;
  static constexpr int ITERS = BM / ROWS_PER_PASS;
  static_assert(BM % ROWS_PER_PASS == 0, "tile rows must split evenly over threads");

  int granule;          // which granule column of the 64-byte row this thread copies
  int row0;
  int base[ITERS];      // element offset of (n, ih0, iw0, channel block 0)
  int ih0[ITERS], iw0[ITERS];

  __device__ __forceinline__ ActivationIterator(const ConvParams& p, const ConvShape& sh, int m0, int tid) {
    granule = tid % GRANULES_PER_ROW;
    row0 = tid / GRANULES_PER_ROW;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int m = m0 + row0 + i * ROWS_PER_PASS;
      const int n = p.div_ohw.div(m), pix = m - n * sh.OHW;
      const int oh = p.div_ow.div(pix), ow = pix - oh * p.OW;
      // A row past M reads zeros: both coordinates far negative, so even a padding tap (r = PAD_TAP)
      // cannot bring it back in range.
      ih0[i] = m < sh.M ? oh * p.stride_h - p.pad_top : -PAD_TAP;
      iw0[i] = m < sh.M ? ow * p.stride_w - p.pad_left : -PAD_TAP;
      base[i] = ((n * sh.CB * p.H + ih0[i]) * p.W + iw0[i]) * VEC;
    }
  }

  __device__ __forceinline__ void load(int8_t* smem_a, const Tap* taps, const ConvParams& p, int kt) const {
    const int kbyte = kt * 64 + granule * GRANULE;
    const Tap tap = taps[kbyte / VEC];  // VEC is a power of two: a shift
    const int inner = kbyte % VEC;
    const int dst_chunk = (granule * GRANULE) / 16, dst_inner = (granule * GRANULE) % 16;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int row = row0 + i * ROWS_PER_PASS;
      const int ih = ih0[i] + tap.r, iw = iw0[i] + tap.s;
      const bool valid = (unsigned)ih < (unsigned)p.H && (unsigned)iw < (unsigned)p.W;
      const int8_t* src = valid ? p.x + base[i] + tap.offset + inner : p.x;
      const uint32_t dst = smem_u32(smem_a + swizzle_64B(row, dst_chunk) + dst_inner);
      if (GRANULE == 16) cp_async_16(dst, src, valid); else cp_async_4(dst, src, valid);
    }
  }
};

template <int BN, int NTHREADS>
struct WeightIterator {
  static constexpr int ROWS_PER_PASS = NTHREADS / 4;
  static constexpr int ITERS = (BN + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
  int chunk, row0;
  const int8_t* src0;
  const int8_t* fallback;  // a valid address for zero-fill copies
  int rows_valid;  // output channels of this tile that exist in the packed weight

  __device__ __forceinline__ WeightIterator(const ConvParams& p, const ConvShape& sh, int n0, int tid) {
    chunk = tid % 4;
    row0 = tid / 4;
    src0 = p.w + (size_t)(n0 + row0) * sh.KGpad + chunk * 16;
    fallback = p.w;
    rows_valid = sh.Kpad - n0;
  }

  __device__ __forceinline__ void load(int8_t* smem_b, const ConvShape& sh, int kt) const {
    const bool k_ok = kt * 64 + chunk * 16 < sh.KGpad;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int row = row0 + i * ROWS_PER_PASS;
      if (row < BN) {
        const bool valid = k_ok && row < rows_valid;
        const int8_t* src = valid ? src0 + (size_t)i * ROWS_PER_PASS * sh.KGpad + kt * 64 : fallback;
        cp_async_16(smem_u32(smem_b + swizzle_64B_b(row, chunk)), src, valid);
      }
    }
  }
};

}  // namespace trtfuse
