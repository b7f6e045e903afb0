// The small int8 CHW32 kernels a whole network needs around the fused convs (docs/ops.md, "Network
// ops"): input quantize + reformat, max-pool, global average pool. All memory-bound: one thread per
// output vector, coalesced along W, integer-exact where the op allows.
#include "int_types.cuh"

__device__ __forceinline__ signed char sat_rn_s8(float v) {
  short q;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=h"(q) : "f"(v));
  return (signed char)q;
}

// fp32 NCHW -> int8 CHW{V} (V = 4 or 32): y = saturate(rint(x / scale)), padding channels 0
// (ONNX QuantizeLinear with zero point 0). One thread per (n, cb, h, w) vector of V channels.
template <int V>
__device__ __forceinline__ void quantize_chwv(const float* x, const float* scale, int N, int C, int H, int W, int8_t* y) {
  const long long HW = (long long)H * W, CB = (C + V - 1) / V;
  const long long total = N * CB * HW;
  const float s = *scale;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const long long pix = i % HW, ncb = i / HW, cb = ncb % CB, n = ncb / CB;
    int words[V / 4];
#pragma unroll
    for (int wi = 0; wi < V / 4; ++wi) {
      unsigned packed = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const long long c = cb * V + wi * 4 + b;
        const signed char q = c < C ? sat_rn_s8(__fdiv_rn(x[(n * C + c) * HW + pix], s)) : (signed char)0;
        packed |= (unsigned)(unsigned char)q << (8 * b);
      }
      words[wi] = (int)packed;
    }
#pragma unroll
    for (int wi = 0; wi < V / 4; wi += (V >= 16 ? 4 : 1)) {
      if (V >= 16) reinterpret_cast<int4*>(y + i * V)[wi / 4] = make_int4(words[wi], words[wi + 1], words[wi + 2], words[wi + 3]);
      else reinterpret_cast<int*>(y + i * V)[wi] = words[wi];
    }
  }
}
extern "C" __global__ void trtfuse_quantize_chw32(const float* x, const float* scale, int N, int C, int H, int W, int8_t* y) {
  quantize_chwv<32>(x, scale, N, C, H, W, y);
}
extern "C" __global__ void trtfuse_quantize_chw4(const float* x, const float* scale, int N, int C, int H, int W, int8_t* y) {
  quantize_chwv<4>(x, scale, N, C, H, W, y);
}

// fp32 NCHW (C <= 4) -> the space-to-depth stem's int8 input [N][1][ceil(H/2)][ceil(W/2)][16]
// (plugins/stem.py): channel (2a + b) * C + c of folded pixel (i, j) is pixel (2i + a, 2j + b) of
// channel c, quantized like QuantizeLinear; unused channels and pixels past H, W are 0. One thread
// per folded pixel, one 16-byte store.
extern "C" __global__ void trtfuse_quantize_s2d16(const float* x, const float* scale, int N, int C, int H, int W, int8_t* y) {
  const int H2 = (H + 1) / 2, W2 = (W + 1) / 2;
  const long long total = (long long)N * H2 * W2;
  const float s = *scale;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int j2 = i % W2, i2 = (i / W2) % H2;
    const long long n = i / ((long long)W2 * H2);
    // The slot of a byte depends on C (run time): two 64-bit registers and shifts, not an indexed
    // array (which would live in local memory).
    unsigned long long lo = 0ull, hi = 0ull;
#pragma unroll
    for (int ab = 0; ab < 4; ++ab) {
      const int h = 2 * i2 + ab / 2, w = 2 * j2 + ab % 2;
      if (h >= H || w >= W) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c >= C) break;
        const int slot = ab * C + c;
        const unsigned long long q = (unsigned char)sat_rn_s8(__fdiv_rn(x[((n * C + c) * H + h) * W + w], s));
        if (slot < 8) lo |= q << (8 * slot); else hi |= q << (8 * (slot - 8));
      }
    }
    reinterpret_cast<ulonglong2*>(y)[i] = make_ulonglong2(lo, hi);
  }
}

// int8 CHW32 max-pool (square window k, stride s, padding p; padded positions never win).
// A block per output row (n, channel block, oh), grid-stride over rows; a thread per 16-byte half of an
// output pixel's 32 channels. The window's clipped bounds come from 32-bit math once per row and pixel
// (per-element 64-bit divisions were most of an earlier version's instructions), and four signed-byte
// maxima take one __vmaxs4.
extern "C" __global__ void trtfuse_maxpool_chw32(const int8_t* x, int N, int CB, int H, int W, int OH, int OW, int k,
                                                 int s, int p, int8_t* y) {
  const long long rows = (long long)N * CB * OH;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const int oh = static_cast<int>(row % OH);
    const uint4* plane = reinterpret_cast<const uint4*>(x + (row / OH) * H * W * 32);  // 2 uint4 per pixel
    uint4* out = reinterpret_cast<uint4*>(y + row * OW * 32);
    const int h0 = max(oh * s - p, 0), h1 = min(oh * s - p + k, H);
    for (int t = threadIdx.x; t < 2 * OW; t += blockDim.x) {
      const int ow = t >> 1, half = t & 1;
      const int w0 = max(ow * s - p, 0), w1 = min(ow * s - p + k, W);
      uint4 best = make_uint4(0x80808080u, 0x80808080u, 0x80808080u, 0x80808080u);
      for (int ih = h0; ih < h1; ++ih)
        for (int iw = w0; iw < w1; ++iw) {
          const uint4 v = __ldg(plane + 2 * (ih * W + iw) + half);
          best = make_uint4(__vmaxs4(best.x, v.x), __vmaxs4(best.y, v.y), __vmaxs4(best.z, v.z), __vmaxs4(best.w, v.w));
        }
      out[t] = best;
    }
  }
}

// The exact int32 sums over HW pixels of the 16 channels of one half (16 bytes) of a 32-channel block, for one
// thread: a thread per (n, channel block, half), no shuffles. Each byte is biased to unsigned (s + 128) and the
// bytes are added two to a word, in 16-bit lanes: even bytes (0, 2) by one LOP3, odd bytes (1, 3) by a PRMT and a
// LOP3, so 4 channels cost 5 instructions a pixel where extracting and adding each byte cost 8. A lane holds at
// most 256 * 255 < 2^16: every 256 pixels the lanes are moved into int32 totals, and the bias taken off at the end.
__device__ __forceinline__ void half_block_channel_sums(const int8_t* half_block, int HW, int (&sum)[16]) {
#pragma unroll
  for (int c = 0; c < 16; ++c) sum[c] = 0;
  for (int p0 = 0; p0 < HW; p0 += 256) {
    const int pixels = min(HW - p0, 256);
    unsigned even[4] = {0, 0, 0, 0}, odd[4] = {0, 0, 0, 0};
    const int4* v = reinterpret_cast<const int4*>(half_block + (long long)p0 * 32);
#pragma unroll 7
    for (int pix = 0; pix < pixels; ++pix) {
      const int4 q = __ldg(v + 2 * pix);  // the pixel's 32 channels are 32 bytes: this half's 16 every second int4
      const unsigned words[4] = {(unsigned)q.x, (unsigned)q.y, (unsigned)q.z, (unsigned)q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        even[j] += (words[j] ^ 0x80808080u) & 0x00ff00ffu;
        odd[j] += __byte_perm(words[j], 0, 0x4341) ^ 0x00800080u;  // bytes 1, 3 to bytes 0, 2; zeros above
      }
    }
    const int bias = 128 * pixels;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sum[4 * j + 0] += (int)(even[j] & 0xffffu) - bias;
      sum[4 * j + 1] += (int)(odd[j] & 0xffffu) - bias;
      sum[4 * j + 2] += (int)(even[j] >> 16) - bias;
      sum[4 * j + 3] += (int)(odd[j] >> 16) - bias;
    }
  }
}

// int8 CHW32 [N][CB][H][W][32] -> int8 [N][CB*32] (= CHW32 with H = W = 1):
// y = saturate(rint(((float(sum) / float(H*W)) * in_scale) / out_scale)); the int32 sum is exact.
// A thread per (n, cb, half) (adjacent threads read a pixel's two halves: whole 32-byte sectors), grid-stride.
extern "C" __global__ void trtfuse_global_avgpool_chw32(const int8_t* x, const float* in_scale, const float* out_scale,
                                                        int N, int CB, int HW, int8_t* y) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < 2LL * N * CB; t += (long long)gridDim.x * blockDim.x) {
    const long long block = t / 2, half = t % 2;
    int sum[16];
    half_block_channel_sums(x + block * HW * 32 + half * 16, HW, sum);
    unsigned words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const float mean = __fdiv_rn(__int2float_rn(sum[c]), __int2float_rn(HW));
      words[c / 4] |= (unsigned)(unsigned char)sat_rn_s8(__fdiv_rn(__fmul_rn(mean, *in_scale), *out_scale)) << (8 * (c % 4));
    }
    *reinterpret_cast<int4*>(y + t * 16) = make_int4(words[0], words[1], words[2], words[3]);
  }
}

// int8 CHW32 [N][CB][H][W][32] -> fp32 [N][C]: (float(sum) / float(H*W)) * in_scale. The fp32 tail of a
// network whose classifier stays in fp32 (the GPU runner's default: same numerics as the CPU golden).
// A thread per (n, cb, half), as above.
extern "C" __global__ void trtfuse_global_avgpool_chw32_f32(const int8_t* x, const float* in_scale, int N, int C,
                                                            int CB, int HW, float* y) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < 2LL * N * CB; t += (long long)gridDim.x * blockDim.x) {
    const long long block = t / 2, n = block / CB, c0 = (block % CB) * 32 + (t % 2) * 16;
    int sum[16];
    half_block_channel_sums(x + block * HW * 32 + (t % 2) * 16, HW, sum);
    float mean[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) mean[c] = __fmul_rn(__fdiv_rn(__int2float_rn(sum[c]), __int2float_rn(HW)), *in_scale);
    float* row = y + n * C + c0;
    if (c0 + 16 <= C && (C % 4 == 0)) {  // 16-byte stores: the row start n * C is a multiple of 4 floats
#pragma unroll
      for (int c = 0; c < 16; c += 4) *reinterpret_cast<float4*>(row + c) = make_float4(mean[c], mean[c + 1], mean[c + 2], mean[c + 3]);
    } else {
#pragma unroll
      for (int c = 0; c < 16; ++c)
        if (c0 + c < C) row[c] = mean[c];
    }
  }
}

// fp32 y[M][N] = x[M][K] . W^T + bias, W stored [N][K] (Gemm transB = 1).
//
// Numerics (fixed, tests/test_network_ops.py checks them bit for bit against reference.linear_f32):
// every output is acc = 0; for k in 0 .. round_up(K, 32) - 1: acc = fmaf(x[m][k], w[n][k], acc), with
// x = w = 0 past K; y = acc + bias[n]. That is the order of the 32x32-tile kernel this one replaced (the
// zero steps past K only turn an accumulator of -0 into +0, as they did there), so the logits did not move.
// No split-K: that would change the order. Both tiles below give the same bits.
//
// Tiling: the classifier's output is small (256 x 1000 for ResNet-50 at batch 256) and K long (2048).
// * trtfuse_linear_f32: 32 (M) x 64 (N) outputs per CTA of 128 threads, each 4 rows x 4 columns (16
//   independent FMA chains): 128 CTAs at batch 256, one per SM.
// * trtfuse_linear_f32_wide: 128 x 128 per CTA of 256 threads, each 8 x 8. A thread's 64 FMAs per k step
//   take 16 shared loads where the 4 x 4 tile's 16 take 8, so fewer issue slots go to loads; it fills the
//   GPU only from about batch 2048 (128 CTAs for 1000 classes), below that the narrow tile's grid wins.
// Shared memory keeps the global layout (k contiguous, rows padded by 4 floats: the 16-byte stores of a tile
// are conflict-free, or 2-way for the wide tile's, and so are the reads below); a thread's columns are
// BN / TN apart so that the 8 column threads of a quarter warp read 8 consecutive rows, which fall in
// distinct bank groups, while its rows are read by broadcast. K is staged BK at a time through two shared
// buffers: the next tile's global loads are in flight while the current one is multiplied.
//
// Fused top-1 (top1 != nullptr): each row's numpy.argmax (as top1::argmax_rows computes it) of the y just
// written, so no separate pass reads the logits back. A (value, column) pair becomes one 64-bit key whose
// unsigned order is argmax's preference, which turns the reduction into plain max: within a thread, across
// the 16 lanes that share its rows, then across the row block's CTAs by atomicMax on top1_keys[m]. The last
// CTA of a row block to finish (counted in row_block_done[blockIdx.y]) decodes the winners and zeroes the
// keys and its counter, so the scratch stays valid for the next launch once zeroed at allocation.
namespace linear {
// High word: the value's bits mapped so that unsigned order is float order (negatives reversed, positives
// above them), -0 made +0 (argmax takes them as equal), every NaN the largest (a NaN is the maximum). Low
// word: 0xFFFFFFFF - n, so that of equal values the first column wins. Never 0 (the low word is at least
// 2^31), which leaves 0 free to mean "no column yet".
__device__ __forceinline__ unsigned long long argmax_key(float v, int n) {
  const unsigned bits = v == 0.f ? 0u : __float_as_uint(v);
  const unsigned ordered = isnan(v) ? 0xFFFFFFFFu : (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return ((unsigned long long)ordered << 32) | (0xFFFFFFFFu - (unsigned)n);
}

// Four consecutive k of one row, zero past K (and the whole row zero when it is past M or N).
__device__ __forceinline__ float4 load4(const float* row, bool row_ok, int k, int K, bool vec) {
  if (!row_ok) return make_float4(0.f, 0.f, 0.f, 0.f);
  if (vec) return k < K ? *reinterpret_cast<const float4*>(row + k) : make_float4(0.f, 0.f, 0.f, 0.f);
  return make_float4(k < K ? row[k] : 0.f, k + 1 < K ? row[k + 1] : 0.f, k + 2 < K ? row[k + 2] : 0.f,
                     k + 3 < K ? row[k + 3] : 0.f);
}

// BM x BN outputs per CTA, TM x TN per thread, BK of k per stage.
template <int BM, int BN, int TM, int TN, int BK>
__device__ __forceinline__ void gemm_tile(const float* x, const float* w, const float* bias, int M, int N, int K, float* y,
                                          unsigned long long* top1_keys, unsigned int* row_block_done, int* top1) {
  constexpr int LD = BK + 4, COLS = BN / TN, ROWS = BM / TM, THREADS = COLS * ROWS;
  constexpr int VEC_PER_ROW = BK / 4, ROWS_PER_PASS = THREADS / VEC_PER_ROW;
  static_assert(BM % ROWS_PER_PASS == 0 && BN % ROWS_PER_PASS == 0 && 32 % BK == 0, "tile shape");
  static_assert(COLS == 16, "the top-1 shuffles reduce over 16 lanes sharing rows");
  __shared__ __align__(16) float xs[2][BM][LD];
  __shared__ __align__(16) float ws[2][BN][LD];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  // float4 global loads need every row start 16-byte aligned; anything else takes the scalar loads.
  const bool vec = (K % 4 == 0) && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w)) % 16 == 0);

  // Loader: thread -> (row tid / VEC_PER_ROW + ROWS_PER_PASS p, k = 4 * (tid % VEC_PER_ROW)).
  const int lrow = tid / VEC_PER_ROW, lk = 4 * (tid % VEC_PER_ROW);
  float4 xr[BM / ROWS_PER_PASS], wr[BN / ROWS_PER_PASS];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int p = 0; p < BM / ROWS_PER_PASS; ++p) {
      const int m = m0 + lrow + ROWS_PER_PASS * p;
      xr[p] = load4(x + (long long)m * K, m < M, k0 + lk, K, vec);
    }
#pragma unroll
    for (int p = 0; p < BN / ROWS_PER_PASS; ++p) {
      const int n = n0 + lrow + ROWS_PER_PASS * p;
      wr[p] = load4(w + (long long)n * K, n < N, k0 + lk, K, vec);
    }
  };
  auto stage = [&](int buf) {
#pragma unroll
    for (int p = 0; p < BM / ROWS_PER_PASS; ++p) *reinterpret_cast<float4*>(&xs[buf][lrow + ROWS_PER_PASS * p][lk]) = xr[p];
#pragma unroll
    for (int p = 0; p < BN / ROWS_PER_PASS; ++p) *reinterpret_cast<float4*>(&ws[buf][lrow + ROWS_PER_PASS * p][lk]) = wr[p];
  };

  // Compute: thread -> rows tm + ROWS i, columns tn + COLS j.
  const int tn = tid % COLS, tm = tid / COLS;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  const int tiles = (K + 31) / 32 * (32 / BK);  // k runs to round_up(K, 32) whatever BK: the fixed order above
  fetch(0);
  stage(0);
  __syncthreads();
  for (int t = 0; t < tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < tiles) fetch((t + 1) * BK);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 4) {
      float4 a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = *reinterpret_cast<const float4*>(&xs[buf][tm + ROWS * i][kk]);
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = *reinterpret_cast<const float4*>(&ws[buf][tn + COLS * j][kk]);
      // k ascending for every accumulator: the .x, .y, .z, .w steps in that order
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
          acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
          acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
          acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
        }
    }
    // The other buffer was last read in iteration t - 1, which every thread finished before the
    // barrier that ended it: staging into it now cannot race, and one barrier per tile suffices.
    if (t + 1 < tiles) stage(buf ^ 1);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + tm + ROWS * i;
    unsigned long long best = 0ull;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tn + COLS * j;
      if (m < M && n < N) {
        const float v = __fadd_rn(acc[i][j], bias[n]);
        y[(long long)m * N + n] = v;
        best = max(best, argmax_key(v, n));
      }
    }
    if (top1 == nullptr) continue;
    // a row's 16 column threads are one half warp (xor offsets below 16 stay in it); all lanes, rows past M too
#pragma unroll
    for (int offset = COLS / 2; offset > 0; offset /= 2) best = max(best, __shfl_xor_sync(0xffffffffu, best, offset));
    if (tn == 0 && m < M) atomicMax(&top1_keys[m], best);
  }
  if (top1 == nullptr) return;
  // The last CTA of the row block to count itself decodes the row block's keys. As in cooperative groups' grid
  // barrier: the barrier puts every thread's atomicMax before thread 0's fence (release) and count; the last
  // CTA's thread 0 fences again (acquire) before the barrier that lets its threads read the keys.
  __shared__ bool last_of_row_block;
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    last_of_row_block = atomicAdd(&row_block_done[blockIdx.y], 1u) == gridDim.x - 1;
    if (last_of_row_block) __threadfence();
  }
  __syncthreads();
  if (!last_of_row_block) return;
  for (int r = tid; r < BM && m0 + r < M; r += THREADS) {
    const unsigned long long key = atomicExch(&top1_keys[m0 + r], 0ull);
    top1[m0 + r] = (int)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull));
  }
  if (tid == 0) row_block_done[blockIdx.y] = 0u;
}
}  // namespace linear

// top1_keys [M] and row_block_done [row blocks]: zeroed once, left zeroed by every launch; all three null: no top-1.
extern "C" __global__ void __launch_bounds__(128)
trtfuse_linear_f32(const float* x, const float* w, const float* bias, int M, int N, int K, float* y,
                   unsigned long long* top1_keys, unsigned int* row_block_done, int* top1) {
  linear::gemm_tile<32, 64, 4, 4, 32>(x, w, bias, M, N, K, y, top1_keys, row_block_done, top1);
}

extern "C" __global__ void __launch_bounds__(256)
trtfuse_linear_f32_wide(const float* x, const float* w, const float* bias, int M, int N, int K, float* y,
                        unsigned long long* top1_keys, unsigned int* row_block_done, int* top1) {
  linear::gemm_tile<128, 128, 8, 8, 16>(x, w, bias, M, N, K, y, top1_keys, row_block_done, top1);
}

// Row-wise top-1 over logits [M][N] -> int32 [M], numpy.argmax's answer: the first index of the
// maximum, where a NaN counts as the maximum (the first NaN wins) and -0 equals +0. One warp per row.
namespace top1 {
// (v, i) beats (b, j): a strict total order on (value, index) pairs with distinct indices, so the
// butterfly reduction leaves every lane with the same winner whatever order the pairs meet in.
__device__ __forceinline__ bool beats(float v, int i, float b, int j) {
  if (isnan(b)) return isnan(v) && i < j;
  if (isnan(v)) return true;
  return v > b || (v == b && i < j);
}
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(unsigned short h) {  // fp16 bits -> fp32, exact
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

template <typename T>
__device__ __forceinline__ void argmax_rows(const T* x, int M, int N, int* y) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < M; row += warps) {
    const T* r = x + (long long)row * N;
    float best = __int_as_float(0xff800000);  // -inf
    int index = 0x7fffffff;  // no element yet: any element, -inf included, beats it
#pragma unroll 4
    for (int k = lane; k < N; k += 32) {
      const float v = to_float(r[k]);
      if (beats(v, k, best, index)) best = v, index = k;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, index, off);
      if (beats(ob, oi, best, index)) best = ob, index = oi;
    }
    if (lane == 0) y[row] = index;
  }
}
}  // namespace top1

extern "C" __global__ void trtfuse_argmax_rows_f32(const float* x, int M, int N, int* y) {
  top1::argmax_rows(x, M, N, y);
}
extern "C" __global__ void trtfuse_argmax_rows_f16(const unsigned short* x, int M, int N, int* y) {
  top1::argmax_rows(x, M, N, y);
}

// dst[i] = src[index[i]] for rows of row_bytes (a multiple of 16): the Offline harness gathers a batch of
// device-resident samples with one launch instead of one copy per sample. One CTA per row.
extern "C" __global__ void trtfuse_gather_rows(const int8_t* src, const long long* index, long long row_bytes, int rows,
                                               int8_t* dst) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int4* s = reinterpret_cast<const int4*>(src + index[r] * row_bytes);
    int4* d = reinterpret_cast<int4*>(dst + (long long)r * row_bytes);
    for (long long i = threadIdx.x; i < row_bytes / 16; i += blockDim.x) d[i] = s[i];
  }
}

// Row-wise softmax of fp32 logits (a classifier's trailing ONNX Softmax, axis -1): one warp per row, three
// passes: the row maximum, sum of expf(x - max) in lane order then a shuffle tree, y = expf(x - max) / sum.
// (Exact bits need not match onnxruntime's; the GPU test bounds the difference.)
extern "C" __global__ void trtfuse_softmax_rows_f32(const float* x, int M, int N, float* y) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < M; row += warps) {
    const float* r = x + (long long)row * N;
    float* out = y + (long long)row * N;
    float m = __int_as_float(0xff800000);
    for (int k = lane; k < N; k += 32) m = fmaxf(m, r[k]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.f;
    for (int k = lane; k < N; k += 32) s += expf(r[k] - m);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float inv = 1.f / s;
    for (int k = lane; k < N; k += 32) out[k] = expf(r[k] - m) * inv;
  }
}
