// The timeline build of the channel-major ping-pong tile (bench/wgmma_timeline.py), with any profiling build: each
// warpgroup's thread 0 writes the SM clock at six points of each of its tiles into trtfuse_timeline, the window ring's
// issue / sighting clocks go into trtfuse_windows, and each CTA's first clock into trtfuse_entry; the bench reads them
// back by name. Included by the generated wgmma_tactic.cuh of a build whose tactic has `timeline` set.
#pragma once
#include "wgmma_profiling.cuh"

constexpr int kTimelineCtas = 160, kTimelineTiles = 16, kTimelinePoints = 6, kTimelineUses = 64, kWindowPoints = 4;
extern "C" {
__device__ unsigned long long trtfuse_timeline[kTimelineCtas * 2 * kTimelineTiles * kTimelinePoints];
__device__ unsigned long long trtfuse_windows[kTimelineCtas * kTimelineUses * kWindowPoints];  // per window use: see stamp_window
__device__ unsigned long long trtfuse_entry[kTimelineCtas];  // the CTA's first clock (its start, before the barriers' init)
}

namespace trtfuse {

template <int BUILD>
struct TimelineBuild : ProfilingBuild<BUILD> {
  static_assert(WgmmaTactic::pingpong && !WgmmaTactic::pixel_major, "the timeline build is the channel-major ping-pong's");
  static constexpr bool timeline = true;
  __device__ __forceinline__ static void stamp_entry() {
    if (threadIdx.x == 0 && blockIdx.x < kTimelineCtas) trtfuse_entry[blockIdx.x] = clock64();
  }
  // window ring use `use` of this CTA: point 0 issued by the producer, 1 seen landed by a consumer, 2 given back by the
  // consumer (its warp 0), 3 the producer starts waiting for its slot
  __device__ __forceinline__ static void stamp_window(int use, int point) {
    if (blockIdx.x < kTimelineCtas && use < kTimelineUses)
      trtfuse_windows[(blockIdx.x * kTimelineUses + use) * kWindowPoints + point] = clock64();
  }
  // point j of the CTA's tile i, taken by warpgroup wg (its thread ct == 0): 0 ready, 1 turn, 2 first windows,
  // 3 issued, 4 drained, 5 stored
  __device__ __forceinline__ static void stamp_tile(int ct, int wg, int i, int j) {
    if (ct == 0 && blockIdx.x < kTimelineCtas && i / 2 < kTimelineTiles)
      trtfuse_timeline[((blockIdx.x * 2 + wg) * kTimelineTiles + i / 2) * kTimelinePoints + j] = clock64();
  }
};

}  // namespace trtfuse
