// Implicit-GEMM INT8 convolution on tensor cores with the fused BN + residual + ReLU + requantize
// epilogue, CHW32 in and out (docs/ops.md; its structure: docs/ARCHITECTURE.md).
//
//   GEMM M = N*OH*OW (output pixels), GEMM N = K (output channels), GEMM K = KGpad (taps x channels)
//   CTA tile BM x BN x 64; WM x WN warps, each a (BM/WM) x (BN/WN) tile of m16n8k32 MMAs;
//   STAGES-deep cp.async ring (global -> shared), fragments double buffered (shared -> registers);
//   grid.x = output tiles (N-tile fastest, so CTAs sharing an activation tile run together and hit
//   L2), grid.y = split-K slices.
//
// Compile-time configuration (one NVRTC compile per tactic): TF_BM TF_BN TF_WM TF_WN TF_STAGES TF_VEC,
// TF_MINB (CTAs per SM the register allocation must allow), TF_PERSISTENT (the general entry loops
// over output tiles, overlapping one tile's epilogue with the next tile's loads).
#include "conv_epilogue.cuh"
#include "conv_iterators.cuh"

namespace trtfuse {

// Channel order: within each 16-channel group of a warp's N range, n8 tiles 2j and 2j+1 are
// interleaved so that the m16n8 C fragment gives every thread 4 consecutive channels per tile pair:
// column c (0..7) of n8 tile ni is channel 16 * (ni / 2) + 4 * (c / 2) + 2 * (ni % 2) + c % 2. A thread
// (lane % 4 = q) then holds channels 16j + 4q .. 16j + 4q + 3 of rows g and g + 8, so the epilogue
// reads the residual and writes the output 4 bytes at a time. The permutation is applied where B
// rows are fetched (load) and undone in channel_of / for_each_acc; the MMA itself does not care.
template <int BM, int BN, int WM, int WN>
struct WarpMma {
  static constexpr int MT = BM / WM / 16, NT = BN / WN / 8;
  static_assert(NT % 2 == 0, "B fragments are loaded two n8 tiles at a time");
  uint32_t a[2][MT][4], b[2][NT][2];

  // Fragments for k32 step `ks` (0 or 1) of a 64-byte stage, into buffer `buf`.
  __device__ __forceinline__ void load(int buf, const int8_t* sa, const int8_t* sb, int wm, int wn, int lane, int ks) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const int row = wm * (BM / WM) + mi * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
      ldmatrix_x4(a[buf][mi], smem_u32(sa + swizzle_64B(row, 2 * ks + lane / 16)));
    }
#pragma unroll
    for (int nj = 0; nj < NT; nj += 2) {
      // lanes 0..15 address n8 tile nj, lanes 16..31 tile nj + 1 (b = lane / 16); column lane % 8
      const int row = wn * (BN / WN) + channel_of(nj + lane / 16, lane % 8);
      uint32_t r[4];
      ldmatrix_x4(r, smem_u32(sb + swizzle_64B_b(row, 2 * ks + (lane / 8) % 2)));
      b[buf][nj][0] = r[0]; b[buf][nj][1] = r[1]; b[buf][nj + 1][0] = r[2]; b[buf][nj + 1][1] = r[3];
    }
  }

  // Channel (within the warp's N range) of column c of n8 tile ni: the interleaving above.
  __host__ __device__ __forceinline__ static constexpr int channel_of(int ni, int c) {
    return (ni / 2) * 16 + (c / 2) * 4 + (ni % 2) * 2 + c % 2;
  }

  // Visit every accumulator with its output pixel m and channel ch (the m16n8 C-fragment layout).
  template <typename F>
  __device__ __forceinline__ static void for_each_acc(int (&acc)[MT][NT][4], int m_base, int n_base, int lane, F&& f) {
    const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          f(m_base + mi * 16 + g + (e / 2) * 8, n_base + channel_of(ni, t2 + e % 2), acc[mi][ni][e]);
  }

  __device__ __forceinline__ void mma(int buf, int (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) mma_s8_16832(acc[mi][ni], a[buf][mi], b[buf][ni]);
  }
};

// The per-launch scalars of the epilogue, computed once per CTA (not per tile).
struct EpilogueScalars {
  float out_scale, out_scale_inv, rs, relu_min;
  __device__ __forceinline__ static EpilogueScalars make(const ConvParams& p, bool has_res) {
    EpilogueScalars k;
    k.out_scale = *p.out_scale;
    k.out_scale_inv = __frcp_rn(k.out_scale);
    k.rs = has_res ? fold_scale(*p.residual_scale, k.out_scale, k.out_scale_inv) : 0.0f;  // 0: see requantize_b32
    k.relu_min = relu_floor(p.relu != 0);
    return k;
  }
};

// The requantizing epilogue of one tile into the staging tile (which holds the residual tile when
// has_res): each thread owns, per pair of n8 tiles (j), 4 consecutive channels of rows g and g + 8 of
// each m16 tile (WarpMma's channel order), so a residual read and an output write are 4 bytes each.
// Channels past Kpad (a partial last N tile) are computed with the factors of channels Kpad - 4 ..
// Kpad - 1 and written to the staging tile only: the store skips them, and no global read goes past Kpad.
template <int BM, int BN, int WM, int WN, int MT, int NT>
__device__ __forceinline__ void requantize_pair(int (&acc)[MT][NT][4], int j, int8_t* rowbase, const float (&a)[4],
                                                const float (&b)[4], float rs, float relu_min) {
  using Out = OutputTile<BM, BN>;
  // All of this pair's residual words are read before any result is written: a read after a write to
  // the same buffer cannot be hoisted by the compiler (it may alias), which would chain every word's
  // shared load -> convert -> FMA -> convert -> store behind the previous one.
  uint32_t res[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      res[mi][h] = *reinterpret_cast<const uint32_t*>(rowbase + (mi * 16 + h * 8) * Out::STRIDE + j * 16);
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t* cell = reinterpret_cast<uint32_t*>(rowbase + (mi * 16 + h * 8) * Out::STRIDE + j * 16);
      const uint32_t r = res[mi][h];  // the residual bytes, or zeros (rs = 0) without a residual
      // channel 4q + e of the group: n8 tile 2j + e / 2, accumulator 2h + e % 2
      const int word[4] = {acc[mi][2 * j][2 * h], acc[mi][2 * j][2 * h + 1], acc[mi][2 * j + 1][2 * h],
                           acc[mi][2 * j + 1][2 * h + 1]};
      *cell = requantize_word(word, a, b, r, rs, relu_min);
    }
}

template <int BM, int BN, int WM, int WN, int MT, int NT>
__device__ __forceinline__ void requantize_tile(const ConvParams& p, const ConvShape& sh, int (&acc)[MT][NT][4],
                                                int8_t* staging, int n0, int lane, int wm, int wn,
                                                const EpilogueScalars& k) {
  using Out = OutputTile<BM, BN>;
  const int g = lane / 4, q = lane % 4;
  const float out_scale = k.out_scale, out_scale_inv = k.out_scale_inv, rs = k.rs, relu_min = k.relu_min;
  int8_t* const rowbase = staging + (wm * (BM / WM) + g) * Out::STRIDE + wn * (BN / WN) + q * 4;
#pragma unroll
  for (int j = 0; j < NT / 2; ++j) {
    const int c = min(n0 + wn * (BN / WN) + j * 16 + q * 4, sh.Kpad - 4);
    float a[4], b[4];
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float2 sc = *reinterpret_cast<const float2*>(p.scale + c + e);
      const float2 bi = *reinterpret_cast<const float2*>(p.bias + c + e);
      a[e] = fold_scale(sc.x, out_scale, out_scale_inv);
      a[e + 1] = fold_scale(sc.y, out_scale, out_scale_inv);
      b[e] = fold_scale(bi.x, out_scale, out_scale_inv);
      b[e + 1] = fold_scale(bi.y, out_scale, out_scale_inv);
    }
    requantize_pair<BM, BN, WM, WN>(acc, j, rowbase, a, b, rs, relu_min);
  }
}

// After the main loop: split-K reduction (if any), then the fp32 classifier output or the fused
// requantizing epilogue through the staging tile (which holds the residual tile on entry).
template <int BM, int BN, int WM, int WN, int NTHREADS, bool SPLIT_K, bool OUT_F32, int MT, int NT>
__device__ __forceinline__ void epilogue(const ConvParams& p, const ConvShape& sh, int (&acc)[MT][NT][4], int8_t* staging,
                                         int m0, int n0, int splits, bool has_res, int tid, int lane, int wm, int wn,
                                         const EpilogueScalars& ks) {
  using Mma = WarpMma<BM, BN, WM, WN>;
  using Out = OutputTile<BM, BN>;
  // ---- split-K: integer partial sums meet in the workspace; the last slice to arrive finishes ----
  if (SPLIT_K) {  // compiled separately: the no-split kernel keeps these registers free
    __shared__ int s_is_last;
    Mma::for_each_acc(acc, m0 + wm * (BM / WM), n0 + wn * (BN / WN), lane, [&](int m, int ch, int& a) {
      if (m < sh.M && ch < sh.Kpad) atomicAdd(p.workspace + (size_t)m * sh.Kpad + ch, a);
    });
    __threadfence();
    __syncthreads();
    if (tid == 0) s_is_last = atomicAdd(p.counters + blockIdx.x, 1) == splits - 1;
    __syncthreads();
    if (!s_is_last) return;
    __threadfence();
    Mma::for_each_acc(acc, m0 + wm * (BM / WM), n0 + wn * (BN / WN), lane, [&](int m, int ch, int& a) {
      if (m < sh.M && ch < sh.Kpad) {
        int* cell = p.workspace + (size_t)m * sh.Kpad + ch;
        a = __ldcg(cell);
        *cell = 0;  // leave the workspace zeroed for the next launch (and CUDA graph replays)
      }
    });
    if (tid == 0) p.counters[blockIdx.x] = 0;
    if (has_res) {
      Out::template prefetch_residual<NTHREADS>(staging, p, sh, m0, n0, tid);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
  }

  // ---- fp32-output GEMM (the classifier): logits = float(acc) * scale + bias, straight from registers ----
  if (OUT_F32) {
    Mma::for_each_acc(acc, m0 + wm * (BM / WM), n0 + wn * (BN / WN), lane, [&](int m, int ch, int& a) {
      if (m < sh.M && ch < p.K) p.y_f32[(size_t)m * p.K + ch] = __fadd_rn(__fmul_rn(__int2float_rn(a), p.scale[ch]), p.bias[ch]);
    });
    return;
  }

  // ---- epilogue: requantize into the staging tile, then coalesced 16-byte stores ----
  requantize_tile<BM, BN, WM, WN>(p, sh, acc, staging, n0, lane, wm, wn, ks);
  __syncthreads();
  Out::template store<NTHREADS>(staging, p, sh, m0, n0, tid);
}

template <int BM, int BN, int WM, int WN, int STAGES, int VEC, bool SPLIT_K, bool OUT_F32 = false,
          bool PERSISTENT = false>
__device__ __forceinline__ void fused_conv_body(const ConvParams& p) {
  constexpr int NTHREADS = WM * WN * 32;
  // A persistent CTA runs tile i's epilogue while tile i+1's operands and residual are in flight, so
  // it double-buffers the staging tile that holds the residual on its way in.
  constexpr int STAGING = PERSISTENT ? 2 : 1;
  using Mma = WarpMma<BM, BN, WM, WN>;
  using Out = OutputTile<BM, BN>;
  extern __shared__ __align__(128) int8_t smem[];
  int8_t* sA = smem;                          // STAGES x BM x 64
  int8_t* sB = sA + STAGES * BM * 64;         // STAGES x BN x 64
  int8_t* sOut = sB + STAGES * BN * 64;       // STAGING x (residual in, output out)
  Tap* taps = reinterpret_cast<Tap*>(sOut + STAGING * Out::BYTES);

  const ConvShape sh = ConvShape::make<VEC>(p);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / WN, wn = warp % WN;
  const int n_tiles = (sh.Kpad + BN - 1) / BN;
  const int tiles = (sh.M + BM - 1) / BM * n_tiles;
  const int splits = SPLIT_K ? p.splits : 1;
  const int kt_begin = blockIdx.y * sh.ktiles / splits, kt_end = (blockIdx.y + 1) * sh.ktiles / splits;
  const bool has_res = !OUT_F32 && p.residual != nullptr;

  EpilogueScalars ks{};
  if (!OUT_F32) ks = EpilogueScalars::make(p, has_res);  // the fp32-output GEMM has no out_scale
  build_tap_table<VEC>(taps, p, sh, tid, NTHREADS);
  // Without a residual the epilogue still reads its staging cells as residual bytes and scales them
  // by rs = 0 (one branch-free path, results unchanged): zero the staging tiles once so that read is
  // of defined data. (After the first tile they hold the previous outputs, as harmless.)
  if (!OUT_F32 && !has_res) {
#pragma unroll 1
    for (int i = tid; i < STAGING * Out::BYTES / 16; i += NTHREADS) reinterpret_cast<int4*>(sOut)[i] = make_int4(0, 0, 0, 0);
  }
  __syncthreads();

  // Everything a tile needs from global memory, as cp.async groups in the order the main loop waits
  // for them: the residual tile first (the oldest group), then STAGES-1 pipeline stages.
  int tile = blockIdx.x;
  int m0 = (tile / n_tiles) * BM, n0 = (tile % n_tiles) * BN;
  ActivationIterator<BM, NTHREADS, VEC> a_iter(p, sh, m0, tid);
  WeightIterator<BN, NTHREADS> b_iter(p, sh, n0, tid);
  auto issue_prologue = [&](int8_t* staging) {
    if (has_res && !SPLIT_K) Out::template prefetch_residual<NTHREADS>(staging, p, sh, m0, n0, tid);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (kt_begin + s < kt_end) {
        a_iter.load(sA + s * BM * 64, taps, p, kt_begin + s);
        b_iter.load(sB + s * BN * 64, sh, kt_begin + s);
      }
      cp_async_commit();
    }
  };
  issue_prologue(sOut);

  for (int iter = 0;; ++iter) {
    int8_t* staging = sOut + (iter % STAGING) * Out::BYTES;
    int acc[Mma::MT][Mma::NT][4];
#pragma unroll
    for (int i = 0; i < Mma::MT; ++i)
#pragma unroll
      for (int j = 0; j < Mma::NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;

    // ---- main loop: STAGES-1 tiles in flight while the tensor cores eat the oldest ----
    Mma mma;
    int read_stage = 0, write_stage = STAGES - 1;
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile kt landed for every thread; stage write_stage is no longer read
      if (kt + STAGES - 1 < kt_end) {
        a_iter.load(sA + write_stage * BM * 64, taps, p, kt + STAGES - 1);
        b_iter.load(sB + write_stage * BN * 64, sh, kt + STAGES - 1);
      }
      cp_async_commit();
      const int8_t* a = sA + read_stage * BM * 64;
      const int8_t* b = sB + read_stage * BN * 64;
      mma.load(0, a, b, wm, wn, lane, 0);
      mma.load(1, a, b, wm, wn, lane, 1);  // second k32 step's fragments in flight during the first MMAs
      mma.mma(0, acc);
      mma.mma(1, acc);
      read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
      write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free and this tile's residual has landed

    // ---- persistent: the next tile's loads go out now and land while this tile's epilogue runs ----
    const int tile_m0 = m0, tile_n0 = n0;
    const int next = tile + gridDim.x;
    const bool more = PERSISTENT && next < tiles;
    if (more) {
      tile = next;
      m0 = (tile / n_tiles) * BM;
      n0 = (tile % n_tiles) * BN;
      a_iter = ActivationIterator<BM, NTHREADS, VEC>(p, sh, m0, fresh_tid());
      b_iter = WeightIterator<BN, NTHREADS>(p, sh, n0, fresh_tid());
      issue_prologue(sOut + ((iter + 1) % STAGING) * Out::BYTES);
    }
    epilogue<BM, BN, WM, WN, NTHREADS, SPLIT_K, OUT_F32>(p, sh, acc, staging, tile_m0, tile_n0, splits, has_res,
                                                          tid, lane, wm, wn, ks);
    if (!more) break;
  }
}

}  // namespace trtfuse

#ifndef TF_BM
#define TF_BM 128
#define TF_BN 128
#define TF_WM 2
#define TF_WN 4
#define TF_STAGES 4
#define TF_VEC 32
#endif
#ifndef TF_MINB
#define TF_MINB 1
#endif
#ifndef TF_PERSISTENT
#define TF_PERSISTENT 0
#endif

#define TF_THREADS (TF_WM * TF_WN * 32)

// General entries (residual optional), used by the Python launcher; split-K is its own kernel.
// TF_PERSISTENT: the grid holds only as many CTAs as fit at once and each loops over output tiles.
extern "C" __global__ void __launch_bounds__(TF_THREADS, TF_MINB) trtfuse_fused_conv(const trtfuse::ConvParams p) {
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, false, false, TF_PERSISTENT != 0>(p);
}
// Split-K runs few, long CTAs: it gets the full register file rather than spill.
extern "C" __global__ void __launch_bounds__(TF_THREADS, 1) trtfuse_fused_conv_splitk(const trtfuse::ConvParams p) {
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, true>(p);
}

// fp32-output GEMM entries (the classifier as a 1x1 conv over [N][C] = CHW32 with H = W = 1).
extern "C" __global__ void __launch_bounds__(TF_THREADS, TF_MINB) trtfuse_gemm_f32out(const trtfuse::ConvParams p) {
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, false, true>(p);
}
extern "C" __global__ void __launch_bounds__(TF_THREADS, 1) trtfuse_gemm_f32out_splitk(const trtfuse::ConvParams p) {
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, true, true>(p);
}

// TensorRT AOT entries: node inputs in order, then int32 extra args, then the output (no split-K,
// which needs a workspace the AOT contract does not give).
#define TF_INT_ARGS int N, int C, int H, int W, int K, int OH, int OW, int R, int S, int sh, int sw, int pt, int pl, int relu
#define TF_FILL_INTS(p)                                                                                       \
  p.N = N; p.C = C; p.H = H; p.W = W; p.K = K; p.OH = OH; p.OW = OW; p.R = R; p.S = S; p.stride_h = sh;     \
  p.stride_w = sw; p.pad_top = pt; p.pad_left = pl; p.relu = relu; p.splits = 1; p.workspace = nullptr;     \
  p.counters = nullptr; p.y_f32 = nullptr; p.div_ohw = trtfuse::FastDivmod::make(OH * OW);                  \
  p.div_ow = trtfuse::FastDivmod::make(OW);

extern "C" __global__ void __launch_bounds__(TF_THREADS, TF_MINB)
    trtfuse_fused_conv_aot(const int8_t* x, const int8_t* w, const float* scale, const float* bias,
                           const float* out_scale, TF_INT_ARGS, int8_t* y) {
  trtfuse::ConvParams p;
  p.x = x; p.w = w; p.scale = scale; p.bias = bias; p.out_scale = out_scale; p.residual = nullptr;
  p.residual_scale = nullptr; p.y = y;
  TF_FILL_INTS(p)
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, false>(p);
}

extern "C" __global__ void __launch_bounds__(TF_THREADS, TF_MINB)
    trtfuse_fused_conv_add_aot(const int8_t* x, const int8_t* w, const float* scale, const float* bias,
                               const float* out_scale, const int8_t* residual, const float* residual_scale,
                               TF_INT_ARGS, int8_t* y) {
  trtfuse::ConvParams p;
  p.x = x; p.w = w; p.scale = scale; p.bias = bias; p.out_scale = out_scale; p.residual = residual;
  p.residual_scale = residual_scale; p.y = y;
  TF_FILL_INTS(p)
  trtfuse::fused_conv_body<TF_BM, TF_BN, TF_WM, TF_WN, TF_STAGES, TF_VEC, false>(p);
}
