// Profiling builds of the wgmma kernel (bench/wgmma_diag.py), never a tactic: each takes one stage of the pipeline
// out, to say which one bounds it. BUILD: 1 = no epilogue (main loop alone), 2 = no wgmma (the copy engine's feed rate
// alone), 3 = no copies (wgmma and the ring's barriers on stale shared memory), 4 / 5 = as 2 with only the weight /
// only the activation boxes; pixel-major only: 6 = no residual loads (the epilogue reads stale slices); any tile:
// 7 = no output stores (the results folded and kept live (pixel-major) or left in the staging tile); pixel-major and
// channel-major ping-pong: 8 = the epilogue alone (no copies, no wgmma: opaque accumulators), 9 = as 8 without residual
// loads or stores (the epilogue's instructions alone); 10 / 11 = no weight copies (the wgmmas read stale weight slots:
// what resident weights would leave) without / with the epilogue; channel-major only: 12 = no copies and no epilogue
// (wgmma and the ring's barriers), 13 = as 12 without the ring (no barrier waits or arrives: the consumers' wgmma
// issue alone, the tile loop's own overheads); 15 = a launch of the tactic's shape doing nothing (what a launch costs
// in a CUDA graph). Included by the generated wgmma_tactic.cuh of a build whose tactic has `diag` set.
#pragma once
#include "conv_epilogue.cuh"

namespace trtfuse {

template <int BUILD>
struct ProfilingBuild {
  static_assert(WgmmaTactic::pixel_major || BUILD < 6 || BUILD >= 10 || BUILD == 7 ||
                    (WgmmaTactic::pingpong && BUILD >= 7),
                "profiling builds 6-9 take the pixel-major epilogue apart (7-9 also the channel-major ping-pong's, 7 any tile's)");
  static constexpr int build = BUILD;
  static constexpr bool timeline = false;
  static constexpr bool no_ring = BUILD == 13;
  static constexpr bool no_copies = BUILD == 3 || BUILD == 8 || BUILD == 9 || BUILD == 12 || no_ring;
  static constexpr bool no_residual_loads = BUILD == 6 || BUILD == 9;
  static constexpr bool no_stores = BUILD == 7 || BUILD == 9;
  static constexpr bool epilogue_alone = BUILD == 8 || BUILD == 9;
  static constexpr bool no_weight_copies = BUILD == 10 || BUILD == 11;
  static constexpr bool no_wgmma = BUILD == 2 || BUILD == 4 || BUILD == 5 || epilogue_alone;
  static constexpr bool empty_launch = BUILD == 15;
  static constexpr bool copies_weights = BUILD != 5, loads_activations = BUILD != 4;
  // the builds that run the epilogue with the layer's residual
  static constexpr bool channel_major_residual = BUILD == 0 || BUILD == 3 || BUILD == 11;
  static constexpr bool pixel_major_residual = BUILD == 0 || BUILD == 3 || BUILD >= 6;
  // Builds that leave the epilogue out keep the accumulators live instead, so the compiler cannot drop the wgmmas
  // that produce them.
  static constexpr bool skips_epilogue = BUILD == 1 || BUILD == 2 || BUILD == 4 || BUILD == 5 || BUILD == 10 || BUILD == 12 || BUILD == 13;
  template <int NACC, class Params>
  __device__ __forceinline__ static void keep_accumulators_live(const int (&acc)[NACC], const Params& p, int tid) {
    int folded = 0;
#pragma unroll
    for (int i = 0; i < NACC; ++i) folded ^= acc[i];
    if (folded == 0x7fffffff) p.y[tid] = 1;
  }
  // The epilogue-alone builds' accumulators: not foldable to constants
  template <int NACC>
  __device__ __forceinline__ static void opaque_accumulators(int (&acc)[NACC]) {
#pragma unroll
    for (int k = 0; k < NACC; ++k) acc[k] = fresh_tid() * k;
  }
  __device__ __forceinline__ static void stamp_entry() {}
  __device__ __forceinline__ static void stamp_window(int, int) {}
  __device__ __forceinline__ static void stamp_tile(int, int, int, int) {}
};

}  // namespace trtfuse
