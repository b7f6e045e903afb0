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

// threadIdx.x read afresh (a volatile read the compiler cannot hoist out of the persistent tile loop):
// values derived from it are then recomputed per tile instead of occupying registers in the main loop.
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// A kernel whose shared-memory layout is fixed at compile time traps unless its launcher gave it at least `bytes` of
// dynamic shared memory (the launcher's count and the kernel's must agree).
__device__ __forceinline__ void trap_unless_dynamic_smem(uint32_t bytes) {
  uint32_t given;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
  if (given < bytes) __trap();
}

template <int BM, int BN>
struct OutputTile {
  static constexpr int STRIDE = BN + 16;
  static constexpr int BYTES = BM * STRIDE;

  // Visit every 16-byte vector of the tile with its staging offset and global CHW32 address (nullptr:
  // outside the tensor). Vector v is (channel block v / (2 BM), pixel row (v % (2 BM)) / 2, half v % 2);
  // thread tid takes v = tid + i * NTHREADS, i = 0 .. VECTORS / NTHREADS - 1.
  //   2 BM a multiple of NTHREADS (every tactic): the thread's rows are tid / 2 + k * NTHREADS / 2,
  //     k < ROWS = 2 BM / NTHREADS, and iteration i is row k = i % ROWS of channel block i / ROWS;
  //   NTHREADS a multiple of 2 BM: one row, (tid % (2 BM)) / 2, channel blocks tid / (2 BM) + i * NTHREADS / (2 BM).
  // Either way a row's pixel address is computed once (one division) and the blocks step by OH*OW*32
  // bytes; tests/test_epilogue_mapping.py replays both against the per-vector form (for_each_vector_ref).
  template <int NTHREADS, typename F>
  __device__ __forceinline__ static void for_each_vector(const ConvParams& p, const ConvShape& sh, int m0, int n0,
                                                         int tid, int8_t* gbase, F&& f) {
    constexpr int VECTORS = BM * BN / 16, ITERS = VECTORS / NTHREADS, BLOCK_VECTORS = 2 * BM;
    static_assert(VECTORS % NTHREADS == 0, "output tile must split evenly over threads");
    if constexpr (BLOCK_VECTORS % NTHREADS == 0 || NTHREADS % BLOCK_VECTORS == 0) {
      constexpr int ROWS = BLOCK_VECTORS % NTHREADS == 0 ? BLOCK_VECTORS / NTHREADS : 1;
      constexpr int ROW_STEP = NTHREADS / 2;  // only used with ROWS > 1
      constexpr int BLOCK_STEP = BLOCK_VECTORS % NTHREADS == 0 ? 1 : NTHREADS / BLOCK_VECTORS;  // per ROWS iterations
      tid = fresh_tid();  // recomputed per tile, not held in a register across the persistent loop
      const int half = tid % 2, row0 = (tid % BLOCK_VECTORS) / 2;
      const int block0 = BLOCK_VECTORS % NTHREADS == 0 ? 0 : tid / BLOCK_VECTORS;
      const int blocks = (sh.Kpad - n0) / 32;  // channel blocks of this tile inside Kpad (Kpad, n0: multiples of 32)
      const size_t block_bytes = (size_t)sh.OHW * 32;
      int8_t* row_g[ROWS];
      bool row_ok[ROWS];
#pragma unroll
      for (int k = 0; k < ROWS; ++k) {
        const int m = m0 + row0 + k * ROW_STEP;
        const int n = p.div_ohw.div(m), pix = m - n * sh.OHW;
        row_ok[k] = m < sh.M;
        row_g[k] = gbase + ((size_t)(n * (sh.Kpad / 32) + n0 / 32 + block0) * sh.OHW + pix) * 32 + half * 16;
      }
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int k = i % ROWS, b = (i / ROWS) * BLOCK_STEP;  // row index, block offset from block0
        const bool ok = row_ok[k] && block0 + b < blocks;
        f((row0 + k * ROW_STEP) * STRIDE + (block0 + b) * 32 + half * 16, ok ? row_g[k] + b * block_bytes : nullptr);
      }
    } else {
      for_each_vector_ref<NTHREADS>(p, sh, m0, n0, tid, gbase, f);
    }
  }

  // The per-vector form (a division per vector): the reference for_each_vector must agree with.
  template <int NTHREADS, typename F>
  __device__ __forceinline__ static void for_each_vector_ref(const ConvParams& p, const ConvShape& sh, int m0, int n0,
                                                             int tid, int8_t* gbase, F&& f) {
    constexpr int VECTORS = BM * BN / 16;
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

// docs/ops.md step 2: the per-channel factors with out_scale folded in, each a correctly rounded
// division (done once per channel a thread owns, not per element).
__device__ __forceinline__ float fold_scale(float s, float out_scale, float out_scale_inv) {
  return div_rn(s, out_scale, out_scale_inv);
}

// int32 -> float, round to nearest, pinned to the full-rate I2FP: from a value the compiler knows to be a
// widened int8 it would otherwise pick the narrow quarter-rate I2F.S16.
__device__ __forceinline__ float s32_to_float(int x) {
  float f;
  asm("cvt.rn.f32.s32 %0, %1;" : "=f"(f) : "r"(x));
  return f;
}

// int32 -> float on the conversion (XU) pipe: I2F.RM, where cvt.rn and cvt.rz compile to the ALU pipe's I2FP. Equal
// to the round-to-nearest conversion for |x| <= 2^24 (every such integer is an fp32); callers use it only where
// their GEMM-K bounds the accumulator that far (|acc| <= K * 2^14).
__device__ __forceinline__ float s32_to_float_small(int x) {
  float f;
  asm("cvt.rm.f32.s32 %0, %1;" : "=f"(f) : "r"(x));
  return f;
}

// Byte `byte` of a word of four residual bytes (channel order; a compile-time constant after unrolling)
// as a float: sign-extended with one PRMT and converted exactly (any int8 is an fp32) with the full-rate
// I2FP; byte 0 by one I2F.S8. Both epilogues read their residual 4 bytes at a time and convert each with this.
__device__ __forceinline__ float s8_to_float(uint32_t word, int byte) {
  if (byte == 0) {
    // The low byte needs no extraction: I2F.S8 reads it from the word. One instruction instead of two, on the
    // otherwise idle conversion (XU) pipe; exact like the I2FP path.
    float f;
    asm("cvt.rn.f32.s8 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(word)));
    return f;
  }
  // prmt selector: byte `byte` to byte 0, its sign (nibble 8 + byte: sign replicate) to bytes 1..3.
  // Inline PTX: CUDA documents __byte_perm with 3-bit selectors only.
  const uint32_t sel = byte | (0x888u + 0x111u * byte) << 4;
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(word), "r"(sel));
  return __int2float_rn(static_cast<int>(x));
}

__device__ __forceinline__ uint32_t round_saturate_s8_b32(float v) {
  uint32_t q;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(q) : "f"(v));
  return q;
}

// ReLU without a branch or predicate: max.NaN(v, relu_min) with relu_min = 0 (relu) or -inf (none). For
// every v it gives what `relu ? fmaxf(v, 0) : v` gives after the conversion below: equal for non-NaN
// v (-inf leaves v, including -inf, unchanged), and a NaN stays NaN (which converts to 0, as
// fmaxf(NaN, 0) = 0 does), where fmaxf(NaN, -inf) would give -inf and so -128.
__device__ __forceinline__ float max_nan(float v, float relu_min) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"(relu_min));
  return r;
}

__device__ __forceinline__ float relu_floor(bool relu) { return relu ? 0.0f : -__int_as_float(0x7f800000); }

// docs/ops.md's order on one element, the one definition both epilogues use: fma(acc, a, b), with RES
// + fma(residual(), rs, .), ReLU as max_nan(., relu_min), round half to even and saturate. `residual`
// yields float(residual byte) and is called after the first FMA, where each caller's conversion belongs
// in the instruction stream. acc_on_xu (a compile-time constant at every call after unrolling): the accumulator
// converts on the XU pipe (s32_to_float_small, |acc| <= 2^24).
template <bool RES = true, typename Residual>
__device__ __forceinline__ float requantize_fma(int acc, float a, float b, Residual&& residual, float rs,
                                                bool acc_on_xu = false) {
  float v = __fmaf_rn(acc_on_xu ? s32_to_float_small(acc) : __int2float_rn(acc), a, b);
  if (RES) v = __fmaf_rn(residual(), rs, v);
  return v;
}
template <bool RES = true, typename Residual>
__device__ __forceinline__ float requantize_f32(int acc, float a, float b, Residual&& residual, float rs,
                                                float relu_min) {
  return max_nan(requantize_fma<RES>(acc, a, b, residual, rs), relu_min);
}
template <bool RES = true, typename Residual>
__device__ __forceinline__ uint32_t requantize_s32(int acc, float a, float b, Residual&& residual, float rs,
                                                   float relu_min) {
  return round_saturate_s8_b32(requantize_f32<RES>(acc, a, b, residual, rs, relu_min));
}
// Two requantized values -> two bytes (v0 in byte 0), above them the low half of `upper`: round half to even
// to int32, then one saturating pack conversion (cvt.pack.sat.s8.s32.b32); ptxas fuses the pair into one
// F2IP.S8. Bit-equal to round_saturate_s8_b32 on each (NaN -> 0, out-of-range saturates).
__device__ __forceinline__ uint32_t round_pack_s8x2(float v0, float v1, uint32_t upper = 0) {
  int i0, i1;
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(i0) : "f"(v0));
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(i1) : "f"(v1));
  uint32_t d;
  asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(i1), "r"(i0), "r"(upper));
  return d;
}
// Four requantized values -> one word of int8 (v0 in byte 0): two pairs, the second packed under the first.
// Bit-equal to round_saturate_s8_b32 + pack_s8x4.
__device__ __forceinline__ uint32_t round_pack_s8x4(float v0, float v1, float v2, float v3) {
  return round_pack_s8x2(v0, v1, round_pack_s8x2(v2, v3));
}

// Four consecutive channels of one pixel -> one word of int8 (channel order): acc[i] with its folded
// factors a[i], b[i] and byte i of the residual word `res4`. Rounding and packing by round_pack_s8x4: ptxas
// pairs the conversions (F2IP.S8, two values per instruction, packing as it converts) where a rounding to a
// sign-extended byte per element (F2I.S8) plus three PRMTs per word cost 7 instructions; that moved the
// ALU-pipe-bound wgmma epilogue 7-11% (docs/PERF.md, v10d). Without a residual (RES = false, or rs = 0
// with any `res4`: the term is then +-0, and v + (+-0) is v or +0 for v = -0, which converts to the same 0)
// the results equal requantize_s32<false> per element. ACC_XU: the first ACC_XU accumulators convert on the XU
// pipe (s32_to_float_small: the caller guarantees |acc| <= 2^24).
//
// The ReLU comes after the packing, on the four bytes at once: a byte's sign replicated over it by one PRMT
// (selector nibble 8 + i), and one LOP3 clearing the negative bytes where relu_min is 0. Two ALU-pipe
// instructions per word instead of four FMNMX (the epilogue is bound by its ALU-pipe instructions). It is
// exact: rounding and saturation are monotonic and keep 0, so relu(sat(round(v))) = sat(round(relu(v)));
// a NaN converts to 0 either way.
__device__ __forceinline__ uint32_t relu_s8x4(uint32_t word, uint32_t relu_mask) {
  uint32_t sign, out;
  asm("prmt.b32 %0, %1, 0, 0xba98;" : "=r"(sign) : "r"(word));
  // word & ~(sign & relu_mask) as one LOP3 (truth table 0xF0 & ~(0xCC & 0xAA) = 0x70): ptxas splits the C++ form in two
  asm("lop3.b32 %0, %1, %2, %3, 0x70;" : "=r"(out) : "r"(word), "r"(sign), "r"(relu_mask));
  return out;
}
template <bool RES = true, int ACC_XU = 0>
__device__ __forceinline__ uint32_t requantize_word(const int (&acc)[4], const float (&a)[4], const float (&b)[4],
                                                    uint32_t res4, float rs, float relu_min) {
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = requantize_fma<RES>(acc[i], a[i], b[i], [&] { return s8_to_float(res4, i); }, rs, i < ACC_XU);
  return relu_s8x4(round_pack_s8x4(v[0], v[1], v[2], v[3]), relu_min == 0.0f ? ~0u : 0u);
}

}  // namespace trtfuse
