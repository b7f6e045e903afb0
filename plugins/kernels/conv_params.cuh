// Problem description shared by the global->shared iterators, the main loop and the epilogue.
#pragma once
#include "int_types.cuh"

namespace trtfuse {

// n / d and n % d for 0 <= n < 2^31 with a multiply-high and a shift (Granlund-Montgomery): integer
// division by a run-time value costs ~20 instructions, three of them on the quarter-rate conversion
// pipe, and the gathers and the epilogue need one per pixel row. mul = ceil(2^p / d) with
// p = 31 + ceil(log2 d); d == 1 is mul = 0 (the quotient is n itself). The host computes it
// (plugins/conv.py: fast_divmod) so kernels start with it; the TensorRT AOT entries call make().
struct FastDivmod {
  uint32_t d, mul, shr;
  __host__ __device__ static FastDivmod make(uint32_t d) {
    FastDivmod f;
    f.d = d;
    uint32_t l = 0;
    while ((1u << l) < d) ++l;
    f.shr = d == 1 ? 0 : l - 1;
    f.mul = d == 1 ? 0 : (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
    return f;
  }
  __device__ __forceinline__ int div(int n) const {
    return d == 1 ? n : (int)(__umulhi((uint32_t)n, mul) >> shr);
  }
};

struct ConvParams {
  const int8_t* x;             // [N][C/VEC][H][W][VEC]
  const int8_t* w;             // [Kpad][KGpad], GEMM-K ordered (cb, r, s, cv)
  const float* scale;          // [Kpad]
  const float* bias;           // [Kpad]
  const float* out_scale;      // [1]
  const int8_t* residual;      // [N][Kpad/32][OH][OW][32] or nullptr
  const float* residual_scale; // [1] or nullptr
  int8_t* y;                   // [N][Kpad/32][OH][OW][32]
  int* workspace;              // split-K partial sums [M][Kpad], zero between launches
  int* counters;               // split-K arrival counter per output tile, zero between launches
  float* y_f32;                // fp32-output GEMM variant (the classifier): [M][K] row-major
  int N, C, H, W, K, OH, OW, R, S, stride_h, stride_w, pad_top, pad_left, relu, splits;
  FastDivmod div_ohw, div_ow;  // by OH*OW and by OW
};

// Quantities every thread derives once from ConvParams (no division in the main loop).
struct ConvShape {
  int M, OHW, Kpad, KGpad, CB, ktiles;
  template <int VEC>
  __device__ __forceinline__ static ConvShape make(const ConvParams& p) {
    ConvShape s;
    s.OHW = p.OH * p.OW;
    s.M = p.N * s.OHW;
    s.Kpad = (p.K + 31) / 32 * 32;
    s.CB = (p.C + VEC - 1) / VEC;
    s.KGpad = (s.CB * VEC * p.R * p.S + 31) / 32 * 32;
    s.ktiles = (s.KGpad + 63) / 64;
    return s;
  }
};

}  // namespace trtfuse
