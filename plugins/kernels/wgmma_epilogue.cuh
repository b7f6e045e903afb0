// Consumer finish, channel-major tiles: a thread's accumulators through docs/ops.md's epilogue (the same
// requantize_s32 as fused_conv.cu) into the staging tile, in the order its stores read it back.
#pragma once
#include "conv_epilogue.cuh"
#include "sm90_primitives.cuh"
#include "wgmma_config.cuh"

namespace trtfuse {

// docs/ops.md's per-launch epilogue scalars, folded once per consumer thread: the output scale and its
// reciprocal (fold_scale divides by it), the residual scale over the output scale (0 without one), and
// the ReLU floor.
struct EpilogueScalars {
  float out_scale, out_scale_inv, rs, relu_min;
  __device__ __forceinline__ EpilogueScalars(const ConvParams& p, bool has_res)
      : out_scale(*p.out_scale), out_scale_inv(__frcp_rn(out_scale)),
        rs(has_res ? fold_scale(*p.residual_scale, out_scale, out_scale_inv) : 0.0f), relu_min(relu_floor(p.relu != 0)) {}
  __device__ __forceinline__ float fold(float s) const { return fold_scale(s, out_scale, out_scale_inv); }
};

// One thread's accumulators -> int8 in the staging tile [pixel][STRIDE] by requantize_s32 (conv_epilogue.cuh). Accumulator 4j + 2e + h (wgmma's m64nN layout) is
// pixel 8j + 2(lane % 4) + e, channel c_lo + 8h: `cells` points at pixel 2(lane % 4), channel c_lo.
// Every row is computed, also the pixels past the tile (their residual reads as zero or stale bytes,
// their results are never stored): no per-element predicate, and the offsets are constants. With RES,
// a group of J pixel blocks' residual bytes is read before any of its results is written: a read after
// a write to the same buffer cannot be hoisted by the compiler (it may alias), which would make every
// element one serial shared-load -> convert -> FMA -> convert -> shared-store chain. Conversions are the
// full-rate I2FP (an int8 widened to int32 first; int8_t -> float directly compiles to the quarter-rate
// I2F.S16) and one cvt.rni.sat.s8.f32 per element.
template <int BN, int STRIDE, bool RES>
__device__ __forceinline__ void requantize_to_staging(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2],
                                                      const float (&bi)[2], float rs, float relu_min) {
  constexpr int J = (BN / 8) % 4 == 0 ? 4 : 2;
  static_assert((BN / 8) % J == 0, "pixel blocks split into groups of J");
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += J) {
    // element i of the group: pixel block j0 + i / 4, pixel e = (i / 2) % 2, channel half h = i % 2
    auto cell = [&](int i) -> int8_t* { return cells + (8 * (j0 + i / 4) + (i / 2) % 2) * STRIDE + 8 * (i % 2); };
    int res[4 * J];
    if (RES) {
#pragma unroll
      for (int i = 0; i < 4 * J; ++i) res[i] = *cell(i);
    }
#pragma unroll
    for (int i = 0; i < 4 * J; ++i)
      *cell(i) = static_cast<int8_t>(requantize_s32<RES>(acc[4 * (j0 + i / 4) + 2 * (i % 2) + (i / 2) % 2], sc[i % 2],
                                                         bi[i % 2], [&] { return s32_to_float(res[i]); }, rs, relu_min));
  }
}

// Without a residual: the staging tile's 16-channel groups hold their channels paired, channel g + 8h of group w
// at byte 16w + 2g + h, so a thread's two channels (c_lo and c_lo + 8: g = c_lo % 8) of a pixel are adjacent bytes.
// Both are rounded and packed by one paired conversion (F2IP.S8, ALU pipe) and stored by one 2-byte STS, where the
// natural order costs two F2I.S8 (the quarter-rate XU pipe) and two byte stores; unpair_16_channels puts the order
// back on the way out (4 PRMT per 16-byte vector). `cells` points at pixel 2(lane % 4) of the thread's pair.
// The residual path keeps the natural order: there each thread overwrites its own residual bytes in place.
template <int BN, int STRIDE>
__device__ __forceinline__ void requantize_to_paired_staging(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2],
                                                             const float (&bi)[2], float relu_min) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[h] = requantize_f32<false>(acc[4 * j + 2 * h + e], sc[h], bi[h], [] { return 0.0f; }, 0.0f, relu_min);
      *reinterpret_cast<unsigned short*>(cells + (8 * j + e) * STRIDE) = static_cast<unsigned short>(round_pack_s8x2(v[0], v[1]));
    }
  }
}

// The channel-major ping-pong tile's epilogue: its weight rows are permuted (plugins/wgmma.py) so that a thread's two
// accumulator rows are adjacent channels, which one paired conversion (F2IP.S8) rounds and packs into the natural byte
// order, stored by one 2-byte STS (in place over the residual's two bytes, read first; a group of J pixel blocks' reads
// come before any of its writes, as in requantize_to_staging). `cells` points at the thread's pixel 2(lane % 4), channel
// pair; STRIDE is the staging row.
template <int BN, int STRIDE, bool RES>
__device__ __forceinline__ void requantize_pairs(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2], const float (&bi)[2],
                                                 float rs, float relu_min) {
  constexpr int J = (BN / 8) % 4 == 0 ? 4 : 2;
  static_assert((BN / 8) % J == 0, "pixel blocks split into groups of J");
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += J) {
    int res[2 * J];  // pixel block j0 + i / 2, pixel e = i % 2: the two residual bytes
    if (RES) {
#pragma unroll
      for (int i = 0; i < 2 * J; ++i) res[i] = *reinterpret_cast<const short*>(cells + (8 * (j0 + i / 2) + i % 2) * STRIDE);
    }
#pragma unroll
    for (int i = 0; i < 2 * J; ++i) {
      const int j = j0 + i / 2, e = i % 2;
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[h] = requantize_f32<RES>(acc[4 * j + 2 * h + e], sc[h], bi[h],
                                   [&] { return s32_to_float(h == 0 ? (int)(int8_t)res[i] : res[i] >> 8); }, rs, relu_min);
      *reinterpret_cast<unsigned short*>(cells + (8 * j + e) * STRIDE) = static_cast<unsigned short>(round_pack_s8x2(v[0], v[1]));
    }
  }
}

// A channel-major consumer thread's two output channels, c_lo and c_lo + 8 of the tile (c and c + 1 with the ping-pong
// tile's permuted weight rows): their docs/ops.md scale and
// bias, loaded before the tile's main loop (the latency hides under it), folded in the epilogue, which requantizes
// the thread's accumulators into the staging tile: in the natural order with a residual (in place over it), else
// paired. `cells` is the staging tile's pixel 2(lane % 4), channel c_lo.
struct ChannelPairFactors {
  float sc_raw[2], bi_raw[2];
  // channels c and c + step: the thread's accumulator rows (step 8), or with permuted weight rows (the ping-pong tile) 1
  __device__ __forceinline__ ChannelPairFactors(const ConvParams& p, int c, int kpad, int step = 8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int cc = min(c + step * h, kpad - 1);  // channels past Kpad: computed, never stored
      sc_raw[h] = p.scale[cc];
      bi_raw[h] = p.bias[cc];
    }
  }
  // the folded factors scale / out_scale, bias / out_scale
  __device__ __forceinline__ void fold(const EpilogueScalars& es, float (&sc)[2], float (&bi)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = es.fold(sc_raw[h]);
      bi[h] = es.fold(bi_raw[h]);
    }
  }
  template <int BN, int STRIDE>
  __device__ __forceinline__ void requantize(const int (&acc)[BN / 2], int8_t* cells, int lane, const EpilogueScalars& es,
                                             bool has_res) const {
    float sc[2], bi[2];
    fold(es, sc, bi);
    if (has_res) {
      requantize_to_staging<BN, STRIDE, true>(acc, cells, sc, bi, es.rs, es.relu_min);
    } else {  // paired order: channel c_lo = 16w + g at byte 16w + 2g, c_lo + 8 next to it
      requantize_to_paired_staging<BN, STRIDE>(acc, cells + lane / 4, sc, bi, es.relu_min);
    }
  }
  // The TMA-storing tiles (kTmaOut, permuted weight rows): the thread's channel pair into `cells` of the
  // [block][position][32] staging tile, made visible to the copy engine's store.
  template <int BN>
  __device__ __forceinline__ void requantize_for_tma(const int (&acc)[BN / 2], int8_t* cells, const EpilogueScalars& es,
                                                     bool has_res) const {
    float sc[2], bi[2];
    fold(es, sc, bi);
    if (has_res)
      requantize_pairs<BN, 32, true>(acc, cells, sc, bi, es.rs, es.relu_min);
    else
      requantize_pairs<BN, 32, false>(acc, cells, sc, bi, 0.0f, es.relu_min);
    sm90::fence_proxy_async_shared();  // the staging writes, visible to the TMA store
  }
};

// 16 staged bytes in paired order (byte 2g + h = channel g + 8h) -> channel order.
__device__ __forceinline__ int4 unpair_16_channels(int4 v) {
  auto prmt = [](int a, int b, uint32_t sel) {
    int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
  };
  return make_int4(prmt(v.x, v.y, 0x6420), prmt(v.z, v.w, 0x6420), prmt(v.x, v.y, 0x7531), prmt(v.z, v.w, 0x7531));
}

}  // namespace trtfuse
