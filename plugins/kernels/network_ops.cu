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
// One thread per 16-byte half of an output pixel's 32-channel vector.
extern "C" __global__ void trtfuse_maxpool_chw32(const int8_t* x, int N, int CB, int H, int W, int OH, int OW, int k,
                                                 int s, int p, int8_t* y) {
  const long long total = (long long)N * CB * OH * OW * 2;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int half = i % 2;
    const long long o = i / 2;
    const int ow = o % OW, oh = (o / OW) % OH;
    const long long ncb = o / ((long long)OW * OH);
    signed char best[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) best[j] = -128;
    for (int r = 0; r < k; ++r) {
      const int ih = oh * s - p + r;
      if ((unsigned)ih >= (unsigned)H) continue;
      for (int c = 0; c < k; ++c) {
        const int iw = ow * s - p + c;
        if ((unsigned)iw >= (unsigned)W) continue;
        const int4 v = *reinterpret_cast<const int4*>(x + ((ncb * H + ih) * W + iw) * 32 + half * 16);
        const signed char* b = reinterpret_cast<const signed char*>(&v);
#pragma unroll
        for (int j = 0; j < 16; ++j) best[j] = max(best[j], b[j]);
      }
    }
    *reinterpret_cast<int4*>(y + o * 32 + half * 16) = *reinterpret_cast<const int4*>(best);
  }
}

// Lane j of the warp gets the exact int32 sum over HW pixels of channel j of one 32-channel block.
__device__ __forceinline__ int warp_channel_sum(const int8_t* block, int HW, int lane) {
  int acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = 0;
  for (int pix = lane; pix < HW; pix += 32) {
    const int4* v = reinterpret_cast<const int4*>(block + (long long)pix * 32);
    const int4 a = v[0], b = v[1];
    const signed char* pa = reinterpret_cast<const signed char*>(&a);
    const signed char* pb = reinterpret_cast<const signed char*>(&b);
#pragma unroll
    for (int j = 0; j < 16; ++j) { acc[j] += pa[j]; acc[16 + j] += pb[j]; }
  }
#pragma unroll
  for (int j = 0; j < 32; ++j)
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
  int mine = 0;  // a compile-time-indexed select keeps acc[] in registers
#pragma unroll
  for (int j = 0; j < 32; ++j) if (lane == j) mine = acc[j];
  return mine;
}

// int8 CHW32 [N][CB][H][W][32] -> int8 [N][CB*32] (= CHW32 with H = W = 1):
// y = saturate(rint(((float(sum) / float(H*W)) * in_scale) / out_scale)); the int32 sum is exact.
// One warp per (n, cb), grid-stride.
extern "C" __global__ void trtfuse_global_avgpool_chw32(const int8_t* x, const float* in_scale, const float* out_scale,
                                                        int N, int CB, int HW, int8_t* y) {
  const int lane = threadIdx.x % 32;
  for (long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; warp < (long long)N * CB;
       warp += (long long)gridDim.x * blockDim.x / 32) {
    const int sum = warp_channel_sum(x + warp * HW * 32, HW, lane);
    const float mean = __fdiv_rn(__int2float_rn(sum), __int2float_rn(HW));
    y[warp * 32 + lane] = sat_rn_s8(__fdiv_rn(__fmul_rn(mean, *in_scale), *out_scale));
  }
}

// int8 CHW32 [N][CB][H][W][32] -> fp32 [N][C]: (float(sum) / float(H*W)) * in_scale. The fp32 tail of a
// network whose classifier stays in fp32 (the GPU runner's default: same numerics as the CPU golden).
extern "C" __global__ void trtfuse_global_avgpool_chw32_f32(const int8_t* x, const float* in_scale, int N, int C,
                                                            int CB, int HW, float* y) {
  const int lane = threadIdx.x % 32;
  for (long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; warp < (long long)N * CB;
       warp += (long long)gridDim.x * blockDim.x / 32) {
    const int sum = warp_channel_sum(x + warp * HW * 32, HW, lane);
    const long long n = warp / CB, c = (warp % CB) * 32 + lane;
    if (c < C) y[n * C + c] = __fmul_rn(__fdiv_rn(__int2float_rn(sum), __int2float_rn(HW)), *in_scale);
  }
}

// fp32 y[M][N] = x[M][K] . W^T + bias, W stored [N][K] (Gemm transB = 1). 32x32 output tile per CTA,
// 256 threads, K staged through shared memory 32 at a time; each thread owns 4 outputs.
extern "C" __global__ void trtfuse_linear_f32(const float* x, const float* w, const float* bias, int M, int N, int K,
                                              float* y) {
  __shared__ float xs[32][33], ws[32][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // ty: 0..7
  const int m0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty + 8 * i;
      xs[r][tx] = (m0 + r < M && k0 + tx < K) ? x[(long long)(m0 + r) * K + k0 + tx] : 0.f;
      ws[r][tx] = (n0 + r < N && k0 + tx < K) ? w[(long long)(n0 + r) * K + k0 + tx] : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < 32; ++kk) {
      const float wv = ws[tx][kk];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = fmaf(xs[ty + 8 * i][kk], wv, acc[i]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty + 8 * i, n = n0 + tx;
    if (m < M && n < N) y[(long long)m * N + n] = acc[i] + bias[n];
  }
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
