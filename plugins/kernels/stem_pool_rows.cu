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
// The GEMM is turned around against the other convs: the 64 output channels are wgmma's M, their weights A in
// registers for the whole kernel (loaded once), and 64 conv columns are N, read by descriptor straight from the input
// patch. Shared memory carries only the patch: no ldmatrix, no weight traffic.
//
// A CTA (one warpgroup) owns a tile of TPH pooled rows x 63 pooled columns of one image and walks its rows:
//   1. input patch  global -> shared: the folded pixels the tile's conv rows read, zero outside the image (the conv's
//                   padding), by cp.async, double buffered across tiles. Stored with even and odd columns in separate
//                   planes, so 64 conv columns two apart start 16 bytes apart in one plane, and a k32 step (two taps,
//                   one in each plane) is one descriptor;
//   2. conv         shared -> tensor cores: per conv row two blocks of 8 wgmma m64n64k32 over the 16 taps: E, the conv
//                   pixels at the pooled windows' left columns (column s: 2 (pw0 + s) - 1), and O, their middle
//                   columns (+ 1). A window's right column is the next window's left one, E of column s + 1. O pairs
//                   its taps the other way round (1,0 and 3,2: the even-plane tap first, so the descriptor's K stride
//                   is positive), which is A's two halves swapped;
//   3. pool         registers: a conv row's window maximum is max(E[s], O[s], E[s + 1]), E[s + 1] from the thread's
//                   own next column or, one in two, by a shuffle from the lane to its right; pooled row i is the max
//                   of conv rows 2i - 1 (carried from the row before), 2i and 2i + 1;
//   4. epilogue     registers -> global: the pooled accumulators requantized (requantize_word, as every conv), the
//                   two channels a thread holds per column paired with its neighbour's by one shuffle into 4-byte
//                   words of 4 channels.
// Pool windows that reach outside the conv output (the pool's padding) never win: a conv pixel left or right of the
// image is replaced by the lowest value, rows below the image by the last row, the row above the image is skipped.
//
// STEM_POOL_ROWS_CONV1: the pooled row also feeds the next 1x1 conv (64 -> 64, ResNet's res2 first conv1), so that
// conv never reads the pooled tensor back:
//   5. next conv   the pooled row's words, as they are stored, also go to shared memory as wgmma's B (64 columns x 64
//                  channels, K-major, no swizzle: core matrices of 8 columns x 16 channels), two buffers taken in turn
//                  so one barrier a row orders them; that conv's weights are A in registers (rows permuted as the
//                  stem's, so its accumulators pair into words the same way); two wgmma m64n64k32, then its requantize
//                  and the same store into its own output.
#include "stem_common.cuh"
#include "wgmma_s8.cuh"

#ifndef STEM_POOL_ROWS_TPH
#define STEM_POOL_ROWS_TPH 8
#endif

namespace trtfuse {
namespace stem_rows {
using namespace stem;

constexpr int TPH = STEM_POOL_ROWS_TPH;         // pooled rows per tile
constexpr int SLOTS = 64;                       // conv columns per block: wgmma's N
constexpr int OUT_COLS = SLOTS - 1;             // pooled columns per tile: the last one's right column is E[SLOTS]
constexpr int CONV_ROWS = 2 * TPH + 1;          // conv rows 2 ph0 - 1 .. 2 (ph0 + TPH) - 1
constexpr int IR = CONV_ROWS + R - 1;           // patch rows
constexpr int IC = 2 * (SLOTS - 1) + 2 + S - 1;  // patch columns: 131, the last O column's 4 taps
constexpr int HALF = (IC + 1) / 2;              // columns per parity plane
constexpr int ROW_BYTES = 2 * HALF * VEC;       // one patch row, both planes
constexpr int PATCH_BYTES = IR * ROW_BYTES;
constexpr int THREADS = 128;
constexpr int NEVER_MAX = -2147483647 - 1;      // below every accumulator
#ifdef STEM_POOL_ROWS_CONV1
constexpr bool CONV1 = true;
#else
constexpr bool CONV1 = false;
#endif
constexpr int B_BYTES = SLOTS * CH;             // the next conv's B: a pooled row's 64 columns x 64 channels
constexpr int KG1 = CH;                         // the next conv's packed weight row (1x1, 64 input channels)
constexpr int SMEM_BYTES = 2 * PATCH_BYTES + FACTOR_BYTES + (CONV1 ? 2 * B_BYTES + FACTOR_BYTES : 0);
#ifdef STEM_POOL_ROWS_SMEM
static_assert(STEM_POOL_ROWS_SMEM == SMEM_BYTES, "plugins/stem.py: pool_smem_bytes must give this kernel's shared memory");
#endif

// Byte offset of patch pixel (row, column): even columns in the row's first plane, odd ones in its second.
__device__ __forceinline__ int patch_offset(int row, int col) { return row * ROW_BYTES + ((col & 1) * HALF + (col >> 1)) * VEC; }

// The channel of A row 16 w + g + 8 h (w the warp, g = lane / 4): lanes g and g ^ 1 hold channels 16 w + 4 (g / 2)
// .. + 3 between them, so one shuffle makes a word of 4 channels.
__device__ __forceinline__ int channel_of_row(int w, int g, int h) { return 16 * w + 4 * (g / 2) + 2 * (g % 2) + h; }

// B of k32 step ks (filter row ks / 2, taps 2 (ks % 2) and + 1; for DC 1 the taps the other way round) for the block
// of conv columns 2 s - 1 + DC (s from the tile's first pooled column) at patch row `row`: no swizzle, core matrices
// of 8 columns x 16 bytes, 128 bytes apart along N, the step's second tap `K stride` bytes after its first (the other
// plane).
template <int DC>
__device__ __forceinline__ uint64_t patch_desc(uint32_t patch, int row, int ks) {
  const int pr = ks % 2;
  const int first = DC % 2 == 0 ? DC / 2 + pr : pr + 1;  // even-plane index of column 0's first tap
  const int second = DC % 2 == 0 ? DC / 2 + pr : pr;     // odd-plane index of its second
  const uint32_t start = patch + (row + ks / 2) * ROW_BYTES + first * VEC;
  const uint32_t k_stride = (HALF + second - first) * VEC;
  return sm90::desc_kmajor_interleave(start, k_stride, 128);
}

// A requantized word of (slot 8jj + 2q, + 1) x (this thread's two channels) into the word of one slot's 4 channels:
// lanes g and g ^ 1 swap words; even g keeps slot 8jj + 2q, odd g slot 8jj + 2q + 1 (channels 16 warp + 4 (g / 2) ..).
__device__ __forceinline__ uint32_t slot_word(uint32_t mine, int g) {
  const uint32_t theirs = __shfl_xor_sync(0xffffffffu, mine, 4);
  return g % 2 ? __byte_perm(mine, theirs, 0x3276) : __byte_perm(mine, theirs, 0x5410);
}

// The next conv's B for k32 step ks: channel c of column `slot` at byte (c / 16) * 1024 + (slot / 8) * 128 +
// (slot % 8) * 16 + c % 16 (no swizzle), so a k32 step's two 16-channel halves are 1024 bytes apart (K stride) and
// 8-column groups 128 (N stride).
__device__ __forceinline__ int b_offset(int slot, int c) { return (c / 16) * 1024 + (slot / 8) * 128 + (slot % 8) * 16 + c % 16; }
__device__ __forceinline__ uint64_t b_desc(uint32_t b, int ks) {
  return sm90::desc_kmajor_interleave(b + ks * 2 * 1024, 1024, 128);
}

// One block: the 8 wgmma of conv columns 2 s - 1 + DC at patch row `row` into acc (A: the weights, with the taps of
// each k-step swapped for DC 1), waited for.
template <int DC>
__device__ __forceinline__ void conv_block(const uint32_t (&a)[KSTEPS][4], const uint32_t (&a_swapped)[KSTEPS][4], uint32_t patch,
                                           int row, bool never, int (&acc)[32]) {
  sm90::wgmma_fence();  // acc was read since its last wgmma
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
    sm90::WgmmaS8<64>::mma_rs(acc, DC ? a_swapped[ks] : a[ks], patch_desc<DC>(patch, row, ks), ks > 0 || never);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
}

// A thread's accumulator register i: channel h = (i / 2) % 2 of its two, column (slot) 8 (i / 4) + 2q + i % 2. Values
// are compared inverted where the channel's factor is negative (flip[h] = -1), so that a maximum of inverted values is
// the inverted minimum.
struct Lane {
  int q, lane;
  int flip[2];
};

// best = max(E[s], E[s + 1]) per column from block E's accumulators e, inverted by flip: E[s + 1] is the thread's next
// register for even columns, and for odd ones register 8 (i / 4) + 2 of the lane to its right (q + 1), whose column is
// s + 1; lane q = 3 takes the next group's column 0 from lane q = 0, which sends that instead. LEFT: column s = 0's
// own E is left of the image (register 0 and 2 of q = 0). right_slot >= 0: no column above it takes its E[s + 1].
template <bool RIGHT>
__device__ __forceinline__ void left_pair_max(const int (&e)[32], const Lane& t, bool left, int right_slot, int (&best)[32]) {
  const int source = (t.lane & ~3) | ((t.lane + 1) & 3);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * jj + 2 * h;  // the even column's register; i + 1 the odd column's
      const int own0 = e[i] ^ t.flip[h], own1 = e[i + 1] ^ t.flip[h];
      const int next_group = jj < 7 ? e[i + 4] ^ t.flip[h] : own0;  // column 8 (jj + 1) of lane q = 0 (jj = 7: unused)
      int right = __shfl_sync(0xffffffffu, t.q == 0 ? next_group : own0, source);
      int right_of_even = own1;
      if (RIGHT) {  // E[s + 1] outside the image
        const int s = 8 * jj + 2 * t.q;
        right_of_even = s > right_slot ? NEVER_MAX : right_of_even;
        right = s + 1 > right_slot ? NEVER_MAX : right;
      }
      best[i] = max(jj == 0 && left ? NEVER_MAX : own0, right_of_even);
      best[i + 1] = max(own1, right);
    }
  }
}

}  // namespace stem_rows

// p describes the folded conv (C = 16, R = S = 4, stride 1, K = 64, OH x OW its output); PH x PW the pooled output.
// image_index: nullptr, or image n of the batch is image image_index[n] of p.x (a device sample library).
// p1 (STEM_POOL_ROWS_CONV1): the next 1x1 conv on the pooled output (its w, scale, bias, out_scale, y, relu).
extern "C" __global__ void __launch_bounds__(stem_rows::THREADS, 2) trtfuse_stem_pool_rows(const ConvParams p, int PH, int PW,
                                                                                        const long long* image_index,
                                                                                        const ConvParams p1) {
  using namespace stem_rows;
  extern __shared__ __align__(1024) int8_t smem[];
  trap_unless_dynamic_smem(SMEM_BYTES);  // the launcher's byte count (plugins/stem.py) must cover the tile
  int8_t* const patches = smem;
  float* const factor_a = reinterpret_cast<float*>(patches + 2 * PATCH_BYTES);
  float* const factor_b = factor_a + CH;
  float* const factor_a1 = factor_b + CH;  // the next conv's (CONV1)
  float* const factor_b1 = factor_a1 + CH;
  int8_t* const b_rows = reinterpret_cast<int8_t*>(factor_b1 + CH);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  fold_factors(factor_a, factor_b, p, tid, THREADS);
  if (CONV1) fold_factors(factor_a1, factor_b1, p1, tid, THREADS);
  const float relu_min = relu_floor(p.relu != 0);
  const int tiles_h = (PH + TPH - 1) / TPH, tiles_w = (PW + OUT_COLS - 1) / OUT_COLS;
  const int tiles = p.N * tiles_h * tiles_w;

  auto load_patch = [&](int tile, int buf) {
    const StemTile at = StemTile::at<TPH, OUT_COLS>(tile, tiles_h, tiles_w, p);
    const int8_t* const image = p.x + (size_t)(image_index ? image_index[at.n] : at.n) * p.H * p.W * VEC;
    load_input_patch<IR, IC, THREADS>(patches + buf * PATCH_BYTES, image, p, at.ir0, at.ic0, tid,
                                      [](int, int row, int col) { return patch_offset(row, col); });
  };
  if (blockIdx.x < tiles) load_patch(blockIdx.x, 0);

  // A: this thread's weights for the whole kernel. a[ks][i] holds row 16 warp + g + 8 (i % 2), bytes 4q .. 4q + 3 of
  // tap 2 ks + i / 2 (wgmma's A fragment); a row's weights are w[channel][tap][16 input channels] (KG bytes).
  uint32_t a[KSTEPS][4];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[ks][i] = __ldg(reinterpret_cast<const uint32_t*>(p.w + channel_of_row(warp, g, i % 2) * KG + ks * 32 + (i / 2) * 16 + 4 * q));
  // The same with the taps of each k-step swapped (the O blocks): wgmma reads A from 4 consecutive registers.
  uint32_t a_swapped[KSTEPS][4];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) a_swapped[ks][i] = a[ks][i ^ 2];
  // The next conv's A (CONV1): a1[ks][i] holds row 16 warp + g + 8 (i % 2) (its output channel permuted as above),
  // input channels 32 ks + 16 (i / 2) + 4q .. + 3.
  uint32_t a1[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a1[ks][i] = CONV1 ? __ldg(reinterpret_cast<const uint32_t*>(p1.w + channel_of_row(warp, g, i % 2) * KG1 + ks * 32 + (i / 2) * 16 + 4 * q)) : 0u;
  __syncthreads();  // the factors

  // Accumulator register i: row (channel) h = (i / 2) % 2, column (slot) 8 (i / 4) + 2q + i % 2. flip[h] = -1 inverts
  // a channel whose factor is negative, so that a maximum of inverted values is the inverted minimum.
  Lane me{q, lane, {0, 0}};
  float fa[2], fb[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int c = channel_of_row(warp, g, h);
    fa[h] = factor_a[c], fb[h] = factor_b[c];
    me.flip[h] = fa[h] < 0.0f ? -1 : 0;
  }
  const int (&flip)[2] = me.flip;
  float fa1[2] = {0.0f, 0.0f}, fb1[2] = {0.0f, 0.0f};
  if (CONV1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) fa1[h] = factor_a1[channel_of_row(warp, g, h)], fb1[h] = factor_b1[channel_of_row(warp, g, h)];
  }
  const float relu_min1 = relu_floor(p1.relu != 0);
  int b_parity = 0;  // the B buffer of the next pooled row
  // Two accumulator sets (below), each block's first k-step overwriting its set by a flag ptxas cannot fold (with a
  // constant flag, ptxas (CUDA 13.0) once dropped blocks altogether, docs/design/stem-pool.md).
  int acc[2][32];
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[k][i] = 0;
  const bool never = p.splits < 0;  // false, unknown to ptxas

  for (int tile = blockIdx.x, buf = 0; tile < tiles; tile += gridDim.x, buf ^= 1) {
    const int n = tile / (tiles_h * tiles_w), t = tile % (tiles_h * tiles_w);
    const int ph0 = (t / tiles_w) * TPH, pw0 = (t % tiles_w) * OUT_COLS;
    const int cr0 = ph0 * PS - PP, cc0 = pw0 * PS - PP;  // the tile's first conv row and column
    const uint32_t patch = smem_u32(patches + buf * PATCH_BYTES);
    cp_async_wait<0>();
    sm90::fence_proxy_async_shared();  // written by cp.async (generic proxy), read by wgmma (async proxy)
    __syncthreads();  // this tile's patch has landed; the other buffer's last reader (the previous tile) is done
    if (tile + gridDim.x < tiles) load_patch(tile + gridDim.x, buf ^ 1);

    // Conv pixels left of the image (the pool's padding: E of column 0 in an image's first tile, on lanes q = 0) and
    // right of it (an odd conv width's last pooled column) never win.
    const bool left = cc0 + 4 * q < 0;
    const int right_slot = (p.OW - 1 - cc0) / 2 - 1;  // the last column whose E[s + 1] is in the image
    const bool right_pad = right_slot < min(OUT_COLS, PW - pw0) - 1;

    // Tile row j is conv row cr0 + j (rows below the image read as the last one); pooled row i takes conv rows
    // 2i + 1 (into carry, which holds rows 2i - 1 and 2i) and 2i + 2 (lower). Block E of a row runs on X, its O on
    // Y, each waited for before it is read: the SM's other CTA keeps the tensor cores busy meanwhile. ptxas (CUDA
    // 13.0) computes a block's maximum after the next block's wgmma where it can; with one accumulator set that
    // wgmma overwrote the values first (every pooled value came out without its window's left column,
    // tests/test_stem_pool_gpu.py). With two, and E read before O is issued, the next wgmma writes the other set.
    const int rows = min(TPH, PH - ph0);
    auto row_of = [&](int j) { return min(j, p.OH - 1 - cr0); };
    int (&X)[32] = acc[0];
    int (&Y)[32] = acc[1];
    // row = the window maximum of conv row `j` per column (E, O and the next E), inverted by flip
    auto conv_row = [&](int j, int (&row)[32]) {
      conv_block<0>(a, a_swapped, patch, row_of(j), never, X);
      if (right_pad) left_pair_max<true>(X, me, left, right_slot, row);
      else left_pair_max<false>(X, me, left, right_slot, row);
      conv_block<1>(a, a_swapped, patch, row_of(j), never, Y);
#pragma unroll
      for (int i = 0; i < 32; ++i) row[i] = max(row[i], Y[i] ^ flip[(i / 2) % 2]);
    };
    int carry[32], lower[32];
    if (cr0 >= 0) {
      conv_row(0, carry);
    } else {  // the row above the image: never the maximum
#pragma unroll
      for (int i = 0; i < 32; ++i) carry[i] = NEVER_MAX;
    }
    for (int i = 0; i < rows; ++i) {
      conv_row(2 * i + 1, lower);
#pragma unroll
      for (int r = 0; r < 32; ++r) carry[r] = max(carry[r], lower[r]);
      conv_row(2 * i + 2, lower);

      // Pooled row ph: per n8 column group jj, requantize_word turns (slot 8jj + 2q, + 1) x (this thread's two
      // channels) into one word, slot_word into one slot's 4 channels.
      const int ph = ph0 + i, c = 16 * warp + 4 * (g / 2);
      int8_t* const out = p.y + ((size_t)(n * (CH / 32) + c / 32) * PH + ph) * PW * 32 + c % 32;
      const float wa[4] = {fa[0], fa[1], fa[0], fa[1]}, wb[4] = {fb[0], fb[1], fb[0], fb[1]};
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        int pooled[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // word byte e: slot 8jj + 2q + e / 2, channel h = e % 2
          const int r = 4 * jj + 2 * (e % 2) + e / 2;
          pooled[e] = max(carry[r], lower[r]) ^ flip[e % 2];
        }
        const uint32_t word = slot_word(requantize_word<false>(pooled, wa, wb, 0u, 0.0f, relu_min), g);
        const int slot = 8 * jj + 2 * q + g % 2, pw = pw0 + slot;
        if (slot < OUT_COLS && pw < PW)  // slot 63 is the next tile's first column
          *reinterpret_cast<uint32_t*>(out + (size_t)pw * 32) = word;
        if (CONV1) *reinterpret_cast<uint32_t*>(b_rows + b_parity * B_BYTES + b_offset(slot, c)) = word;
      }
      if (CONV1) {
        // The next conv on this pooled row: its B written above (generic proxy) is read by wgmma (async proxy). The
        // other buffer, which the next row writes, was last read by the previous row's wgmma: every thread waited for
        // that before this barrier.
        sm90::fence_proxy_async_shared();
        __syncthreads();
        const uint32_t b = smem_u32(b_rows + b_parity * B_BYTES);
        b_parity ^= 1;
        int (&D)[32] = X;  // free until the next conv row
        sm90::wgmma_fence();
        sm90::WgmmaS8<64>::mma_rs(D, a1[0], b_desc(b, 0), never);
        sm90::WgmmaS8<64>::mma_rs(D, a1[1], b_desc(b, 1), true);
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        int8_t* const out1 = p1.y + ((size_t)(n * (CH / 32) + c / 32) * PH + ph) * PW * 32 + c % 32;
        const float wa1[4] = {fa1[0], fa1[1], fa1[0], fa1[1]}, wb1[4] = {fb1[0], fb1[1], fb1[0], fb1[1]};
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          int v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = D[4 * jj + 2 * (e % 2) + e / 2];
          const uint32_t word = slot_word(requantize_word<false>(v, wa1, wb1, 0u, 0.0f, relu_min1), g);
          const int slot = 8 * jj + 2 * q + g % 2, pw = pw0 + slot;
          if (slot < OUT_COLS && pw < PW) *reinterpret_cast<uint32_t*>(out1 + (size_t)pw * 32) = word;
        }
      }
#pragma unroll
      for (int r = 0; r < 32; ++r) carry[r] = lower[r];
    }
  }
}

}  // namespace trtfuse
