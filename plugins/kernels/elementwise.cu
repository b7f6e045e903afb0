// Elementwise int8 CHW32 kernels: the second half of the *unfused* baseline (conv, then this), and
// helpers a network needs around the convs. 16 bytes per thread, grid-stride.
#include "int_types.cuh"

__device__ __forceinline__ signed char requant_rn(float v, float out_scale) {
  int q = __float2int_rn(__fdiv_rn(v, out_scale));
  return (signed char)min(127, max(-128, q));
}

// y = requant(relu?(a * a_scale + r * r_scale) / out_scale), elementwise over n bytes (n % 16 == 0).
extern "C" __global__ void trtfuse_add_relu_requant(const int8_t* a, const float* a_scale, const int8_t* r,
                                                    const float* r_scale, const float* out_scale, int relu,
                                                    long long n, int8_t* y) {
  const float as = *a_scale, rs = *r_scale, os = *out_scale;
  for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 16; i < n;
       i += (long long)gridDim.x * blockDim.x * 16) {
    const int4 av = *reinterpret_cast<const int4*>(a + i);
    const int4 rv = *reinterpret_cast<const int4*>(r + i);
    const signed char* ab = reinterpret_cast<const signed char*>(&av);
    const signed char* rb = reinterpret_cast<const signed char*>(&rv);
    int4 out;
    signed char* ob = reinterpret_cast<signed char*>(&out);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float v = __fadd_rn(__fmul_rn((float)ab[j], as), __fmul_rn((float)rb[j], rs));
      if (relu) v = fmaxf(v, 0.0f);
      ob[j] = requant_rn(v, os);
    }
    *reinterpret_cast<int4*>(y + i) = out;
  }
}
