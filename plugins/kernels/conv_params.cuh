// Problem description shared by the global->shared iterators, the main loop and the epilogue.
#pragma once
#include "int_types.cuh"

namespace trtfuse {

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
