// The production kernel's profiling hooks: none. Every flag is off, so each hook's branch folds away; the profiling
// builds (bench/wgmma_diag.py, bench/wgmma_timeline.py) include bench/probe_kernels/wgmma_profiling.cuh / wgmma_timeline.cuh instead.
#pragma once

namespace trtfuse {

struct WgmmaProfiling {
  static constexpr int build = 0;
  static constexpr bool timeline = false;
  static constexpr bool no_ring = false, no_copies = false, no_weight_copies = false, no_wgmma = false;
  static constexpr bool no_residual_loads = false, no_stores = false, epilogue_alone = false, skips_epilogue = false;
  static constexpr bool empty_launch = false;
  static constexpr bool copies_weights = true, loads_activations = true;
  static constexpr bool channel_major_residual = true, pixel_major_residual = true;
  template <int NACC, class Params>
  __device__ __forceinline__ static void keep_accumulators_live(const int (&)[NACC], const Params&, int) {}
  template <int NACC>
  __device__ __forceinline__ static void opaque_accumulators(int (&)[NACC]) {}
  __device__ __forceinline__ static void stamp_entry() {}
  __device__ __forceinline__ static void stamp_window(int, int) {}
  __device__ __forceinline__ static void stamp_tile(int, int, int, int) {}
};

}  // namespace trtfuse
