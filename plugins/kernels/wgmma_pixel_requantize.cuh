// The pixel-major requantize of 8 consecutive channels of one pixel, with no tactic behind it: the weight rows are
// permuted (plugins/wgmma.py) so that a thread's accumulators of wgmma columns 8(4b + jj) + 2q + e are channels
// 32b + 8q + 2jj + e. Shared by the wgmma conv's pixel-major epilogue (wgmma_pixel_epilogue.cuh) and the chained
// 1x1 convs (chain_conv.cu), so both round exactly as docs/ops.md says through the one requantize_word.
#pragma once
#include "conv_epilogue.cuh"

namespace trtfuse {

// The 8 accumulators of channel block b (held at acc[4(4b + jj) + 2h + e]) with their 8 folded factors and 8
// residual bytes (channel order) -> 8 int8 in channel order, two words. ACC_XU: how many of each word's accumulators
// convert on the XU pipe (requantize_word; the caller guarantees |acc| <= 2^24).
template <int ACC_XU, int NACC, bool RES>
__device__ __forceinline__ uint2 requantize_8_channels(const int (&acc)[NACC], int b, int h, const float4 (&sc)[2],
                                                       const float4 (&bi)[2], uint2 res, float rs, float relu_min) {
  const float a[8] = {sc[0].x, sc[0].y, sc[0].z, sc[0].w, sc[1].x, sc[1].y, sc[1].z, sc[1].w};
  const float o[8] = {bi[0].x, bi[0].y, bi[0].z, bi[0].w, bi[1].x, bi[1].y, bi[1].z, bi[1].w};
  int v[2][4];
  float fa[2][4], fo[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // i = 2jj + e
    v[i / 4][i % 4] = acc[4 * (4 * b + i / 2) + 2 * h + i % 2];
    fa[i / 4][i % 4] = a[i];
    fo[i / 4][i % 4] = o[i];
  }
  return make_uint2(requantize_word<RES, ACC_XU>(v[0], fa[0], fo[0], res.x, rs, relu_min),
                    requantize_word<RES, ACC_XU>(v[1], fa[1], fo[1], res.y, rs, relu_min));
}

}  // namespace trtfuse
