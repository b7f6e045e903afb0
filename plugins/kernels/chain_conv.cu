// Two chained 1x1 convs in one kernel (sm_90a): a residual block's last conv and the next block's first,
//   y = FusedConvAdd(x; W1, residual)   K1 -> C1 channels, stored (the block after reads it as its residual)
//   z = FusedConv(y; W2)                 C1 -> C2 channels
// with y's pixel tile handed from the first GEMM's epilogue to the second GEMM through shared memory, so y is
// written to global memory once and never read back (plugins/chain_conv.py; docs/design/chain-conv.md).
//
// A tile is 64 consecutive pixels of the linear pixel index (the flat tiles of the wgmma conv: 8-pixel groups, so no
// computed row goes unstored but in the batch's last tile), all C1 and all C2 channels. Pixels are on wgmma's M, so
// each thread's accumulators are 8 consecutive channels of a pixel (the weight rows permuted by their tensor maps).
// A CTA is persistent and has three warpgroups:
//   producer (the last)  loads W1 once (resident), W2 once too unless it is streamed (below), then per tile the x
//                        tile and the residual tile by TMA into a ring slot;
//   consumers 0 and 1    take the CTA's tiles in turn; per tile:
//     GEMM1      per pass of N1 = min(C1, 256) channels (one wgmma's N; C1 / N1 passes, so no more than 128
//                accumulators are live): wgmma m64nN1k32 x K1/32, A = the x tile (ring slot), B = W1's rows of the pass
//     epilogue 1 docs/ops.md with the residual (ring slot) and ReLU: y's 8-byte CHW32 pieces to global memory, and
//                the same bytes into GEMM2's A tile, laid out as wgmma's K-major 32-byte-swizzled operand
//     GEMM2      wgmma m64nC2k32 x C1/32: A = that tile, B = W2
//     epilogue 2 docs/ops.md without a residual: z's 8-byte CHW32 pieces to global memory.
// One warpgroup's epilogues run while the other's GEMMs hold the tensor cores.
//
// With y_stride 2 (a runtime parameter) epilogue 1 stores only y's pixels at even rows and columns, compacted: where
// y's only readers are 1x1 stride-2 convs (the next stage's downsample, the pair's own conv 2 reading y on chip), a
// quarter of y's bytes reach HBM, and those convs read a stride-1 input.
//
// CHAIN_DS (a stage's first block, whose residual is its downsample: a 1x1 stride-1 conv of the block's input x0,
// CHAIN_DS channels -> C1, read by nothing else): the residual is computed here instead of read. The producer loads
// x0's tile into the slot where the residual tile would land, and per tile, before GEMM1,
//     GEMM0      wgmma m64nC1k32 x CHAIN_DS/32: A = the x0 tile (ring slot), B = Wds (resident)
//     epilogue 0 docs/ops.md without a residual (the downsample's own factors and ReLU flag): the residual's int8
//                bytes, kept in registers (a thread's are the bytes epilogue 1 reads for its own accumulators)
// so the downsample's C1-channel output is neither written nor read back (plugins/chain_conv.py: the downsample's
// variants; docs/design/chain-conv.md).
//
// Where the A tiles go (CHAIN_A_IN_SLOT) and whether W2 is resident (CHAIN_W2_STAGES) are what lets C1 = 512 fit in
// 227 KB (docs/design/chain-conv.md has the budgets):
//   A_IN_SLOT 0   each consumer warpgroup has an A tile of its own; the residual lands unswizzled and the ring slot is
//                 free once epilogue 1 has read it (K1 = 64, C1 = 256: res2);
//   A_IN_SLOT 1   the residual lands with the 32-byte swizzle, already wgmma's operand layout, and epilogue 1 writes
//                 each y piece over the residual piece it has just read (the same thread, the same 8 bytes), so the
//                 slot's residual tile becomes GEMM2's A tile; the slot is free once GEMM2 is done (C1 = 512: res3);
//   W2_STAGES 0   W2 is resident;
//   W2_STAGES S   W2 (C2 x C1, 128 KB for C2 = 256) does not fit beside W1 and two slots: it is streamed per tile,
//                 one k32 step (C2 x 32 bytes) at a time, from L2 (every CTA reads the same weights), through a ring
//                 of S / 2 such chunks per consumer warpgroup, each filled by a producer thread of its own. (One ring
//                 shared by both would let the warpgroup on the CTA's next tile wait a whole ring phase ahead of the
//                 copies, where an mbarrier's parity cannot tell its chunk from the one a lap before.)
#include "conv_params.cuh"
#include "wgmma_pipeline.cuh"
#include "wgmma_pixel_requantize.cuh"
#include "wgmma_s8.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "chain_conv.cu needs the sm_90a target (wgmma, setmaxnreg)"
#endif

#ifndef CHAIN_K1
#define CHAIN_K1 64
#endif
#ifndef CHAIN_C1
#define CHAIN_C1 256
#endif
#ifndef CHAIN_C2
#define CHAIN_C2 64
#endif
#ifndef CHAIN_STAGES
#define CHAIN_STAGES 4
#endif
#ifndef CHAIN_W2_STAGES
#define CHAIN_W2_STAGES 0
#endif
#ifndef CHAIN_A_IN_SLOT
#define CHAIN_A_IN_SLOT 0
#endif
#ifndef CHAIN_DS
#define CHAIN_DS 0
#endif

namespace trtfuse {
namespace chain {

constexpr int K1 = CHAIN_K1, C1 = CHAIN_C1, C2 = CHAIN_C2, STAGES = CHAIN_STAGES, W2_STAGES = CHAIN_W2_STAGES;
constexpr bool A_IN_SLOT = CHAIN_A_IN_SLOT != 0;
constexpr int K_DS = CHAIN_DS;              // the downsample's input channels (0: the residual is read)
constexpr bool DS = K_DS > 0;
constexpr int BM = 64;                      // pixels per tile: one warpgroup's m64
constexpr int GROUPS = BM / 8;              // 8-pixel groups per tile
constexpr int CONSUMERS = 2;                // consumer warpgroups
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int KT1 = K1 / 32, KT2 = C1 / 32;  // k32 steps of the two GEMMs (1x1: a step is a 32-channel block)
constexpr int KT_DS = K_DS / 32;            // and of the downsample's
constexpr int W2_RING = W2_STAGES > 0 ? W2_STAGES / CONSUMERS : 1;  // chunks per consumer's W2 ring (1: not used)
constexpr int N1 = C1 < 256 ? C1 : 256;     // GEMM1's channels per pass (one wgmma's N)
constexpr int PASSES1 = C1 / N1;
// setmaxnreg: the 168 registers a thread gets at launch (65536 / 384, in units of 8) moved to the consumers
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(kProducerRegs + CONSUMERS * kConsumerRegs <= (CONSUMERS + 1) * (65536 / THREADS / 8 * 8), "register pool");
static_assert(K1 % 32 == 0 && C1 % 32 == 0 && C2 % 32 == 0, "whole 32-channel blocks");
static_assert(C1 % N1 == 0 && C2 <= 256, "GEMM1 in whole passes of one wgmma's N, GEMM2 in one");
// A chunk is released once the wgmma after it is issued and it is done (wgmma_wait<1>): the next chunk's load must not
// wait for the one being read
static_assert(W2_STAGES == 0 || (W2_STAGES % CONSUMERS == 0 && W2_RING >= 2),
              "a streamed W2 needs two chunks at least in each consumer's ring");
// The first accumulator of each word converts on the XU pipe (s32_to_float_small, as the resident-weight wgmma tiles
// do): exact while |acc| <= 2^24, which GEMM-K <= 1024 guarantees (|x * w| <= 2^14).
constexpr int kAccOnXu = 1;
static_assert(K1 <= 1024 && C1 <= 1024, "|acc| <= 2^24 for s32_to_float_small");
// The residual's bytes of a tile stay in registers between epilogue 0 and epilogue 1: one pass of GEMM1, and the
// residual is never a ring slot's A tile
static_assert(!DS || (K_DS % 32 == 0 && K_DS <= 1024 && PASSES1 == 1 && !A_IN_SLOT), "a downsample computed in place");

// Shared memory, from a 1024-byte-aligned base (the launcher asks for BYTES + 1024). Operand tiles are K-major with
// 32-byte rows per k32 step, 32-byte swizzle (wgmma's layout type 3: 8-row groups 256 bytes apart, or in the x tile,
// as its TMA box lands them, K1 * 8 bytes apart).
struct Smem {
  static constexpr int W1 = 0;                          // KT1 x [C1 rows][32], rows permuted (plugins/chain_conv.py)
  static constexpr int W2_CHUNK = C2 * 32;              // one k32 step of W2: [C2 rows][32], likewise
  static constexpr int W2 = W1 + KT1 * C1 * 32;         // KT2 chunks (resident) or W2_STAGES (the streamed rings)
  static constexpr int A_TILE = A_IN_SLOT ? 0 : BM * C1;  // a consumer's y tile: KT2 x [64 pixels][32]
  static constexpr int WDS = W2 + (W2_STAGES ? W2_STAGES : KT2) * W2_CHUNK;  // DS: KT_DS x [C1 rows][32], as W1
  static constexpr int A = WDS + KT_DS * C1 * 32;
  static constexpr int X_BYTES = BM * K1;               // x tile [group][K1 / 32][8][32], 32-byte swizzle
  // residual tile [group][C1 / 32][8][32], swizzled if A_IN_SLOT; DS: x0's tile [group][K_DS / 32][8][32], swizzled
  static constexpr int RES_BYTES = DS ? BM * K_DS : BM * C1;
  static constexpr int SLOT = X_BYTES + RES_BYTES;
  static constexpr int RING = A + CONSUMERS * A_TILE;
  static constexpr int FACTORS = RING + STAGES * SLOT;  // folded scale1, bias1 [C1], scale2, bias2 [C2] (DS: + [C1] x 2)
  static constexpr int BARS = FACTORS + 2 * (C1 + C2 + (DS ? C1 : 0)) * 4;  // full[STAGES], empty[STAGES], weights'
  static constexpr int W2_BARS = BARS + (2 * STAGES + 1) * 8;  // per consumer: its W2 ring's full[W2_RING], empty[W2_RING]
  static constexpr int BYTES = W2_BARS + 2 * W2_STAGES * 8;
  static_assert(W2 % 1024 == 0 && W2_CHUNK % 1024 == 0 && WDS % 1024 == 0 && A % 1024 == 0 && RING % 1024 == 0 &&
                SLOT % 1024 == 0 && X_BYTES % 1024 == 0, "swizzled tiles and TMA boxes start 1024-byte aligned");
};
#ifdef CHAIN_SMEM
static_assert(CHAIN_SMEM == Smem::BYTES + 1024, "plugins/chain_conv.py: Variant.smem_bytes must give this kernel's shared memory");
#endif

}  // namespace chain

// Mirrored by plugins/chain_conv.py: ChainParamsStruct (same field order). x, the residual and both weights reach the
// kernel through their tensor maps only.
struct ChainParams {
  const float* scale1;          // [C1] conv 1 (FusedConvAdd): x_scale * w1_scale
  const float* bias1;           // [C1]
  const float* out_scale1;      // [1] y's scale
  const float* residual_scale;  // [1]
  int8_t* y;                    // [N][C1/32][H][W][32]
  const float* scale2;          // [C2] conv 2 (FusedConv): y_scale * w2_scale
  const float* bias2;           // [C2]
  const float* out_scale2;      // [1] z's scale
  int8_t* z;                    // [N][C2/32][H][W][32]
  int N, hw, tiles, groups_per_image, box_groups, relu1, relu2;
  FastDivmod div_hw, div_groups;  // by H * W and by groups_per_image
  const float* scale_ds;        // [C1] CHAIN_DS: the downsample (FusedConv) computing the residual: x0_scale * wds_scale
  const float* bias_ds;         // [C1]
  const float* out_scale_ds;    // [1] its output's scale (residual_scale, as conv 1 reads it)
  int relu_ds;
  // 1: y stored whole; 2: only y's pixels at even rows and columns, at (row / 2, column / 2) of a map y_w wide and
  // y_hw pixels an image (where y's only readers are 1x1 stride-2 convs: the next stage's downsample)
  int y_stride, w, y_w, y_hw;
  FastDivmod div_w;  // by w
};

namespace chain {

// Where y's bytes 8q .. 8q + 7 of channel block b, tile pixel px, go in the A tile: k32 step b's [64][32] operand, the
// 16-byte half XOR-ed with bit 2 of the row (the 32-byte swizzle that desc_kmajor_sw32 describes, as a TMA box with
// CU_TENSOR_MAP_SWIZZLE_32B would have written it).
__device__ __forceinline__ int a_tile_offset(int px, int b, int q) {
  return b * BM * 32 + px * 32 + (((q >> 1) ^ ((px >> 2) & 1)) << 4) + ((q & 1) << 3);
}

// Where bytes 8q .. 8q + 7 of channel block b of a ring slot's residual tile row r (0 .. 7) of group g lie, relative
// to the tile: [group][C1 / 32][8][32], the 16-byte half XOR-ed with bit 2 of the row where the residual lands with
// the 32-byte swizzle (A_IN_SLOT), as the box rows of the x tile do.
__device__ __forceinline__ int residual_offset(int g, int b, int r, int q) {
  const int piece = A_IN_SLOT ? (((q >> 1) ^ ((r >> 2) & 1)) << 4) + ((q & 1) << 3) : 8 * q;
  return g * C1 * 8 + b * 256 + r * 32 + piece;
}

// A tile's first wgmma overwrites its accumulators (scale-d false): they need no value before it. An empty asm gives
// them one without an instruction, so neither GEMM's accumulators are carried across tiles (or GEMM1's passes), and
// GEMM1's (N1 / 2 registers) and GEMM2's (C2 / 2) are never live at once.
template <int N>
__device__ __forceinline__ void fresh_accumulators(int (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "=r"(acc[i]));
}

// Byte offset of channel block 0, bytes 8q.., of linear pixel m in a CHW32 tensor of `blocks` channel blocks.
__device__ __forceinline__ size_t chw32_piece(const ChainParams& p, int m, int blocks, int q) {
  const int n = p.div_hw.div(m), pix = m - n * p.hw;
  return ((size_t)n * blocks * p.hw + pix) * 32 + 8 * q;
}

// Byte offset in y of channel block 0, bytes 8q.., of linear pixel m, and whether y keeps that pixel (y_stride).
__device__ __forceinline__ size_t y_piece(const ChainParams& p, int m, int q, bool& kept) {
  const int n = p.div_hw.div(m), pix = m - n * p.hw;
  int at = pix;
  kept = true;
  if (p.y_stride == 2) {
    const int row = p.div_w.div(pix), col = pix - row * p.w;
    kept = ((row | col) & 1) == 0;
    at = (row >> 1) * p.y_w + (col >> 1);
  }
  return ((size_t)n * (C1 / 32) * p.y_hw + at) * 32 + 8 * q;
}

// Consumer warpgroup wg's W2 ring: its chunks and its full and empty mbarriers.
__device__ __forceinline__ uint32_t w2_chunks(uint32_t base, int wg) { return base + Smem::W2 + wg * W2_RING * Smem::W2_CHUNK; }
__device__ __forceinline__ MbarrierRing<W2_RING> w2_ring(uint32_t base, int wg) {
  const uint32_t bars = base + Smem::W2_BARS + wg * 2 * W2_RING * 8;
  return {bars, bars + W2_RING * 8};
}

// The streamed W2 of consumer warpgroup wg: per tile it takes (the CTA's tiles wg, wg + 2, ..), its KT2 k32 chunks
// into its ring; its t-th tile reads ring uses t * KT2 .. t * KT2 + KT2 - 1.
__device__ __forceinline__ void stream_w2(const sm90::TensorMap* tmap_w2, const ChainParams& p, uint32_t base, int wg) {
  sm90::prefetch_tensor_map(tmap_w2);
  const MbarrierRing<W2_RING> ring = w2_ring(base, wg);
  const uint32_t chunks = w2_chunks(base, wg);
  PipelineState<W2_RING> it{0};
  for (int tile = blockIdx.x + wg * gridDim.x; tile < p.tiles; tile += CONSUMERS * gridDim.x) {
    for (int j = 0; j < KT2; ++j, ++it) {
      ring.wait_empty(it);
      sm90::mbar_arrive_expect_tx(ring.full(it), Smem::W2_CHUNK);
      sm90::tma_load_5d(chunks + it.index() * Smem::W2_CHUNK, tmap_w2, ring.full(it), 32 * j, 0, 0, 0, 0);
    }
  }
}

// The producer thread: the resident weights once, then per tile its x and residual boxes into the next ring slot. The
// tensors are viewed as (32, 8, blocks, G, N), G = H * W / 8 groups of 8 pixels per image (plugins/chain_conv.py), a
// box being box_groups groups x every block, landing [group][block][8][32]. box_groups divides G, so no box crosses an
// image; boxes past the batch (its last tile) load the batch's last box again: their rows are never stored.
__device__ __forceinline__ void produce(const sm90::TensorMap* tmap_x, const sm90::TensorMap* tmap_res,
                                        const sm90::TensorMap* tmap_w1, const sm90::TensorMap* tmap_w2,
                                        const sm90::TensorMap* tmap_wds, const ChainParams& p, uint32_t base) {
  sm90::regs_dealloc<kProducerRegs>();
  if constexpr (W2_STAGES > 0) {
    // warps 1 and 2 of the producer warpgroup, one per consumer's ring, so no ring holds up another or the tiles' loads
    const int w2_warp = threadIdx.x / 32 - 4 * CONSUMERS - 1;
    if (threadIdx.x % 32 == 0 && w2_warp >= 0 && w2_warp < CONSUMERS) {
      stream_w2(tmap_w2, p, base, w2_warp);
      return;
    }
  }
  if (threadIdx.x != 128 * CONSUMERS) return;
  sm90::prefetch_tensor_map(tmap_x);
  sm90::prefetch_tensor_map(tmap_res);
  const MbarrierRing<STAGES> ring{base + Smem::BARS, base + Smem::BARS + STAGES * 8};
  const uint32_t weights_full = ring.empty0 + STAGES * 8;
  sm90::mbar_arrive_expect_tx(weights_full, (KT1 + KT_DS) * C1 * 32 + (W2_STAGES ? 0 : KT2 * Smem::W2_CHUNK));
  for (int j = 0; j < KT1; ++j) sm90::tma_load_5d(base + Smem::W1 + j * C1 * 32, tmap_w1, weights_full, 32 * j, 0, 0, 0, 0);
  for (int j = 0; j < KT_DS; ++j) sm90::tma_load_5d(base + Smem::WDS + j * C1 * 32, tmap_wds, weights_full, 32 * j, 0, 0, 0, 0);
  if constexpr (W2_STAGES == 0)
    for (int j = 0; j < KT2; ++j) sm90::tma_load_5d(base + Smem::W2 + j * C2 * 32, tmap_w2, weights_full, 32 * j, 0, 0, 0, 0);
  const int last_box = p.N * p.groups_per_image - p.box_groups;
  PipelineState<STAGES> it{0};
  for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x, ++it) {
    ring.wait_empty(it);
    const uint32_t full = ring.full(it), slot = base + Smem::RING + it.index() * Smem::SLOT;
    sm90::mbar_arrive_expect_tx(full, Smem::SLOT);
    for (int g = 0; g < GROUPS; g += p.box_groups) {
      const int q = min(tile * GROUPS + g, last_box), n = p.div_groups.div(q), group = q - n * p.groups_per_image;
      sm90::tma_load_5d(slot + g * K1 * 8, tmap_x, full, 0, 0, 0, group, n);
      sm90::tma_load_5d(slot + Smem::X_BYTES + g * (Smem::RES_BYTES / GROUPS), tmap_res, full, 0, 0, 0, group, n);
    }
  }
}

// docs/ops.md's per-channel factors of both convs, folded by out_scale once per CTA (every tile has all channels).
__device__ __forceinline__ void fold_factors(const ChainParams& p, float* s_factors, int tid) {
  const float out1 = *p.out_scale1, inv1 = __frcp_rn(out1), out2 = *p.out_scale2, inv2 = __frcp_rn(out2);
  for (int c = tid; c < C1; c += 128 * CONSUMERS) {
    s_factors[c] = fold_scale(p.scale1[c], out1, inv1);
    s_factors[C1 + c] = fold_scale(p.bias1[c], out1, inv1);
  }
  for (int c = tid; c < C2; c += 128 * CONSUMERS) {
    s_factors[2 * C1 + c] = fold_scale(p.scale2[c], out2, inv2);
    s_factors[2 * C1 + C2 + c] = fold_scale(p.bias2[c], out2, inv2);
  }
  if constexpr (DS) {
    const float out0 = *p.out_scale_ds, inv0 = __frcp_rn(out0);
    for (int c = tid; c < C1; c += 128 * CONSUMERS) {
      s_factors[2 * (C1 + C2) + c] = fold_scale(p.scale_ds[c], out0, inv0);
      s_factors[2 * (C1 + C2) + C1 + c] = fold_scale(p.bias_ds[c], out0, inv0);
    }
  }
}

// The factors of block b's 8 channels that lane class q owns (channels 32b + 8q ..).
__device__ __forceinline__ void block_factors(const float* scale, const float* bias, int b, int q, float4 (&sc)[2], float4 (&bi)[2]) {
  const float4* f = reinterpret_cast<const float4*>(scale + 32 * b + 8 * q);
  const float4* g = reinterpret_cast<const float4*>(bias + 32 * b + 8 * q);
  sc[0] = f[0], sc[1] = f[1], bi[0] = g[0], bi[1] = g[1];
}

// A consumer warpgroup. Thread (warp, lane) holds tile pixels 16 warp + lane / 4 + 8h (h = 0, 1) and, per channel
// block b, channels 32b + 8 (lane % 4) .. + 7 of each.
__device__ __forceinline__ void consume(const ChainParams& p, int8_t* smem, uint32_t base) {
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, q = lane % 4;
  const MbarrierRing<STAGES> ring{base + Smem::BARS, base + Smem::BARS + STAGES * 8};
  float* const s_factors = reinterpret_cast<float*>(smem + Smem::FACTORS);
  const float *scale1 = s_factors, *bias1 = scale1 + C1, *scale2 = bias1 + C1, *bias2 = scale2 + C2;
  const float *scale_ds = bias2 + C2, *bias_ds = scale_ds + C1;  // DS only
  const float out1 = *p.out_scale1;
  const float rs = fold_scale(*p.residual_scale, out1, __frcp_rn(out1));
  const float relu1 = relu_floor(p.relu1 != 0), relu2 = relu_floor(p.relu2 != 0), relu_ds = relu_floor(p.relu_ds != 0);
  fold_factors(p, s_factors, tid);
  sm90::named_barrier(1, 128 * CONSUMERS);
  sm90::mbar_wait(ring.empty0 + STAGES * 8, 0);  // the resident weights have landed

  int8_t* const a_tile = smem + Smem::A + wg * Smem::A_TILE;
  const uint32_t a_addr = base + Smem::A + wg * Smem::A_TILE;
  const int px[2] = {16 * warp + lane / 4, 16 * warp + lane / 4 + 8};
  const int pixels = p.N * p.hw;
  // (warp-uniform as the compiler sees it: a trip count that might differ inside a warp would serialize the wgmmas)
  const int first = __shfl_sync(0xffffffffu, wg, 0);
  for (int i = first, tile = blockIdx.x + first * gridDim.x; tile < p.tiles; i += CONSUMERS, tile += CONSUMERS * gridDim.x) {
    const PipelineState<STAGES> it{i};  // the CTA's i-th tile fills ring use i (the producer walks them in order)
    const uint32_t slot = base + Smem::RING + it.index() * Smem::SLOT;
    int8_t* const residual = smem + Smem::RING + it.index() * Smem::SLOT + Smem::X_BYTES;
    bool ok[2], y_kept[2];
    size_t y_off[2], z_off[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = tile * BM + px[h];
      ok[h] = m < pixels;
      y_kept[h] = false;
      y_off[h] = ok[h] ? y_piece(p, m, q, y_kept[h]) : 0;
      z_off[h] = ok[h] ? chw32_piece(p, m, C2 / 32, q) : 0;
    }

    // DS: GEMM0 and epilogue 0, the tile's residual bytes into registers (a thread's: pixels px[h], channels
    // 32b + 8q .. + 7, as epilogue 1 reads them)
    uint2 residual_words[DS ? N1 / 32 : 1][2];
    if constexpr (DS) {
      int acc0[N1 / 2];  // N1 = C1 (one pass)
      fresh_accumulators(acc0);
      ring.wait_full(it);
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < KT_DS; ++j)
        sm90::WgmmaS8<N1>::mma(acc0, sm90::desc_kmajor(slot + Smem::X_BYTES + j * 256, K_DS * 8, 3),
                               sm90::desc_kmajor_sw32(base + Smem::WDS + j * C1 * 32), j > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < N1 / 32; ++b) {
        float4 sc[2], bi[2];
        block_factors(scale_ds, bias_ds, b, q, sc, bi);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          residual_words[b][h] = requantize_8_channels<kAccOnXu, N1 / 2, false>(acc0, b, h, sc, bi, make_uint2(0, 0), 0.0f, relu_ds);
      }
    }

#pragma unroll
    for (int pass = 0; pass < PASSES1; ++pass) {
      // GEMM1: y's accumulators, pixels x the pass's N1 channels
      int acc1[N1 / 2];
      fresh_accumulators(acc1);
      if (pass == 0 && !DS) ring.wait_full(it);
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < KT1; ++j)
        sm90::WgmmaS8<N1>::mma(acc1, sm90::desc_kmajor(slot + j * 256, K1 * 8, 3),
                               sm90::desc_kmajor_sw32(base + Smem::W1 + j * C1 * 32 + pass * N1 * 32), j > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      // Every warp of the warpgroup is past its previous tile's GEMM2, which read the A tile rewritten below.
      if (!A_IN_SLOT && pass == 0) sm90::named_barrier(2 + wg, 128);

      // Epilogue 1: y = requantize(acc1 + residual), to global memory and into the A tile.
#pragma unroll
      for (int b = 0; b < N1 / 32; ++b) {
        const int cb = pass * (N1 / 32) + b;  // y's channel block
        float4 sc[2], bi[2];
        block_factors(scale1, bias1, cb, q, sc, bi);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // residual pixel px[h] = group 2 warp + h, row lane / 4 of it
          const int r_off = residual_offset(2 * warp + h, cb, lane / 4, q);
          const uint2 res = DS ? residual_words[DS ? cb : 0][h] : *reinterpret_cast<const uint2*>(residual + r_off);
          const uint2 out = requantize_8_channels<kAccOnXu, N1 / 2, true>(acc1, b, h, sc, bi, res, rs, relu1);
          if (y_kept[h]) *reinterpret_cast<uint2*>(p.y + y_off[h] + (size_t)cb * p.y_hw * 32) = out;
          // A_IN_SLOT: over the residual bytes just read, by the one thread that reads and writes them
          *reinterpret_cast<uint2*>(A_IN_SLOT ? residual + r_off : a_tile + a_tile_offset(px[h], cb, q)) = out;
        }
      }
    }
    if (!A_IN_SLOT) {
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(ring.empty(it));  // this warp's reads of the slot are done
    }
    // The A tile, written through the generic proxy, is read next by wgmma (the async proxy), every warp's rows.
    sm90::fence_proxy_async_shared();
    sm90::named_barrier(2 + wg, 128);

    // GEMM2: z's accumulators, pixels x C2, over y's C1 channels. The A tile in the slot has the x tile's layout
    // (8-row groups C1 * 8 bytes apart); the warpgroup's own has 8-row groups 256 bytes apart.
    int acc2[C2 / 2];
    fresh_accumulators(acc2);
    sm90::wgmma_fence();
    if constexpr (W2_STAGES == 0) {
#pragma unroll
      for (int j = 0; j < KT2; ++j)
        sm90::WgmmaS8<C2>::mma(acc2, A_IN_SLOT ? sm90::desc_kmajor(slot + Smem::X_BYTES + j * 256, C1 * 8, 3)
                                               : sm90::desc_kmajor_sw32(a_addr + j * BM * 32),
                               sm90::desc_kmajor_sw32(base + Smem::W2 + j * C2 * 32), j > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    } else {
      const MbarrierRing<W2_RING> w2 = w2_ring(base, wg);
      const uint32_t chunks = w2_chunks(base, wg);
      const int t = i / CONSUMERS;  // this warpgroup's t-th tile of the CTA
#pragma unroll
      for (int j = 0; j < KT2; ++j) {
        const PipelineState<W2_RING> chunk{t * KT2 + j};
        w2.wait_full(chunk);
        sm90::WgmmaS8<C2>::mma(acc2, A_IN_SLOT ? sm90::desc_kmajor(slot + Smem::X_BYTES + j * 256, C1 * 8, 3)
                                               : sm90::desc_kmajor_sw32(a_addr + j * BM * 32),
                               sm90::desc_kmajor_sw32(chunks + chunk.index() * Smem::W2_CHUNK), j > 0);
        sm90::wgmma_commit();
        if (j > 0) {  // the previous chunk's wgmma is done: its chunk may be loaded over
          sm90::wgmma_wait<1>();
          if (lane == 0) sm90::mbar_arrive(w2.empty(chunk.previous()));
        }
      }
      sm90::wgmma_wait<0>();
      if (lane == 0) sm90::mbar_arrive(w2.empty(PipelineState<W2_RING>{t * KT2 + KT2 - 1}));
    }
    if (A_IN_SLOT && lane == 0) sm90::mbar_arrive(ring.empty(it));  // this warp's wgmmas are done with the slot

    // Epilogue 2: z = requantize(acc2), no residual.
#pragma unroll
    for (int b = 0; b < C2 / 32; ++b) {
      float4 sc[2], bi[2];
      block_factors(scale2, bias2, b, q, sc, bi);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint2 out = requantize_8_channels<kAccOnXu, C2 / 2, false>(acc2, b, h, sc, bi, make_uint2(0, 0), 0.0f, relu2);
        if (ok[h]) *reinterpret_cast<uint2*>(p.z + z_off[h] + (size_t)b * p.hw * 32) = out;
      }
    }
  }
}

}  // namespace chain

// min(ceil(tiles / 2), SMs) persistent CTAs (plugins/chain_conv.py: grid), 384 threads: consumer warpgroups 0 and 1,
// then the producer warpgroup.
extern "C" __global__ void __launch_bounds__(chain::THREADS, 1)
    trtfuse_chain_conv(const __grid_constant__ sm90::TensorMap tmap_x, const __grid_constant__ sm90::TensorMap tmap_res,
                       const __grid_constant__ sm90::TensorMap tmap_w1, const __grid_constant__ sm90::TensorMap tmap_w2,
#if CHAIN_DS
                       const __grid_constant__ sm90::TensorMap tmap_wds,
#endif
                       const ChainParams p) {
  using namespace chain;
  extern __shared__ __align__(1024) int8_t smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  int8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t base = sm90::smem_addr(smem);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(base + Smem::BARS + 8 * s, 1);                 // full: the producer's arrive + the bytes
      sm90::mbar_init(base + Smem::BARS + 8 * (STAGES + s), 4);      // empty: the 4 warps of the consuming warpgroup
    }
    sm90::mbar_init(base + Smem::BARS + 16 * STAGES, 1);             // the resident weights
    for (int wg = 0; wg < (W2_STAGES ? CONSUMERS : 0); ++wg)
      for (int s = 0; s < W2_RING; ++s) {
        const MbarrierRing<W2_RING> w2 = w2_ring(base, wg);
        sm90::mbar_init(w2.full0 + 8 * s, 1);   // full: its W2 thread's arrive + the bytes
        sm90::mbar_init(w2.empty0 + 8 * s, 4);  // empty: the 4 warps of that consumer warpgroup
      }
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x / 128 == CONSUMERS)
#if CHAIN_DS
    produce(&tmap_x, &tmap_res, &tmap_w1, &tmap_w2, &tmap_wds, p, base);
#else
    produce(&tmap_x, &tmap_res, &tmap_w1, &tmap_w2, &tmap_w1, p, base);  // (no downsample weights to load)
#endif
  else
    consume(p, smem, base);
}

}  // namespace trtfuse
