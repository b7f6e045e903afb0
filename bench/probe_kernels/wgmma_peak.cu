// Profiling only (bench/wgmma_peak.py), never a tactic: the int8 wgmma issue rate with no copies, no
// barriers and no epilogue, to say how far the conv kernel's main loop (wgmma_conv.cu) is from what the
// tensor cores take from shared memory in the same operand layouts.
//
// PEAK_WGS warpgroups (1 or 2) each issue `iters` batches of 4 wgmma m64n{PEAK_N}k32 s8 on fixed shared
// memory filled with pseudo-random bytes (the tensor cores' power, hence the clock, depends on the data),
// one batch in flight (commit, wait_group 1), as the conv kernel does. With PEAK_CHAINS 2 a batch is 4 k32 steps on
// each of two independent accumulators, alternating (does one warpgroup's dependent chain, not N, set the rate?).
// With PEAK_RS 1 operand A comes from registers (mma_rs: PEAK_RS_KT k32 steps loaded once from the A chunk, cycled
// through), as a weight held in registers would be. Operand A is 64 rows x 128 bytes
// per warpgroup, 128-byte swizzle (the conv kernel's weight chunk). Operand B (PEAK_N rows) is:
//   PEAK_B 0: 32-byte rows, 32-byte swizzle, each k32 step its own 256-byte-aligned tile (row boxes)
//   PEAK_B 1: 32-byte rows, 32-byte swizzle, k32 step j a view of one window from row PEAK_SHIFT(j)
//             (the halo windows' 3x3 taps of a 30-wide window: rows 0, 1, 2, 30, 31, 32, 60, 61, 62)
//   PEAK_B 2: 128-byte rows, 128-byte swizzle, k32 step j at byte 32 j of the row (4 channel blocks a row)
//   PEAK_B 3: 64-byte rows, 64-byte swizzle, k32 step j the stride-2 windows' tap (r, s) = (j / 3 % 3, j % 3) view: from
//             byte 32 + 32 s of row PEAK_PITCH r (the second half of a pair row, or the first half of the next); a pitch
//             that is not a multiple of 8 rows starts the views off the 512-byte swizzle atom (w74 / w88's 29 pairs)
#include "sm90_primitives.cuh"
#include "wgmma_s8.cuh"

#ifndef PEAK_N
#define PEAK_N 208
#endif
#ifndef PEAK_WGS
#define PEAK_WGS 2
#endif
#ifndef PEAK_B
#define PEAK_B 0
#endif
// PEAK_TURN 1 (two warpgroups): they take the tensor cores in turns of PEAK_RS_KT / 4 batches (36 k32 steps: a 3x3
// conv tile), handing over by named barriers as the conv kernel's ping-pong tiles do (does the hand-over cost time?)
#ifndef PEAK_TURN
#define PEAK_TURN 0
#endif
#ifndef PEAK_PITCH
#define PEAK_PITCH 32
#endif
#ifndef PEAK_CHAINS
#define PEAK_CHAINS 1
#endif
#ifndef PEAK_RS
#define PEAK_RS 0
#endif
#ifndef PEAK_RS_KT
#define PEAK_RS_KT 4  // PEAK_RS: k32 steps of A held in registers, cycled through (36: a 3x3 conv's whole weight, 144 registers)
#endif

using namespace trtfuse;

constexpr int kARegion = 64 * 128;                     // one warpgroup's A chunk
constexpr int kBRows = PEAK_N + 64;                    // room for the window views' shifts
constexpr int kBRegion = PEAK_B == 2 ? PEAK_N * 128 : PEAK_B == 3 ? (PEAK_N + 2 * PEAK_PITCH + 2) * 64 : 4 * kBRows * 32;
constexpr int kSmemBytes = PEAK_WGS * kARegion + kBRegion;

__device__ __forceinline__ uint32_t b_tile(uint32_t b0, int step) {
  if (PEAK_B == 0) return b0 + (step % 4) * kBRows * 32;
  if (PEAK_B == 1) {
    const int tap = step % 9;
    return b0 + ((tap / 3) * 30 + tap % 3) * 32;
  }
  if (PEAK_B == 3) {
    const int tap = step % 9;
    return b0 + (tap / 3) * PEAK_PITCH * 64 + 32 + 32 * (tap % 3);
  }
  return b0 + (step % 4) * 32;
}

extern "C" __global__ void __launch_bounds__(128 * PEAK_WGS, 1) wgmma_peak(int iters, int* out, long long* clocks) {
  extern __shared__ __align__(1024) int8_t smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  int8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t base = sm90::smem_addr(smem);
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += blockDim.x) {
    uint32_t h = (i + 1) * 2654435761u ^ blockIdx.x * 40503u;
    h ^= h >> 15;
    reinterpret_cast<uint32_t*>(smem)[i] = h * 2246822519u;
  }
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const uint32_t a0 = base + wg * kARegion, b0 = base + PEAK_WGS * kARegion;
  const long long t0 = clock64();
  long long g0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  int acc[PEAK_CHAINS][PEAK_N / 2];
#pragma unroll
  for (int c = 0; c < PEAK_CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < PEAK_N / 2; ++i) acc[c][i] = 0;
  uint32_t a_regs[PEAK_RS ? PEAK_RS_KT : 1][4];  // PEAK_RS: thread t's A fragment of k32 step j (mma_rs's layout), read once
  {
    const int t = threadIdx.x % 128, row = 16 * (t / 32) + (t % 32) / 4;
#pragma unroll
    for (int j = 0; j < (PEAK_RS ? PEAK_RS_KT : 1); ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        a_regs[j][i] = *reinterpret_cast<const uint32_t*>(smem + wg * kARegion + (row + 8 * (i % 2)) * 128 + 32 * (j % 4) + 4 * (t % 4) + 16 * (i / 2)) + j;
  }
  static_assert(PEAK_RS_KT % 4 == 0, "whole batches");
  static_assert(PEAK_TURN == 0 || PEAK_WGS == 2, "turns take two warpgroups");
  int step = 0;
  const int batches = (iters + PEAK_RS_KT / 4 - 1) / (PEAK_RS_KT / 4) * (PEAK_RS_KT / 4);
#pragma unroll 1
  for (int it0 = 0; it0 < iters; it0 += PEAK_RS_KT / 4) {
  if (PEAK_TURN && (wg == 1 || it0 > 0)) sm90::named_barrier(1 + wg, 256);
#pragma unroll
  for (int it = it0; it < it0 + PEAK_RS_KT / 4; ++it) {
    sm90::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j, ++step) {
      const uint64_t db = PEAK_B == 2   ? sm90::desc_kmajor_sw128(b_tile(b0, step))
                          : PEAK_B == 3 ? sm90::desc_kmajor_sw64(b_tile(b0, step))
                                        : sm90::desc_kmajor_sw32(b_tile(b0, step));
#pragma unroll
      for (int c = 0; c < PEAK_CHAINS; ++c) {
        if (PEAK_RS)
          sm90::WgmmaS8<PEAK_N>::mma_rs(acc[c], a_regs[((it - it0) * 4 + j) % (PEAK_RS ? PEAK_RS_KT : 1)], db, true);
        else
          sm90::WgmmaS8<PEAK_N>::mma(acc[c], sm90::desc_kmajor_sw128(a0 + j * 32), db, true);
      }
    }
    sm90::wgmma_commit();
    if (PEAK_TURN && it == it0 + PEAK_RS_KT / 4 - 1 && (wg == 0 || it + 1 < batches)) sm90::named_barrier_arrive(2 - wg, 256);
    sm90::wgmma_wait<1>();
  }
  }
  sm90::wgmma_wait<0>();
  int folded = 0;
#pragma unroll
  for (int c = 0; c < PEAK_CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < PEAK_N / 2; ++i) folded ^= acc[c][i];
  if (folded == 0x7fffffff) out[threadIdx.x] = folded;
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    long long g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    clocks[0] = clock64() - t0;
    clocks[1] = g1 - g0;
  }
}
