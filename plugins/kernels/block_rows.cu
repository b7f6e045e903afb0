// ResNet-50's res2 identity bottleneck block as a row pipeline on wgmma (sm_90a):
//   a = FusedConv(x; conv1 1x1 256 -> 64, ReLU)
//   b = FusedConv(a; conv2 3x3 pad 1 64 -> 64, ReLU)
//   y = FusedConvAdd(b; conv3 1x1 64 -> 256, residual x, ReLU)
// y is the only tensor written; a and b live in shared memory a few image rows at a time (plugins/block_rows.py,
// docs/design/block-rows.md). Bit-identical to fused_conv_int8 three times: the same integer accumulators and the same
// requantize code (wgmma_pixel_requantize.cuh) as the wgmma conv kernels.
//
// A CTA is persistent and takes whole images; per image it walks the rows. A row is W <= 64 pixels on wgmma's M
// (rows W .. 63 of every tile are junk: computed, never stored, never read into a stored pixel; a warp whose pixels are
// all junk still requantizes them: skipping them measured slower, the branch costing the other warps' interleaving of
// their two pixel halves). The warpgroups:
//   conv1 (WG 0)        per row k: wgmma m64n64k32 x 8 on x[k] (its ring slot), requantize, a[k] into the a ring
//   conv2 (WG 1)        per row r: wgmma m64n64k32 x 18 over a[r-1], a[r], a[r+1] (a zero tile past the image),
//                       b[r] into the b ring
//   conv3 (WG 2 .. 5)   per row r, each warpgroup its C / CONV3_WGS of the 256 channels in passes of N3: wgmma
//                       m64nN3k32 x 2 on b[r], requantize with the residual x[r] (still in its slot), y[r] to
//                       global memory; then it is done with x[r]'s slot
//   producer (the last) the three weights once (resident), then per row x[r] by TMA into the x ring.
// conv3 has several warpgroups because its epilogue is the pipeline's longest: 256 channels with the residual against
// conv1's and conv2's 64 (measured: one conv3 warpgroup issued on every cycle it could while conv1 and conv2 waited
// on its rings; docs/design/block-rows.md has the measurements behind CONV3_WGS and N3).
// Each ring counts one use per row, continuously across the CTA's images, so every stage walks the same use
// sequence (PipelineState). conv1 runs up to a row ahead of conv2 (the 3x3 needs a[r + 1]), conv3 a row behind.
//
// The 3x3's horizontal taps: each a row is written three times, shifted (copy s holds at tile row m the pixel
// m + s - 1, zero where that is outside the image), so that every tap's A operand is a whole aligned tile, the layout
// TMA writes and desc_kmajor_sw32 describes. (Pointing a descriptor 32 bytes into one tile would save the copies but
// lean on how wgmma phases its swizzle for a start inside a pattern, which nothing here has measured.)
#include "conv_params.cuh"
#include "wgmma_pipeline.cuh"
#include "wgmma_pixel_requantize.cuh"
#include "wgmma_s8.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "block_rows.cu needs the sm_90a target (wgmma)"
#endif

#ifndef BLOCK_ROWS_X_STAGES
#define BLOCK_ROWS_X_STAGES 5
#endif

namespace trtfuse {
namespace rows {

constexpr int C = 256, WIDTH = 64;          // block channels, bottleneck width
constexpr int BM = 64;                      // tile rows (pixels of an image row, padded): one warpgroup's m64
constexpr int X_STAGES = BLOCK_ROWS_X_STAGES, A_STAGES = 4, B_STAGES = 2;
#ifndef BLOCK_ROWS_CONV3_WGS
#define BLOCK_ROWS_CONV3_WGS 4
#endif
constexpr int CONV3_WGS = BLOCK_ROWS_CONV3_WGS;  // conv3's warpgroups, C / CONV3_WGS channels each
constexpr int GEMM_THREADS = 128 * (2 + CONV3_WGS), THREADS = GEMM_THREADS + 128;  // + the producer's warpgroup
constexpr int CONV3_WARPS = 4 * CONV3_WGS;  // arrivals that give an x or b slot back
constexpr int KT1 = C / 32, KT2 = 9 * WIDTH / 32, KT3 = WIDTH / 32;  // k32 steps of the three GEMMs
constexpr int TILE = BM * 32;               // one k32 step of a [64 rows][32] operand tile
// 640 threads: ptxas builds every path for 96 registers (65536 / 640, to a multiple of 8), which setmaxnreg cannot
// raise afterwards, so a conv3 warpgroup's 128 channels go in passes of N3 channels (BLOCK_ROWS_CONV3_N: two passes
// of m64n64, 32 accumulators live, or one of m64n128, 64) and no warpgroup moves registers.
#ifndef BLOCK_ROWS_CONV3_N
#define BLOCK_ROWS_CONV3_N 64
#endif
constexpr int N3 = BLOCK_ROWS_CONV3_N, C3 = C / CONV3_WGS, PASSES3 = C3 / N3;
static_assert((N3 == 64 || N3 == 128) && C3 % N3 == 0, "a conv3 pass is one m64n64 or m64n128 wgmma per k32 step");
// conv2's window is three a rows (three slots would be correct); the fourth lets conv1 write a[r + 2] while conv2
// reads a[r - 1 .. r + 1]. x[r] is held from its load until conv3's row r, about two rows after conv1 took it.
static_assert(A_STAGES >= 4 && B_STAGES >= 2 && X_STAGES >= 4, "ring depths of the schedule");
// The first accumulator of each word converts on the XU pipe: exact while |acc| <= 2^24, GEMM-K <= 1024.
constexpr int kAccOnXu = 1;

// Shared memory, from a 1024-byte-aligned base (the launcher asks for BYTES + 1024). Every operand tile is K-major,
// [64 or 256 rows][32 bytes] per k32 step, 32-byte swizzle (wgmma's layout type 3, 8-row groups 256 bytes apart).
struct Smem {
  static constexpr int W1 = 0;                            // KT1 x [64 rows][32], rows permuted (plugins/wgmma.py)
  static constexpr int W2 = W1 + KT1 * WIDTH * 32;        // KT2 x [64][32]: step 9 c + 3 dr + ds (pack_weight's order)
  static constexpr int W3 = W2 + KT2 * WIDTH * 32;        // KT3 x [256][32]
  static constexpr int X_SLOT = KT1 * TILE;               // x[r]: channel block j at j * TILE, pixels 0 .. W - 1
  static constexpr int X = W3 + KT3 * C * 32;
  static constexpr int A_COPY = KT3 * TILE;               // one shifted copy of a row of a: 2 channel blocks
  static constexpr int A_SLOT = 3 * A_COPY;               // copies s = 0, 1, 2 (tap column ds = s)
  static constexpr int A = X + X_STAGES * X_SLOT;
  static constexpr int ZERO = A + A_STAGES * A_SLOT;      // conv2's taps above the first row and below the last
  static constexpr int B = ZERO + A_COPY;                 // b[r]: 2 channel blocks
  static constexpr int FACTORS = B + B_STAGES * A_COPY;   // folded scale, bias of conv1 [64], conv2 [64], conv3 [256]
  static constexpr int BARS = FACTORS + 2 * (WIDTH + WIDTH + C) * 4;
  static constexpr int X_FULL = BARS, X_EMPTY = X_FULL + 8 * X_STAGES, A_FULL = X_EMPTY + 8 * X_STAGES,
                       A_EMPTY = A_FULL + 8 * A_STAGES, B_FULL = A_EMPTY + 8 * A_STAGES, B_EMPTY = B_FULL + 8 * B_STAGES,
                       WEIGHTS_FULL = B_EMPTY + 8 * B_STAGES;
  static constexpr int BYTES = WEIGHTS_FULL + 8;
  static_assert(W2 % 1024 == 0 && W3 % 1024 == 0 && X % 1024 == 0 && A % 1024 == 0 && ZERO % 1024 == 0 &&
                B % 1024 == 0 && X_SLOT % 1024 == 0 && A_COPY % 1024 == 0, "swizzled tiles start 1024-byte aligned");
  static_assert(BYTES + 1024 <= 227 * 1024, "sm_90's opt-in shared memory per CTA");
};
#ifdef BLOCK_ROWS_SMEM
static_assert(BLOCK_ROWS_SMEM == Smem::BYTES + 1024, "plugins/block_rows.py: smem_bytes must give this kernel's shared memory");
#endif

}  // namespace rows

// Mirrored by plugins/block_rows.py: BlockRowsParams (same field order). x and the weights reach the kernel through
// their tensor maps only.
struct BlockRowsParams {
  const float* scale1;          // [64] conv1: x_scale * w1_scale
  const float* bias1;           // [64]
  const float* out_scale1;      // [1] a's scale
  const float* scale2;          // [64] conv2
  const float* bias2;           // [64]
  const float* out_scale2;      // [1] b's scale
  const float* scale3;          // [256] conv3
  const float* bias3;           // [256]
  const float* out_scale3;      // [1] y's scale
  const float* residual_scale;  // [1] x's scale
  int8_t* y;                    // [N][8][H][W][32]
  int N, H, W, relu1, relu2, relu3;
};

namespace rows {

// The three rings' mbarriers. Full: x by the copy engine's bytes, a and b by the 128 threads that wrote the row. Empty:
// one arrival per warp of the reader that frees the slot (conv3's eight warps for x and b, conv2's four for a).
struct Rings {
  MbarrierRing<X_STAGES> x;
  MbarrierRing<A_STAGES> a;
  MbarrierRing<B_STAGES> b;
  uint32_t weights_full;
  __device__ __forceinline__ explicit Rings(uint32_t base)
      : x{base + Smem::X_FULL, base + Smem::X_EMPTY}, a{base + Smem::A_FULL, base + Smem::A_EMPTY},
        b{base + Smem::B_FULL, base + Smem::B_EMPTY}, weights_full(base + Smem::WEIGHTS_FULL) {}
};

// Where bytes 8q .. 8q + 7 of channel block j of tile row m lie in a [j][64][32] tile: the 16-byte half XOR-ed with bit
// 2 of the row, the 32-byte swizzle TMA writes (CU_TENSOR_MAP_SWIZZLE_32B) and desc_kmajor_sw32 reads.
__device__ __forceinline__ int tile_offset(int m, int j, int q) {
  return j * TILE + m * 32 + (((q >> 1) ^ ((m >> 2) & 1)) << 4) + ((q & 1) << 3);
}

// A GEMM's first wgmma overwrites its accumulators (scale-d false): an empty asm gives them a value without an
// instruction, so no accumulator is carried across rows.
template <int N>
__device__ __forceinline__ void fresh_accumulators(int (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "=r"(acc[i]));
}

// docs/ops.md's per-channel factors of a conv folded by its out_scale, for channels [0, k), by the GEMM threads.
__device__ __forceinline__ void fold(const float* scale, const float* bias, const float* out_scale, int k, float* dst) {
  const float out = *out_scale, inv = __frcp_rn(out);
  for (int c = threadIdx.x; c < k; c += GEMM_THREADS) {
    dst[c] = fold_scale(scale[c], out, inv);
    dst[k + c] = fold_scale(bias[c], out, inv);
  }
}

// The factors of channel block j's 8 channels that lane class q owns (channels 32j + 8q ..).
__device__ __forceinline__ void block_factors(const float* folded, int k, int j, int q, float4 (&sc)[2], float4 (&bi)[2]) {
  const float4* f = reinterpret_cast<const float4*>(folded + 32 * j + 8 * q);
  const float4* g = reinterpret_cast<const float4*>(folded + k + 32 * j + 8 * q);
  sc[0] = f[0], sc[1] = f[1], bi[0] = g[0], bi[1] = g[1];
}

// A GEMM warpgroup's thread: tile rows (pixels) 16 warp + lane / 4 + 8h, h = 0, 1, and per channel block the 8
// channels 8 (lane % 4) .. of each (the weight rows are permuted so the accumulators fall that way).
struct Lane {
  int warp, lane, q, px[2];
  __device__ __forceinline__ Lane() : warp((threadIdx.x % 128) / 32), lane(threadIdx.x % 32), q(lane % 4),
                                      px{16 * warp + lane / 4, 16 * warp + lane / 4 + 8} {}
  // one arrival per warp, once every lane is done with what it guards
  __device__ __forceinline__ void warp_arrive(uint32_t bar) const {
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar);
  }
};

// Rows with generic-proxy stores, read next by wgmma (the async proxy): each thread fences its own stores and arrives.
__device__ __forceinline__ void publish(uint32_t full) {
  sm90::fence_proxy_async_shared();
  sm90::mbar_arrive(full);
}

// conv1: a[k] = requantize(x[k] W1), each pixel written into the three shifted copies (zero past the image's edge).
__device__ __forceinline__ void conv1_row(const BlockRowsParams& p, int8_t* smem, uint32_t base, const Rings& rings,
                                          const Lane& t, PipelineState<X_STAGES> xs, PipelineState<A_STAGES> as) {
  const uint32_t x_slot = base + Smem::X + xs.index() * Smem::X_SLOT;
  int acc[WIDTH / 2];
  fresh_accumulators(acc);
  rings.x.wait_full(xs);
  sm90::wgmma_fence();
#pragma unroll
  for (int j = 0; j < KT1; ++j)
    sm90::WgmmaS8<WIDTH>::mma(acc, sm90::desc_kmajor_sw32(x_slot + j * TILE), sm90::desc_kmajor_sw32(base + Smem::W1 + j * WIDTH * 32), j > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();

  rings.a.wait_empty(as);
  int8_t* const slot = smem + Smem::A + as.index() * Smem::A_SLOT;
  const float* folded = reinterpret_cast<const float*>(smem + Smem::FACTORS);
  const float relu = relu_floor(p.relu1 != 0);
#pragma unroll
  for (int j = 0; j < KT3; ++j) {
    float4 sc[2], bi[2];
    block_factors(folded, WIDTH, j, t.q, sc, bi);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 out = requantize_8_channels<kAccOnXu, WIDTH / 2, false>(acc, j, h, sc, bi, make_uint2(0, 0), 0.0f, relu);
      const uint2 v = t.px[h] < p.W ? out : make_uint2(0, 0);  // the junk pixels become the right border's zeros
#pragma unroll
      for (int s = 0; s < 3; ++s) {
        const int m = t.px[h] + 1 - s;  // copy s, tile row m, holds pixel m + s - 1
        if (m >= 0 && m < BM) *reinterpret_cast<uint2*>(slot + s * Smem::A_COPY + tile_offset(m, j, t.q)) = v;
      }
    }
  }
  publish(rings.a.full(as));
}

// conv2: b[r] = requantize(sum over taps (dr, ds) of a[r + dr - 1] shifted by ds - 1, times W2's tap).
__device__ __forceinline__ void conv2_row(const BlockRowsParams& p, int8_t* smem, uint32_t base, const Rings& rings,
                                          const Lane& t, int r, int row0, PipelineState<B_STAGES> bs) {
  // row0: the ring use of the image's row 0 (a[k] is use row0 + k)
  uint32_t tap_row[3];
#pragma unroll
  for (int dr = 0; dr < 3; ++dr) {
    const int k = r + dr - 1;
    const PipelineState<A_STAGES> as{row0 + k};
    tap_row[dr] = base + Smem::ZERO;
    if (k >= 0 && k < p.H) {
      rings.a.wait_full(as);
      tap_row[dr] = base + Smem::A + as.index() * Smem::A_SLOT;
    }
  }
  int acc[WIDTH / 2];
  fresh_accumulators(acc);
  sm90::wgmma_fence();
#pragma unroll
  for (int c = 0; c < KT3; ++c)
#pragma unroll
    for (int tap = 0; tap < 9; ++tap) {
      const uint32_t a_tile = tap_row[tap / 3] + (tap_row[tap / 3] == base + Smem::ZERO ? 0 : (tap % 3) * Smem::A_COPY);
      sm90::WgmmaS8<WIDTH>::mma(acc, sm90::desc_kmajor_sw32(a_tile + c * TILE),
                                sm90::desc_kmajor_sw32(base + Smem::W2 + (9 * c + tap) * WIDTH * 32), c + tap > 0);
    }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  // a[r - 1]'s last reader is this row; the image's last row is also a[H - 1]'s
  if (r > 0) t.warp_arrive(rings.a.empty(PipelineState<A_STAGES>{row0 + r - 1}));
  if (r == p.H - 1) t.warp_arrive(rings.a.empty(PipelineState<A_STAGES>{row0 + r}));

  rings.b.wait_empty(bs);
  int8_t* const slot = smem + Smem::B + bs.index() * Smem::A_COPY;
  const float* folded = reinterpret_cast<const float*>(smem + Smem::FACTORS) + 2 * WIDTH;
  const float relu = relu_floor(p.relu2 != 0);
#pragma unroll
  for (int j = 0; j < KT3; ++j) {
    float4 sc[2], bi[2];
    block_factors(folded, WIDTH, j, t.q, sc, bi);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint2*>(slot + tile_offset(t.px[h], j, t.q)) =
          requantize_8_channels<kAccOnXu, WIDTH / 2, false>(acc, j, h, sc, bi, make_uint2(0, 0), 0.0f, relu);
  }
  publish(rings.b.full(bs));
}

// conv3, warpgroup g: y[r]'s channels [128 g, 128 g + 128) = requantize(b[r] W3 + residual x[r]), stored; then this
// warpgroup is done with x[r]'s slot.
__device__ __forceinline__ void conv3_row(const BlockRowsParams& p, int8_t* smem, uint32_t base, const Rings& rings,
                                          const Lane& t, int g, int n, int r, float rs, PipelineState<X_STAGES> xs,
                                          PipelineState<B_STAGES> bs) {
  const uint32_t b_slot = base + Smem::B + bs.index() * Smem::A_COPY;
  const int8_t* const residual = smem + Smem::X + xs.index() * Smem::X_SLOT;
  const float* folded = reinterpret_cast<const float*>(smem + Smem::FACTORS) + 4 * WIDTH;
  const float relu = relu_floor(p.relu3 != 0);
  const size_t plane = (size_t)p.H * p.W * 32;  // one channel block of one image
  rings.b.wait_full(bs);
  rings.x.wait_full(xs);  // (complete long since: conv1 waited for it; this orders the copy engine's bytes for us too)
#pragma unroll
  for (int pass = 0; pass < PASSES3; ++pass) {
    int acc[N3 / 2];
    fresh_accumulators(acc);
    sm90::wgmma_fence();
#pragma unroll
    for (int j = 0; j < KT3; ++j)
      sm90::WgmmaS8<N3>::mma(acc, sm90::desc_kmajor_sw32(b_slot + j * TILE),
                             sm90::desc_kmajor_sw32(base + Smem::W3 + j * C * 32 + (g * C3 + pass * N3) * 32), j > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    if (pass == PASSES3 - 1) t.warp_arrive(rings.b.empty(bs));
#pragma unroll
    for (int jb = 0; jb < N3 / 32; ++jb) {
      const int j = (g * C3 + pass * N3) / 32 + jb;  // y's channel block
      float4 sc[2], bi[2];
      block_factors(folded, C, j, t.q, sc, bi);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint2 res = *reinterpret_cast<const uint2*>(residual + tile_offset(t.px[h], j, t.q));
        const uint2 out = requantize_8_channels<kAccOnXu, N3 / 2, true>(acc, jb, h, sc, bi, res, rs, relu);
        if (t.px[h] < p.W)
          *reinterpret_cast<uint2*>(p.y + ((size_t)n * KT1 + j) * plane + ((size_t)r * p.W + t.px[h]) * 32 + 8 * t.q) = out;
      }
    }
  }
  t.warp_arrive(rings.x.empty(xs));
}

// The producer thread: the weights once, then x[r] of every row of the CTA's images, channel block j of the row into
// slot tile j (the view (32, W, H, 8, N), box (32, W, 1, 1, 1): W rows of 32 bytes, swizzled as they land).
__device__ __forceinline__ void produce(const sm90::TensorMap* tmap_x, const sm90::TensorMap* tmap_w1,
                                        const sm90::TensorMap* tmap_w2, const sm90::TensorMap* tmap_w3,
                                        const BlockRowsParams& p, uint32_t base, const Rings& rings) {
  if (threadIdx.x != GEMM_THREADS) return;
  sm90::prefetch_tensor_map(tmap_x);
  sm90::mbar_arrive_expect_tx(rings.weights_full, Smem::X - Smem::W1);
  for (int j = 0; j < KT1; ++j) sm90::tma_load_5d(base + Smem::W1 + j * WIDTH * 32, tmap_w1, rings.weights_full, 32 * j, 0, 0, 0, 0);
  for (int j = 0; j < KT2; ++j) sm90::tma_load_5d(base + Smem::W2 + j * WIDTH * 32, tmap_w2, rings.weights_full, 32 * j, 0, 0, 0, 0);
  for (int j = 0; j < KT3; ++j) sm90::tma_load_5d(base + Smem::W3 + j * C * 32, tmap_w3, rings.weights_full, 32 * j, 0, 0, 0, 0);
  PipelineState<X_STAGES> xs{0};
  for (int n = blockIdx.x; n < p.N; n += gridDim.x)
    for (int r = 0; r < p.H; ++r, ++xs) {
      rings.x.wait_empty(xs);
      const uint32_t full = rings.x.full(xs), slot = base + Smem::X + xs.index() * Smem::X_SLOT;
      sm90::mbar_arrive_expect_tx(full, KT1 * p.W * 32);
      for (int j = 0; j < KT1; ++j) sm90::tma_load_5d(slot + j * TILE, tmap_x, full, 0, 0, r, j, n);
    }
}

}  // namespace rows

// min(N, SMs) persistent CTAs (plugins/block_rows.py: grid), THREADS threads: the conv1, conv2 and conv3 warpgroups,
// then the producer's. The main loop: every GEMM warpgroup walks the same rows of the same images, each its own stage.
extern "C" __global__ void __launch_bounds__(rows::THREADS, 1)
    trtfuse_block_rows(const __grid_constant__ sm90::TensorMap tmap_x, const __grid_constant__ sm90::TensorMap tmap_w1,
                       const __grid_constant__ sm90::TensorMap tmap_w2, const __grid_constant__ sm90::TensorMap tmap_w3,
                       const BlockRowsParams p) {
  using namespace rows;
  extern __shared__ __align__(1024) int8_t smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  int8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t base = sm90::smem_addr(smem);
  const Rings rings(base);
  if (threadIdx.x == 0) {
    for (int s = 0; s < X_STAGES; ++s) sm90::mbar_init(rings.x.full0 + 8 * s, 1), sm90::mbar_init(rings.x.empty0 + 8 * s, CONV3_WARPS);
    for (int s = 0; s < A_STAGES; ++s) sm90::mbar_init(rings.a.full0 + 8 * s, 128), sm90::mbar_init(rings.a.empty0 + 8 * s, 4);
    for (int s = 0; s < B_STAGES; ++s) sm90::mbar_init(rings.b.full0 + 8 * s, 128), sm90::mbar_init(rings.b.empty0 + 8 * s, CONV3_WARPS);
    sm90::mbar_init(rings.weights_full, 1);
    sm90::fence_barrier_init();
  }
  // The a ring and the zero tile start zero: the shifted copies' rows that no pixel writes (copy 0's row 0, copy 2's
  // row 63) are the left and right padding for good.
  for (int i = threadIdx.x; i < (Smem::B - Smem::A) / 16; i += THREADS)
    reinterpret_cast<int4*>(smem + Smem::A)[i] = make_int4(0, 0, 0, 0);
  sm90::fence_proxy_async_shared();
  __syncthreads();

  // (warp-uniform as the compiler sees it, so that no wgmma is issued from what it takes for a divergent branch)
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (wg == 2 + CONV3_WGS) {
    produce(&tmap_x, &tmap_w1, &tmap_w2, &tmap_w3, p, base, rings);
    return;
  }
  float* const folded = reinterpret_cast<float*>(smem + Smem::FACTORS);
  fold(p.scale1, p.bias1, p.out_scale1, WIDTH, folded);
  fold(p.scale2, p.bias2, p.out_scale2, WIDTH, folded + 2 * WIDTH);
  fold(p.scale3, p.bias3, p.out_scale3, C, folded + 4 * WIDTH);
  const float out3 = *p.out_scale3, rs = fold_scale(*p.residual_scale, out3, __frcp_rn(out3));
  sm90::named_barrier(1, GEMM_THREADS);
  sm90::mbar_wait(rings.weights_full, 0);

  const Lane t;
  PipelineState<X_STAGES> xs{0};
  PipelineState<B_STAGES> bs{0};
  int row0 = 0;  // ring use of the image's row 0 (every ring takes one use per row)
  for (int n = blockIdx.x; n < p.N; n += gridDim.x, row0 += p.H)
    for (int r = 0; r < p.H; ++r, ++xs, ++bs) {
      if (wg == 0) conv1_row(p, smem, base, rings, t, xs, PipelineState<A_STAGES>{row0 + r});
      if (wg == 1) conv2_row(p, smem, base, rings, t, r, row0, bs);
      if (wg >= 2) conv3_row(p, smem, base, rings, t, wg - 2, n, r, rs, xs, bs);
    }
}

}  // namespace trtfuse
