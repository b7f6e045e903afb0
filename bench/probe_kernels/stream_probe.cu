// Profiling only (bench/stream_probe.py), never a tactic: the epilogue's two memory streams of the
// pixel-major wgmma tactic (wgmma_conv.cu, consume_pixel_major) with no math and no tensor cores, to say
// whether the access pattern itself or the kernel around it bounds the residual 1x1 layers.
//
// probe_flat   y = r + 1 over the whole CHW32 tensor, grid-stride 16-byte vectors: the pattern-free rate.
// probe_tiles  persistent CTAs of 8 warps walking the wgmma kernel's tiles (TileCoord's order: channel
//              tile fastest, tile += gridDim.x), each warp its 16 pixels x PROBE_BLOCKS channel blocks:
//              residual slice cp.async'ed into shared memory (PROBE_AHEAD 1: one tile ahead, as the
//              kernel does; 0: waited for at once), then stored as PROBE_STORE-byte CHW32 pieces (8: the
//              kernel's lane map, lane (g, q) -> pixel g + 8h, bytes 8q..8q+7; 16: lane l -> pixel l / 2,
//              half l % 2). `spin` clocks per tile stand in for the main loop.
#include "mma_sm80.cuh"
using trtfuse::cp_async_commit;
using trtfuse::cp_async_wait;

#ifndef PROBE_AHEAD
#define PROBE_AHEAD 1
#endif
#ifndef PROBE_STORE
#define PROBE_STORE 8
#endif
#ifndef PROBE_BLOCKS
#define PROBE_BLOCKS 8
#endif

struct ProbeGeometry {
  int n, kblocks, oh, ow, th, tiles_per_image, ch_tiles, tiles;
  long long spin;
};

extern "C" __global__ void probe_flat(const int4* __restrict__ r, int4* __restrict__ y, long long n16) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
    int4 v = r[i];
    v.x = __vadd4(v.x, 0x01010101u);
    v.y = __vadd4(v.y, 0x01010101u);
    v.z = __vadd4(v.z, 0x01010101u);
    v.w = __vadd4(v.w, 0x01010101u);
    y[i] = v;
  }
}

namespace {
using namespace trtfuse;
constexpr int kSliceBytes = 16 * 32 * PROBE_BLOCKS;  // one warp: 16 pixels x the tile's blocks

struct ProbeTile {
  int m0, valid_px, block0;
  __device__ ProbeTile(int tile, const ProbeGeometry& g) {
    const int ch_tile = tile % g.ch_tiles, pix_tile = tile / g.ch_tiles;
    const int n0 = pix_tile / g.tiles_per_image, oh0 = (pix_tile - n0 * g.tiles_per_image) * g.th;
    valid_px = min(g.oh - oh0, g.th) * g.ow;
    m0 = n0 * g.oh * g.ow + oh0 * g.ow;
    block0 = ch_tile * PROBE_BLOCKS;
  }
  // Byte offset of (tile pixel px, the tile's first block), CHW32; block b is b * OH * OW * 32 further.
  __device__ size_t offset(int px, const ProbeGeometry& g) const {
    const int ohw = g.oh * g.ow, m = m0 + px, n = m / ohw;
    return ((size_t)(n * g.kblocks + block0) * ohw + (m - n * ohw)) * 32;
  }
};

__device__ void load_slice(int8_t* slice, const int8_t* r, const ProbeTile& t, int first_px, int lane,
                           const ProbeGeometry& g) {
  const int px = first_px + lane / 2;
  const bool ok = px < t.valid_px;
  const size_t row = ok ? t.offset(px, g) + 16 * (lane % 2) : 0, block = (size_t)g.oh * g.ow * 32;
#pragma unroll
  for (int b = 0; b < PROBE_BLOCKS; ++b)
    cp_async_16(smem_u32(slice + (16 * b + lane / 2) * 32 + 16 * (lane % 2)), ok ? r + row + b * block : r, ok);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(256, 1)
    probe_tiles(const int8_t* __restrict__ r, int8_t* __restrict__ y, const ProbeGeometry g) {
  extern __shared__ __align__(16) int8_t probe_smem[];  // two buffers x 8 warps' slices (64 KB: dynamic)
  auto slices = reinterpret_cast<int8_t(*)[8][kSliceBytes]>(probe_smem);
  const size_t block = (size_t)g.oh * g.ow * 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, first_px = 16 * warp;
  int buf = 0;
  if (PROBE_AHEAD && (int)blockIdx.x < g.tiles) load_slice(slices[0][warp], r, ProbeTile(blockIdx.x, g), first_px, lane, g);
  cp_async_commit();
  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x, buf ^= 1) {
    const ProbeTile t(tile, g);
    if (g.spin) {  // the main loop's time, tensor cores idle
      const long long until = clock64() + g.spin;
      while (clock64() < until) {
      }
    }
    const int next = tile + gridDim.x;
    if (PROBE_AHEAD && next < g.tiles) load_slice(slices[buf ^ 1][warp], r, ProbeTile(next, g), first_px, lane, g);
    if (!PROBE_AHEAD) load_slice(slices[buf][warp], r, t, first_px, lane, g);
    cp_async_commit();
    if (PROBE_AHEAD) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncwarp();
    const int8_t* slice = slices[buf][warp];
    if (PROBE_STORE == 8) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int px = first_px + lane / 4 + 8 * h;
        const size_t row = px < t.valid_px ? t.offset(px, g) + 8 * (lane % 4) : 0;
#pragma unroll
        for (int b = 0; b < PROBE_BLOCKS; ++b) {
          uint2 v = *reinterpret_cast<const uint2*>(slice + (16 * b + lane / 4 + 8 * h) * 32 + 8 * (lane % 4));
          v.x = __vadd4(v.x, 0x01010101u);
          v.y = __vadd4(v.y, 0x01010101u);
          if (px < t.valid_px) *reinterpret_cast<uint2*>(y + row + b * block) = v;
        }
      }
    } else {
      const int px = first_px + lane / 2;
      const size_t row = px < t.valid_px ? t.offset(px, g) + 16 * (lane % 2) : 0;
#pragma unroll
      for (int b = 0; b < PROBE_BLOCKS; ++b) {
        int4 v = *reinterpret_cast<const int4*>(slice + (16 * b + lane / 2) * 32 + 16 * (lane % 2));
        v.x = __vadd4(v.x, 0x01010101u);
        v.y = __vadd4(v.y, 0x01010101u);
        v.z = __vadd4(v.z, 0x01010101u);
        v.w = __vadd4(v.w, 0x01010101u);
        if (px < t.valid_px) *reinterpret_cast<int4*>(y + row + b * block) = v;
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();
}
