// The network's stem walking pooled rows, the max-pool taken on the accumulators: the space-to-depth 7x7/2 conv (a
// stride-1 4x4 conv over the image folded into 16 channels, plugins/stem.py), the 3x3/2 max-pool, then one
// requantize (+ BN + ReLU, docs/ops.md) per pooled output, int8 CHW32 out. Hopper only (wgmma, sm_90a).
//
// Why: stem_pool.cu requantizes every conv pixel (4.4 per pooled output with its halo), stages them in shared memory
// and pools them there, its phases behind barriers. Here the conv's accumulators are pooled in registers and only the
// pooled value is requantized: requantize is monotonic in the accumulator where the channel's folded factor a >= 0, so
// max-pooling the accumulators and requantizing once is bit-identical to requantizing each conv pixel and pooling
// (a channel with a < 0 pools the minimum: its accumulators are bit-inverted, ~x = -1 - x, around the max).
//
// A CTA (one warpgroup) owns a tile of TPH pooled rows x 64 pooled columns of one image and walks its rows:
//   1. input patch  global -> shared: the folded pixels the tile's conv rows read, zero outside the image (the conv's
//                   padding), by cp.async, double buffered across tiles. Stored with even and odd columns in separate
//                   planes, so the stride-2 gathers below read consecutive 16-byte rows (no bank conflicts);
//   2. conv         shared -> tensor cores: a block is one conv row offset and one column offset dc of the pooled
//                   window for the tile's 64 pooled columns: A row s is conv pixel (row, 2 (pw0 + s) - 1 + dc),
//                   gathered by ldmatrix straight from the patch, times the 64 channels' weights (shared memory) by
//                   wgmma m64n64k32 over the 8 k-steps of 2 taps;
//   3. pool         registers: the three dc blocks of a conv row max into that row's maximum; pooled row i is the max
//                   of conv rows 2i - 1 (carried from the row before), 2i and 2i + 1: 6 blocks per pooled row;
//   4. epilogue     registers -> global: the pooled accumulators requantized (requantize_word, as every conv) and
//                   stored as 4-byte words of 4 channels.
// Pool windows that reach outside the conv output (the pool's padding) read a conv pixel of the same window instead
// (columns clamped to the image; the row above the image skipped), which leaves each maximum unchanged.
#include "stem_common.cuh"
#include "wgmma_s8.cuh"

#ifndef STEM_POOL_ROWS_TPH
#define STEM_POOL_ROWS_TPH 8
#endif

namespace trtfuse {
namespace stem_rows {
using namespace stem;

constexpr int TPH = STEM_POOL_ROWS_TPH;         // pooled rows per tile
constexpr int SLOTS = 64;                       // pooled columns per tile: the rows of one m64 block
constexpr int CONV_ROWS = 2 * TPH + 1;          // conv rows 2 ph0 - 1 .. 2 (ph0 + TPH) - 1
constexpr int IR = CONV_ROWS + R - 1;           // patch rows
constexpr int IC = 2 * (SLOTS - 1) + PK + S - 1;  // patch columns: 132
constexpr int HALF = (IC + 1) / 2;              // columns per parity plane
constexpr int ROW_BYTES = 2 * HALF * VEC;       // one patch row, both planes
constexpr int PATCH_BYTES = IR * ROW_BYTES;
constexpr int THREADS = 128;
constexpr int NEVER_MAX = -2147483647 - 1;      // below every accumulator
constexpr int SMEM_BYTES = WGMMA_WEIGHT_BYTES + 2 * PATCH_BYTES + FACTOR_BYTES;
#ifdef STEM_POOL_ROWS_SMEM
static_assert(STEM_POOL_ROWS_SMEM == SMEM_BYTES, "plugins/stem.py: pool_smem_bytes must give this kernel's shared memory");
#endif

// Byte offset of patch pixel (row, column): even columns in the row's first plane, odd ones in its second.
__device__ __forceinline__ int patch_offset(int row, int col) { return row * ROW_BYTES + ((col & 1) * HALF + (col >> 1)) * VEC; }

}  // namespace stem_rows

// p describes the folded conv (C = 16, R = S = 4, stride 1, K = 64, OH x OW its output); PH x PW the pooled output.
// image_index: nullptr, or image n of the batch is image image_index[n] of p.x (a device sample library).
extern "C" __global__ void __launch_bounds__(stem_rows::THREADS, 2) trtfuse_stem_pool_rows(const ConvParams p, int PH, int PW,
                                                                                        const long long* image_index) {
  using namespace stem_rows;
  extern __shared__ __align__(1024) int8_t smem[];
  trap_unless_dynamic_smem(SMEM_BYTES);  // the launcher's byte count (plugins/stem.py) must cover the tile
  int8_t* const weights = smem;  // 1024-byte aligned for the swizzle
  int8_t* const patches = smem + WGMMA_WEIGHT_BYTES;
  float* const factor_a = reinterpret_cast<float*>(patches + 2 * PATCH_BYTES);
  float* const factor_b = factor_a + CH;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  load_weights_wgmma(weights, p.w, tid, THREADS);
  fold_factors(factor_a, factor_b, p, tid, THREADS);
  const float relu_min = relu_floor(p.relu != 0);
  const int tiles_h = (PH + TPH - 1) / TPH, tiles_w = (PW + SLOTS - 1) / SLOTS;
  const int tiles = p.N * tiles_h * tiles_w;

  auto load_patch = [&](int tile, int buf) {
    const StemTile at = StemTile::at<TPH, SLOTS>(tile, tiles_h, tiles_w, p);
    const int8_t* const image = p.x + (size_t)(image_index ? image_index[at.n] : at.n) * p.H * p.W * VEC;
    load_input_patch<IR, IC, THREADS>(patches + buf * PATCH_BYTES, image, p, at.ir0, at.ic0, tid,
                                      [](int, int row, int col) { return patch_offset(row, col); });
  };
  if (blockIdx.x < tiles) load_patch(blockIdx.x, 0);
  __syncthreads();  // the factors

  // This lane's ldmatrix row: slot (pooled column) 16 warp + lane % 8 + 8 ((lane / 8) % 2), at the k-step's first tap
  // (lanes 0..15) or its second (16..31). Its accumulators: slots 16 warp + g (h = 0) and + 8 (h = 1).
  const int a_slot = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2), a_tap = lane / 16;
  // The sign of each accumulator's channel factor (register i: n8 tile i / 4, column 2q + i % 2): -1 inverts it so
  // that a maximum of inverted values is the inverted minimum.
  int flip[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int ni = i / 2, c = 2 * q + i % 2;
    flip[i] = factor_a[channel_of(ni, c)] < 0.0f ? -1 : 0;
  }
  auto flip_of = [&](int reg) { return flip[(reg / 4) * 2 + reg % 2]; };
  // One set of accumulators per column offset, defined once (each block's first wgmma ignores their values but names
  // them as inputs). A block's accumulators are read (into the row's maximum) after its wait and before the next
  // block's wgmma; ptxas (CUDA 13.0) sank those reads past the next block's wgmma when both blocks used the same
  // registers and the first k-step's accumulate flag was a constant, computing the row's maximum without the first
  // block (tests/test_stem_pool_gpu.py caught it). Separate registers per block and a flag ptxas cannot fold keep
  // every read where it is written.
  int acc[PK][32];
#pragma unroll
  for (int dc = 0; dc < PK; ++dc)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[dc][i] = 0;
  const bool never = p.splits < 0;  // false, unknown to ptxas

  for (int tile = blockIdx.x, buf = 0; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    const int ph0 = (t / tiles_w) * TPH, pw0 = (t % tiles_w) * SLOTS;
    const int cr0 = ph0 * PS - PP, cc0 = pw0 * PS - PP;  // the tile's first conv row and column
    const int8_t* const patch = patches + buf * PATCH_BYTES;
    cp_async_wait<0>();
    __syncthreads();  // this tile's patch has landed; the other buffer's last reader (the previous tile) is done
    if (tile + gridDim.x < tiles) load_patch(tile + gridDim.x, buf ^ 1);

    // best = the maximum over the three column offsets of the tile's conv row `row` (0 .. CONV_ROWS - 1), inverted
    // where the channel's factor is negative; with `fresh` false, the maximum of that and best. Columns outside the
    // conv output read the nearest one inside (same window).
    auto row_max = [&](int row, int (&best)[32], bool fresh) {
      if (fresh) {
#pragma unroll
        for (int i = 0; i < 32; ++i) best[i] = NEVER_MAX;
      }
#pragma unroll
      for (int dc = 0; dc < PK; ++dc) {
        const int col = min(max(cc0 + 2 * a_slot + dc, 0), p.OW - 1) - cc0;  // patch column of tap 0
        const uint32_t base = smem_u32(patch + patch_offset(row, col + a_tap));
        uint32_t a[KSTEPS][4];
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)  // taps 2 ks, 2 ks + 1: filter row ks / 2, columns 2 (ks % 2) (+ 1)
          ldmatrix_x4(a[ks], base + (ks / 2) * ROW_BYTES + (ks % 2) * VEC);
        sm90::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
          sm90::WgmmaS8<64>::mma_rs(acc[dc], a[ks], sm90::desc_kmajor_sw32(smem_u32(weights + ks * CH * 32)), ks > 0 || never);
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) best[i] = max(best[i], acc[dc][i] ^ flip_of(i));
      }
    };

    int carry[32];  // conv row 2 i - 1's maximum (tile row 2 i), then with row 2 i's (tile row 2 i + 1) in it
    if (cr0 >= 0) {
      row_max(0, carry, true);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) carry[i] = NEVER_MAX;  // the row above the image: never the maximum
    }
    for (int i = 0; i < TPH && ph0 + i < PH; ++i) {
      int lower[32];
      row_max(min(2 * i + 1, p.OH - 1 - cr0), carry, false);
      row_max(min(2 * i + 2, p.OH - 1 - cr0), lower, true);
      int pooled[32];
#pragma unroll
      for (int r = 0; r < 32; ++r) {
        pooled[r] = max(carry[r], lower[r]) ^ flip_of(r);
        carry[r] = lower[r];
      }
      // register r: slot 16 warp + g + 8 ((r / 2) % 2), n8 tile r / 4, column 2q + r % 2; tiles 2j, 2j + 1 give
      // channels 16 j + 4 q .. + 3 of the 64
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pw = pw0 + 16 * warp + g + 8 * h;
        if (pw >= PW) continue;
        int8_t* const out = p.y + (((size_t)n * (CH / 32)) * PH + ph0 + i) * PW * 32 + (size_t)pw * 32;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = 16 * j + 4 * q;
          const int word[4] = {pooled[8 * j + 2 * h], pooled[8 * j + 2 * h + 1], pooled[8 * j + 4 + 2 * h], pooled[8 * j + 5 + 2 * h]};
          float a[4], b[4];
          word_factors(factor_a, factor_b, c, a, b);
          *reinterpret_cast<uint32_t*>(out + (size_t)(c / 32) * PH * PW * 32 + c % 32) =
              requantize_word<false>(word, a, b, 0u, 0.0f, relu_min);
        }
      }
    }
  }
}

}  // namespace trtfuse
