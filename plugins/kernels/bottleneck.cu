// ResNet's identity bottleneck block in one kernel: conv1 1x1 (256 -> 64) + BN + ReLU + requantize, conv2 3x3 pad 1
// (64 -> 64) + BN + ReLU + requantize, conv3 1x1 (64 -> 256) + BN + the block's input as residual + ReLU +
// requantize. Only the block's input is read from and its output written to global memory: the two 64-channel
// intermediates (each read back once per consumer by the three separate convs) never leave the SM.
//
// A CTA owns a tile of TH x TW output pixels of one image, all 256 channels, and loops over such tiles (persistent:
// the three weight matrices are copied into shared memory once, 68 KB, and stay there):
//   1. input patch  global -> shared: the block input over the tile plus a 1-pixel border (the halo conv2 needs),
//                   all 256 channels, zero outside the image, by cp.async. PATCH_BUFFERS = 2 (where shared memory
//                   holds two, 183 KB in all: sm_90): the next tile's patch is in flight while this tile computes;
//                   1 (141 KB: sm_80's 163 KB): it is fetched once this tile is stored;
//   2. conv1        patch -> mid1: the halo's HALO pixels (recomputed by neighbouring tiles), requantized; halo
//                   pixels outside the image are stored as 0, which is what conv2's zero padding reads there (conv1
//                   of a zero input would be relu(bias), not 0);
//   3. conv2        mid1 -> mid2: implicit GEMM over 9 taps gathered from mid1 by ldmatrix, requantized;
//   4. conv3        mid2 -> patch: requantized with the residual read from the patch's centre, each result written
//                   over the residual word it consumed (one thread reads and writes each word, so no staging tile);
//   5. store        patch centre -> global, 16-byte vectors, a warp storing contiguous CHW32 rows.
// Every GEMM is mma.sync m16n8k32 with A and B fragments loaded by ldmatrix from shared memory; every epilogue is
// requantize_word, as in the separate convs: the output is bit-identical to conv1, conv2, conv3 run one by one.
#include "conv_epilogue.cuh"

namespace trtfuse {
namespace bottleneck {

constexpr int WIDTH = 64, CIN = 4 * WIDTH, COUT = CIN;  // the identity block: output channels = input channels
constexpr int TH = 8, TW = 14;                            // output pixels per tile (56 = 7 x 8 = 4 x 14)
constexpr int HH = TH + 2, HW = TW + 2;                   // the halo conv2's 3x3 window reads
constexpr int HALO = HH * HW, OUT = TH * TW;              // 160 and 112 pixels: whole m16 tiles
constexpr int HALO_MT = HALO / 16, OUT_MT = OUT / 16;
static_assert(HALO % 16 == 0 && OUT % 16 == 0, "the tile's pixel counts must be whole m16 tiles");
constexpr int K1 = CIN, K2 = 9 * WIDTH, K3 = WIDTH;       // GEMM-K of each conv (docs/ops.md's packed weight rows)
// Shared rows padded by 16 bytes: an odd number of 16-byte units per row puts ldmatrix's 8 consecutive rows in 8
// distinct bank groups.
constexpr int PATCH_STRIDE = CIN + 16, MID_STRIDE = WIDTH + 16;
constexpr int W1_STRIDE = K1 + 16, W2_STRIDE = K2 + 16, W3_STRIDE = K3 + 16;
constexpr int WARPS = 8, THREADS = 32 * WARPS;
static_assert(WIDTH == 64 && WARPS == 8, "the warp partitions below are written for width 64 on 8 warps");

constexpr int W1_BYTES = WIDTH * W1_STRIDE, W2_BYTES = WIDTH * W2_STRIDE, W3_BYTES = COUT * W3_STRIDE;
constexpr int PATCH_BYTES = HALO * PATCH_STRIDE;
constexpr int MID1_BYTES = HALO * MID_STRIDE, MID2_BYTES = OUT * MID_STRIDE;
constexpr int FACTOR_BYTES = 2 * (WIDTH + WIDTH + COUT) * 4;  // a, b of each conv's requantize
#ifndef BOTTLENECK_PATCH_BUFFERS
#define BOTTLENECK_PATCH_BUFFERS 2
#endif
constexpr int PATCH_BUFFERS = BOTTLENECK_PATCH_BUFFERS;
static_assert(PATCH_BUFFERS == 1 || PATCH_BUFFERS == 2, "one patch, or this tile's and the next one's");
constexpr int SMEM_BYTES = W1_BYTES + W2_BYTES + W3_BYTES + PATCH_BUFFERS * PATCH_BYTES + MID1_BYTES + MID2_BYTES + FACTOR_BYTES;
#ifdef BOTTLENECK_SMEM_BYTES  // the launcher's count (plugins/bottleneck.py), checked where both are known
static_assert(SMEM_BYTES == BOTTLENECK_SMEM_BYTES, "plugins/bottleneck.py's SMEM_BYTES disagrees with the kernel's");
#endif

// Physical weight row 8 ni + c (n8 tile ni, column c) holds output channel channel_of(ni, c) (fused_conv.cu's WarpMma
// interleave): a thread's accumulators of n8 tiles 2j, 2j + 1 are then 4 consecutive channels, one requantized word,
// and the 8 rows ldmatrix reads for one n8 tile are consecutive (conflict-free with the padded stride).
__device__ __forceinline__ constexpr int channel_of(int ni, int c) { return (ni / 2) * 16 + (c / 2) * 4 + (ni % 2) * 2 + c % 2; }

}  // namespace bottleneck

// The block's operands: each conv's as docs/ops.md gives them (x of conv2, conv3 are on-chip here); the residual is
// x, with residual_scale = x's scale. y: int8 CHW32 [N, 256, H, W].
struct BottleneckParams {
  const int8_t* x;  // [N][8][H][W][32]
  const int8_t* w1;
  const float *scale1, *bias1, *out_scale1;
  const int8_t* w2;
  const float *scale2, *bias2, *out_scale2;
  const int8_t* w3;
  const float *scale3, *bias3, *out_scale3;
  const float* residual_scale;
  int8_t* y;
  int N, H, W, relu1, relu2, relu3;
};
static_assert(sizeof(BottleneckParams) == 15 * 8 + 6 * 4, "plugins/bottleneck.py's BottleneckParamsStruct mirrors it");

// acc[mi][ni] += A(m16 tile mi) x B(n8 tile ni) over KSTEPS k32 steps.
// a_row[mi]: the shared address of the lane's ldmatrix row of m16 tile mi at k-step 0 (row (lane % 8) + 8 ((lane / 8)
// % 2), 16-byte chunk lane / 16); a_step(ks): the byte offset of k-step ks in A, a constant once unrolled.
// b_row: the lane's ldmatrix row of the warp's first n8 tile pair (physical row 8 (lane / 16) + lane % 8, chunk
// (lane / 8) % 2); k-step ks is 32 bytes on, n8 tile pair nj / 2 is 16 rows on.
template <int MT, int NT, int KSTEPS, int B_STRIDE, typename AStep>
__device__ __forceinline__ void warp_gemm(int (&acc)[MT][NT][4], const uint32_t (&a_row)[MT], uint32_t b_row,
                                          AStep a_step) {
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    uint32_t b[NT][2];
#pragma unroll
    for (int nj = 0; nj < NT; nj += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, b_row + nj * 8 * B_STRIDE + ks * 32);
      b[nj][0] = r[0]; b[nj][1] = r[1]; b[nj + 1][0] = r[2]; b[nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      uint32_t a[4];
      ldmatrix_x4(a, a_row[mi] + a_step(ks));
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) mma_s8_16832(acc[mi][ni], a, b[ni]);
    }
  }
}

// Visit every requantized word of a warp's accumulators: f(mi, pixel row g + 8 h of m16 tile mi, channel offset
// 16 j + 4 q of the warp's first channel, the word's 4 accumulators in channel order).
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_each_word(const int (&acc)[MT][NT][4], int lane, F&& f) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        const int word[4] = {acc[mi][2 * j][2 * h], acc[mi][2 * j][2 * h + 1], acc[mi][2 * j + 1][2 * h],
                             acc[mi][2 * j + 1][2 * h + 1]};
        f(mi, g + 8 * h, j * 16 + q * 4, word);
      }
}

// The folded factors of channels c .. c + 3.
__device__ __forceinline__ void load_factors(float (&a)[4], float (&b)[4], const float* fa, const float* fb, int c) {
  const float4 va = *reinterpret_cast<const float4*>(fa + c), vb = *reinterpret_cast<const float4*>(fb + c);
  a[0] = va.x; a[1] = va.y; a[2] = va.z; a[3] = va.w;
  b[0] = vb.x; b[1] = vb.y; b[2] = vb.z; b[3] = vb.w;
}

// Copy a packed weight matrix [rows][KG] (docs/ops.md) into shared rows of STRIDE bytes in the interleaved order
// channel_of gives (cp.async, not waited for).
template <int KG, int STRIDE>
__device__ __forceinline__ void load_weight(int8_t* dst, const int8_t* w, int rows, int tid) {
  constexpr int CHUNKS = KG / 16;
  for (int v = tid; v < rows * CHUNKS; v += bottleneck::THREADS) {
    const int row = v / CHUNKS, chunk = v % CHUNKS;
    const int channel = (row / 32) * 32 + bottleneck::channel_of((row % 32) / 8, row % 8);
    cp_async_16(smem_u32(dst + row * STRIDE + chunk * 16), w + (size_t)channel * KG + chunk * 16, true);
  }
}

// Per-channel factors of one conv's requantize (docs/ops.md step 2.1).
__device__ __forceinline__ void fold_factors(float* fa, float* fb, const float* scale, const float* bias,
                                             const float* out_scale_ptr, int channels, int tid) {
  const float out_scale = *out_scale_ptr, out_scale_inv = __frcp_rn(out_scale);
  for (int c = tid; c < channels; c += bottleneck::THREADS) {
    fa[c] = fold_scale(scale[c], out_scale, out_scale_inv);
    fb[c] = fold_scale(bias[c], out_scale, out_scale_inv);
  }
}

extern "C" __global__ void __launch_bounds__(bottleneck::THREADS, 1) trtfuse_bottleneck(const BottleneckParams p) {
  using namespace bottleneck;
  extern __shared__ __align__(128) int8_t smem[];
  trap_unless_dynamic_smem(SMEM_BYTES);  // the launcher's byte count (plugins/bottleneck.py) must cover the tiles
  int8_t* const w1 = smem;
  int8_t* const w2 = w1 + W1_BYTES;
  int8_t* const w3 = w2 + W2_BYTES;
  int8_t* const patches = w3 + W3_BYTES;  // this tile's input patch (and the next one's, with two buffers)
  int8_t* const mid1 = patches + PATCH_BUFFERS * PATCH_BYTES;
  int8_t* const mid2 = mid1 + MID1_BYTES;
  float* const fa1 = reinterpret_cast<float*>(mid2 + MID2_BYTES);
  float* const fb1 = fa1 + WIDTH;
  float* const fa2 = fb1 + WIDTH;
  float* const fb2 = fa2 + WIDTH;
  float* const fa3 = fb2 + WIDTH;
  float* const fb3 = fa3 + COUT;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  load_weight<K1, W1_STRIDE>(w1, p.w1, WIDTH, tid);
  load_weight<K2, W2_STRIDE>(w2, p.w2, WIDTH, tid);
  load_weight<K3, W3_STRIDE>(w3, p.w3, COUT, tid);
  cp_async_commit();
  fold_factors(fa1, fb1, p.scale1, p.bias1, p.out_scale1, WIDTH, tid);
  fold_factors(fa2, fb2, p.scale2, p.bias2, p.out_scale2, WIDTH, tid);
  fold_factors(fa3, fb3, p.scale3, p.bias3, p.out_scale3, COUT, tid);
  const float rs = fold_scale(*p.residual_scale, *p.out_scale3, __frcp_rn(*p.out_scale3));
  const float relu1 = relu_floor(p.relu1 != 0), relu2 = relu_floor(p.relu2 != 0), relu3 = relu_floor(p.relu3 != 0);

  const int tiles_h = (p.H + TH - 1) / TH, tiles_w = (p.W + TW - 1) / TW;
  const int tiles = p.N * tiles_h * tiles_w;
  // The patch of tile `tile` into buffer `buf` (cp.async, not waited for): vector v = (channel block, halo pixel,
  // 16-byte half), half and pixel fastest, so a warp reads contiguous CHW32 rows.
  auto load_patch = [&](int tile, int buf) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    const int ih0 = (t / tiles_w) * TH - 1, iw0 = (t % tiles_w) * TW - 1;
    for (int v = tid; v < (CIN / 32) * HALO * 2; v += THREADS) {
      const int half = v % 2, pix = (v / 2) % HALO, cb = v / (2 * HALO);
      const int ih = ih0 + pix / HW, iw = iw0 + pix % HW;
      const bool in_image = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
      const int8_t* src = p.x + ((((size_t)n * (CIN / 32) + cb) * p.H + (in_image ? ih : 0)) * p.W + (in_image ? iw : 0)) * 32;
      cp_async_16(smem_u32(patches + buf * PATCH_BYTES + pix * PATCH_STRIDE + cb * 32 + half * 16), src + half * 16, in_image);
    }
    cp_async_commit();
  };
  if (blockIdx.x < tiles) load_patch(blockIdx.x, 0);

  // Lane offsets of ldmatrix rows: A row (lane % 8) + 8 ((lane / 8) % 2) at chunk lane / 16; B (physical weight) row
  // 8 (lane / 16) + lane % 8 at chunk (lane / 8) % 2.
  const int a_pix = lane % 8 + 8 * ((lane / 8) % 2), a_chunk = (lane / 16) * 16;
  const int b_row = 8 * (lane / 16) + lane % 8, b_chunk = ((lane / 8) % 2) * 16;

  for (int tile = blockIdx.x, buf = 0; tile < tiles; tile += gridDim.x, buf = (buf + 1) % PATCH_BUFFERS) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    const int oh0 = (t / tiles_w) * TH, ow0 = (t % tiles_w) * TW;
    int8_t* const patch = patches + buf * PATCH_BYTES;

    // 1. this tile's patch (and, the first time, the weights) has landed; with two buffers the next tile's patch is
    // fetched while this one computes (its buffer was last read by the previous tile, which the barrier has seen finish)
    cp_async_wait<0>();
    __syncthreads();
    if (PATCH_BUFFERS == 2 && tile + gridDim.x < tiles) load_patch(tile + gridDim.x, buf ^ 1);

    // 2. conv1 over the halo: warp = 16 channels (warp % 4) x m16 tiles warp / 4, + 2, .. (10 tiles, 5 each)
    {
      constexpr int MT = HALO_MT / 2;
      const int c0 = (warp % 4) * 16, pg = warp / 4;
      uint32_t a_row[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) a_row[i] = smem_u32(patch + ((pg + 2 * i) * 16 + a_pix) * PATCH_STRIDE + a_chunk);
      int acc[MT][2][4] = {};
      warp_gemm<MT, 2, K1 / 32, W1_STRIDE>(acc, a_row, smem_u32(w1 + (c0 + b_row) * W1_STRIDE + b_chunk),
                                           [](int ks) { return ks * 32; });
      for_each_word(acc, lane, [&](int mi, int r, int c, const int (&word)[4]) {
        const int pix = (pg + 2 * mi) * 16 + r, ih = oh0 - 1 + pix / HW, iw = ow0 - 1 + pix % HW;
        float a[4], b[4];
        load_factors(a, b, fa1, fb1, c0 + c);
        const uint32_t y = requantize_word<false>(word, a, b, 0u, 0.0f, relu1);
        const bool in_image = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
        *reinterpret_cast<uint32_t*>(mid1 + pix * MID_STRIDE + c0 + c) = in_image ? y : 0u;
      });
    }
    __syncthreads();

    // 3. conv2 over the tile: warp = 16 channels (warp % 4) x m16 tiles warp / 4, + 2, .. (7 tiles: 4 and 3; the
    // short warps repeat tile 6 and drop it). K-step ks = (cb * 3 + dr) * 3 + ds is tap (dr, ds) of channel block cb.
    {
      constexpr int MT = (OUT_MT + 1) / 2;
      const int c0 = (warp % 4) * 16, pg = warp / 4;
      uint32_t a_row[MT];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int m = min(pg + 2 * i, OUT_MT - 1) * 16 + a_pix;  // output pixel (m / TW, m % TW): halo (r + dr, c + ds)
        a_row[i] = smem_u32(mid1 + ((m / TW) * HW + m % TW) * MID_STRIDE + a_chunk);
      }
      int acc[MT][2][4] = {};
      warp_gemm<MT, 2, K2 / 32, W2_STRIDE>(acc, a_row, smem_u32(w2 + (c0 + b_row) * W2_STRIDE + b_chunk), [](int ks) {
        return (((ks / 3) % 3) * HW + ks % 3) * MID_STRIDE + (ks / 9) * 32;
      });
      for_each_word(acc, lane, [&](int mi, int r, int c, const int (&word)[4]) {
        if (pg + 2 * mi >= OUT_MT) return;
        float a[4], b[4];
        load_factors(a, b, fa2, fb2, c0 + c);
        *reinterpret_cast<uint32_t*>(mid2 + ((pg + 2 * mi) * 16 + r) * MID_STRIDE + c0 + c) =
            requantize_word<false>(word, a, b, 0u, 0.0f, relu2);
      });
    }
    __syncthreads();

    // 4. conv3 + residual over the tile: warp = 32 channels x all 7 m16 tiles; each result replaces its residual word
    {
      const int c0 = warp * 32;
      uint32_t a_row[OUT_MT];
#pragma unroll
      for (int i = 0; i < OUT_MT; ++i) a_row[i] = smem_u32(mid2 + (i * 16 + a_pix) * MID_STRIDE + a_chunk);
      int acc[OUT_MT][4][4] = {};
      warp_gemm<OUT_MT, 4, K3 / 32, W3_STRIDE>(acc, a_row, smem_u32(w3 + (c0 + b_row) * W3_STRIDE + b_chunk),
                                               [](int ks) { return ks * 32; });
      for_each_word(acc, lane, [&](int mi, int r, int c, const int (&word)[4]) {
        const int m = mi * 16 + r;
        uint32_t* const cell = reinterpret_cast<uint32_t*>(patch + ((m / TW + 1) * HW + m % TW + 1) * PATCH_STRIDE + c0 + c);
        float a[4], b[4];
        load_factors(a, b, fa3, fb3, c0 + c);
        *cell = requantize_word<true>(word, a, b, *cell, rs, relu3);
      });
    }
    __syncthreads();

    // 5. store: vector v = (channel block, output pixel, 16-byte half), half and pixel fastest
    for (int v = tid; v < (COUT / 32) * OUT * 2; v += THREADS) {
      const int half = v % 2, m = (v / 2) % OUT, cb = v / (2 * OUT);
      const int oh = oh0 + m / TW, ow = ow0 + m % TW;
      if (oh >= p.H || ow >= p.W) continue;
      const int4 y = *reinterpret_cast<const int4*>(patch + ((m / TW + 1) * HW + m % TW + 1) * PATCH_STRIDE + cb * 32 + half * 16);
      *reinterpret_cast<int4*>(p.y + ((((size_t)n * (COUT / 32) + cb) * p.H + oh) * p.W + ow) * 32 + half * 16) = y;
    }
    // Two buffers: no barrier, the next tile writes mid1 and this buffer only after its own first barrier. One: the
    // patch is refilled once every thread has stored its part of this tile.
    if (PATCH_BUFFERS == 1 && tile + gridDim.x < tiles) {
      __syncthreads();
      load_patch(tile + gridDim.x, 0);
    }
  }
}

}  // namespace trtfuse
