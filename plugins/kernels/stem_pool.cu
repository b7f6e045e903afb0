// The network's stem in one kernel: the space-to-depth 7x7/2 conv (a stride-1 4x4 conv over the image folded
// into 16 channels, plugins/stem.py) + BN + ReLU + requantize, then the 3x3/2 max-pool, writing only the pooled
// int8 CHW32 output. The 112x112x64 conv output (4x the pooled bytes) never leaves the SM.
//
// A CTA owns a tile of TPH x TPW pooled pixels of one image, all 64 channels, and loops over such tiles
// (persistent: its weights are loaded once, into registers for mma.sync, into shared memory for wgmma):
//   1. input patch  global -> shared: the folded pixels the tile's conv window reads, zero outside the image
//                   (the conv's padding), 16 bytes per pixel by cp.async, double buffered: the next tile's patch
//                   is in flight while this tile computes;
//   2. conv         shared -> tensor cores: implicit GEMM, M = the tile's CR x CC conv pixels (the pooled tile
//                   plus the pool window's halo, recomputed by the neighbouring tile), N = 64, K = 16 taps x 16
//                   channels. ldmatrix gathers the im2col rows straight from the patch (one pixel's tap is one
//                   16-byte row) into A fragments in registers. On sm_90a (STEM_POOL_WGMMA) each warpgroup feeds
//                   them to wgmma m64n64k32 with the weights in shared memory, 64 pixels x 64 channels per block;
//                   elsewhere a warp runs mma.sync m16n8k32 on 32 channels (its B fragments in registers) and
//                   every 4th m16 tile of pixels;
//   3. epilogue     registers -> shared: docs/ops.md's requantize (requantize_word, as every conv), conv pixels
//                   outside the image written so they never win the max (-128, or 0 after a ReLU);
//   4. pool         shared -> global: 3x3/2 max over the staged conv tile, 16-byte vectors, a warp storing
//                   contiguous CHW32 rows.
// Max commutes with the quantizer (both monotonic), so pooling the requantized int8 equals quantizing the max
// of the conv's fp32 values: the output is bit-identical to the conv kernel followed by the max-pool kernel.
#include "stem_common.cuh"
#if STEM_POOL_WGMMA
#include "wgmma_s8.cuh"
#endif

// The tile is a compile-time choice (plugins/stem.py: POOL_TILES; the launcher passes it and its shared-memory
// byte count, which must equal SMEM_BYTES below).
#ifndef STEM_POOL_TPH
#define STEM_POOL_TPH 8
#endif
#ifndef STEM_POOL_TPW
#define STEM_POOL_TPW 14
#endif

namespace trtfuse {
namespace stem_pool {
using namespace stem;

constexpr int WGMMA_WEIGHT_BYTES = KSTEPS * CH * 32;  // wgmma's B: per k32 step 64 rows x 32 bytes, 32-byte swizzle

// Column c of n8 tile ni holds channel channel_of(ni, c) of a 32-channel group (fused_conv.cu's WarpMma order): a
// thread's accumulators of n8 tiles 2j, 2j + 1 are then 4 consecutive channels, one requantized word.
__device__ __forceinline__ constexpr int channel_of(int ni, int c) { return (ni / 2) * 16 + (c / 2) * 4 + (ni % 2) * 2 + c % 2; }

#if STEM_POOL_WGMMA
// B of k32 step ks: row n = 8 ni + c holds channel channel_of(ni, c), its 32 bytes as two 16-byte chunks, the chunk
// index XOR-ed with bit 2 of the row (CU_TENSOR_MAP_SWIZZLE_32B's pattern, which desc_kmajor_sw32 describes).
// Waited for and fenced for the async proxy before it returns.
__device__ __forceinline__ void load_weights_wgmma(int8_t* weights, const int8_t* w, int tid, int nthreads) {
  for (int v = tid; v < KSTEPS * CH * 2; v += nthreads) {
    const int ks = v / (CH * 2), n = (v / 2) % CH, chunk = v % 2;
    cp_async_16(smem_u32(weights + ks * CH * 32 + n * 32 + ((chunk ^ ((n >> 2) & 1)) * 16)),
                w + channel_of(n / 8, n % 8) * KG + ks * 32 + chunk * 16, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async_shared();  // written through the generic proxy, read by wgmma (async proxy)
}
#endif

// The 4 words of factors a[c .. c + 3], b[c .. c + 3] as requantize_word takes them.
__device__ __forceinline__ void word_factors(const float* factor_a, const float* factor_b, int c, float (&a)[4], float (&b)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = factor_a[c + i], b[i] = factor_b[c + i];
}

constexpr int TPH = STEM_POOL_TPH, TPW = STEM_POOL_TPW;  // pooled pixels per tile
constexpr int CR = (TPH - 1) * PS + PK;             // 17 conv rows per tile
constexpr int CC = (TPW - 1) * PS + PK;             // 29 conv columns
constexpr int PIX = CR * CC, MTILES = (PIX + 15) / 16;
constexpr int IR = CR + R - 1, IC = CC + S - 1;     // input patch rows, columns
constexpr int CSTRIDE = CH + 16;                    // conv tile row: 64 channels + 16 bytes (conflict-free stores)
constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int CHANNEL_WARPS = CH / 32, PIXEL_WARPS = WARPS / CHANNEL_WARPS;
constexpr int PATCH_BYTES = IR * IC * VEC;
constexpr int CONV_BYTES = MTILES * 16 * CSTRIDE;
#if STEM_POOL_WGMMA
constexpr int WEIGHT_BYTES = WGMMA_WEIGHT_BYTES;
#else
constexpr int WEIGHT_BYTES = 0;                     // mma.sync keeps its B fragments in registers
#endif
constexpr int SMEM_BYTES = WEIGHT_BYTES + 2 * PATCH_BYTES + CONV_BYTES + FACTOR_BYTES;
#ifdef STEM_POOL_SMEM
static_assert(STEM_POOL_SMEM == SMEM_BYTES, "plugins/stem.py: pool_smem_bytes must give this kernel's shared memory");
#endif

}  // namespace stem_pool

// One word of the conv tile: 4 consecutive channels c .. c + 3 of conv pixel m (m < PIX), requantized, or `outside`
// where the pixel lies outside the conv's output (the pool's padding: it must never win the max; -128 in every byte,
// or 0 after a ReLU).
__device__ __forceinline__ void store_word(int8_t* conv, int m, int c, const int (&acc)[4], const float* factor_a,
                                           const float* factor_b, bool inside, float relu_min, uint32_t outside) {
  using namespace stem_pool;
  float a[4], b[4];
  word_factors(factor_a, factor_b, c, a, b);
  const uint32_t y = requantize_word<false>(acc, a, b, 0u, 0.0f, relu_min);
  *reinterpret_cast<uint32_t*>(conv + m * CSTRIDE + c) = inside ? y : outside;
}

// Per-byte max of two words whose bytes are all in 0..127 (after the stem's ReLU): 4 instructions where __vmaxs4's
// signed bytes take 6. (a | 0x80) - b in each byte never borrows from the next and keeps its top bit exactly when
// a >= b; PRMT replicates that bit over the byte, and one LOP3 selects a or b.
__device__ __forceinline__ uint32_t max_u7x4(uint32_t a, uint32_t b) {
  uint32_t mask;
  asm("prmt.b32 %0, %1, 0, 0xba98;" : "=r"(mask) : "r"((a | 0x80808080u) - b));
  return (a & mask) | (b & ~mask);
}

// The 3x3/2 max of 16-byte conv-tile chunks: `first` points at the window's top-left chunk. RELU: every byte is in
// 0..127 (conv pixels outside the image stored as 0, which never beats a ReLU output), so max_u7x4 serves.
template <bool RELU>
__device__ __forceinline__ uint4 pool_window(const int8_t* first) {
  using namespace stem_pool;
  const uint32_t start = RELU ? 0u : 0x80808080u;
  uint4 best = make_uint4(start, start, start, start);
  auto max4 = [](uint32_t a, uint32_t b) { return RELU ? max_u7x4(a, b) : __vmaxs4(a, b); };
#pragma unroll
  for (int dr = 0; dr < PK; ++dr)
#pragma unroll
    for (int dc = 0; dc < PK; ++dc) {
      const uint4 x = *reinterpret_cast<const uint4*>(first + (dr * CC + dc) * CSTRIDE);
      best = make_uint4(max4(best.x, x.x), max4(best.y, x.y), max4(best.z, x.z), max4(best.w, x.w));
    }
  return best;
}

// Where lane's ldmatrix row of the m16 tile starting at pixel m0 begins in the patch: pixel m0 + (lane % 8) +
// 8 * ((lane / 8) % 2), at tap 0 (lanes 0..15) or tap 1 (lanes 16..31); rows past PIX read the last pixel (never kept).
__device__ __forceinline__ uint32_t a_row_address(const int8_t* patch, int m0, int lane) {
  using namespace stem_pool;
  const int pix = min(m0 + (lane % 8) + ((lane / 8) % 2) * 8, PIX - 1);
  return smem_u32(patch + ((pix / CC) * IC + pix % CC + (lane / 16)) * VEC);
}

// The A fragment of k32 step ks: taps 2 ks and 2 ks + 1 (same filter row: S is even) of the lane's pixel row.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t row_address, int ks) {
  using namespace stem_pool;
  const int tap = 2 * ks;
  ldmatrix_x4(a, row_address + ((tap / S) * IC + tap % S) * VEC);
}

// p describes the folded conv (C = 16, R = S = 4, stride 1, K = 64, OH x OW its output); PH x PW the pooled output.
// image_index: nullptr, or image n of the batch is image image_index[n] of p.x (a device sample library): the batch is
// read where its images lie, with no gather copy before the launch.
extern "C" __global__ void __launch_bounds__(stem_pool::THREADS, 2) trtfuse_stem_pool(const ConvParams p, int PH, int PW,
                                                                                     const long long* image_index) {
  using namespace stem_pool;
  extern __shared__ __align__(1024) int8_t smem[];
  trap_unless_dynamic_smem(SMEM_BYTES);  // the launcher's byte count (plugins/stem.py) must cover the tiles
  int8_t* const weights = smem;  // (wgmma only; 1024-byte aligned for the swizzle)
  int8_t* const patches = smem + WEIGHT_BYTES;  // two input patches: this tile's and the next one's
  int8_t* const conv = patches + 2 * PATCH_BYTES;
  float* const factor_a = reinterpret_cast<float*>(conv + CONV_BYTES);
  float* const factor_b = factor_a + CH;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;

#if STEM_POOL_WGMMA
  load_weights_wgmma(weights, p.w, tid, THREADS);
#else
  // This warp's 32 channels of every k-step, for the CTA's life: b[ks][ni] is the m16n8k32 B fragment.
  const int channel_warp = warp % CHANNEL_WARPS, pixel_warp = warp / CHANNEL_WARPS;
  uint32_t b[KSTEPS][4][2];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int8_t* row = p.w + (channel_warp * 32 + channel_of(ni, g)) * KG + ks * 32 + q * 4;
      b[ks][ni][0] = __ldg(reinterpret_cast<const uint32_t*>(row));
      b[ks][ni][1] = __ldg(reinterpret_cast<const uint32_t*>(row + 16));
    }
#endif
  fold_factors(factor_a, factor_b, p, tid, THREADS);
  const float relu_min = relu_floor(p.relu != 0);
  const uint32_t outside = p.relu ? 0u : 0x80808080u;  // what an out-of-image conv pixel holds in the conv tile
  const int tiles_h = (PH + TPH - 1) / TPH, tiles_w = (PW + TPW - 1) / TPW;
  const int tiles = p.N * tiles_h * tiles_w;

  // The input patch of tile `tile` into patch buffer `buf` (cp.async, not waited for).
  auto load_patch = [&](int tile, int buf) {
    const StemTile at = StemTile::at<TPH, TPW>(tile, tiles_h, tiles_w, p);
    const int8_t* const image = p.x + (size_t)(image_index ? image_index[at.n] : at.n) * p.H * p.W * VEC;
    load_input_patch<IR, IC, THREADS>(patches + buf * PATCH_BYTES, image, p, at.ir0, at.ic0, tid,
                                      [](int v, int, int) { return v * VEC; });
  };
  if (blockIdx.x < tiles) load_patch(blockIdx.x, 0);

  for (int tile = blockIdx.x, buf = 0; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    const int ph0 = (t / tiles_w) * TPH, pw0 = (t % tiles_w) * TPW;
    const int cr0 = ph0 * PS - PP, cc0 = pw0 * PS - PP;  // the tile's first conv row and column
    const int8_t* const patch = patches + buf * PATCH_BYTES;
    auto inside = [&](int m) {
      const int cr = cr0 + m / CC, cc = cc0 + m % CC;
      return cr >= 0 && cr < p.OH && cc >= 0 && cc < p.OW;
    };

    // 1. this tile's input patch has landed; the next tile's is fetched while this one computes (its buffer was last
    // read by the previous tile's conv, which the barrier after that conv has seen finish)
    cp_async_wait<0>();
    __syncthreads();
    if (tile + gridDim.x < tiles) load_patch(tile + gridDim.x, buf ^ 1);

    // 2 + 3. conv, requantized into the conv tile
#if STEM_POOL_WGMMA
    // warpgroup wg computes m64 blocks wg, wg + 2, ...: warp w of the group rows 16 w .. 16 w + 15 of each
    constexpr int GROUPS = WARPS / 4, BLOCKS = (PIX + 63) / 64;
    // every k-step's A of a block is in registers before its first wgmma (they must not change until it is done);
    // the next block's are loaded as soon as the wgmmas are, so their ldmatrix latency passes under the epilogue
    uint32_t a[KSTEPS][4];
    auto load_block = [&](int blk) {
      const uint32_t row_address = a_row_address(patch, blk * 64 + (warp % 4) * 16, lane);
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) load_a(a[ks], row_address, ks);
    };
    if (warp / 4 < BLOCKS) load_block(warp / 4);
    for (int blk = warp / 4; blk < BLOCKS; blk += GROUPS) {
      const int m0 = blk * 64 + (warp % 4) * 16;
      int acc[32];
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks)
        sm90::WgmmaS8<64>::mma_rs(acc, a[ks], sm90::desc_kmajor_sw32(smem_u32(weights + ks * CH * 32)), ks > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      if (blk + GROUPS < BLOCKS) load_block(blk + GROUPS);
      // register i: row 8 ((i / 2) % 2) + g, n8 tile i / 4, column 2 q + i % 2; tiles 2j, 2j + 1 give channels 16 j + 4 q ..
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + g + 8 * h;
        if (m >= PIX) continue;
        const bool in = inside(m);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int word[4] = {acc[8 * j + 2 * h], acc[8 * j + 2 * h + 1], acc[8 * j + 4 + 2 * h], acc[8 * j + 5 + 2 * h]};
          store_word(conv, m, j * 16 + q * 4, word, factor_a, factor_b, in, relu_min, outside);
        }
      }
    }
#else
    for (int mt = pixel_warp; mt < MTILES; mt += PIXEL_WARPS) {
      const uint32_t row_address = a_row_address(patch, mt * 16, lane);
      int acc[4][4] = {};
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4];
        load_a(a, row_address, ks);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_s8_16832(acc[ni], a, b[ks][ni]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = mt * 16 + g + 8 * h;
        if (m >= PIX) continue;
        const bool in = inside(m);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int word[4] = {acc[2 * j][2 * h], acc[2 * j][2 * h + 1], acc[2 * j + 1][2 * h], acc[2 * j + 1][2 * h + 1]};
          store_word(conv, m, channel_warp * 32 + j * 16 + q * 4, word, factor_a, factor_b, in, relu_min, outside);
        }
      }
    }
#endif
    __syncthreads();

    // 4. pool: vector v = (channel block, pooled row, pooled column, 16-byte half), column and half fastest
    for (int v = tid; v < (CH / 32) * TPH * TPW * 2; v += THREADS) {
      const int half = v % 2, pw = (v / 2) % TPW, ph = (v / (2 * TPW)) % TPH, cb = v / (2 * TPW * TPH);
      if (ph0 + ph >= PH || pw0 + pw >= PW) continue;
      const int8_t* const first = conv + ((ph * PS) * CC + pw * PS) * CSTRIDE + cb * 32 + half * 16;
      const uint4 best = p.relu ? pool_window<true>(first) : pool_window<false>(first);
      *reinterpret_cast<uint4*>(p.y + ((((size_t)n * (CH / 32) + cb) * PH + ph0 + ph) * PW + pw0 + pw) * 32 + half * 16) = best;
    }
    __syncthreads();  // the conv tile is rewritten by the next tile
  }
}

}  // namespace trtfuse
