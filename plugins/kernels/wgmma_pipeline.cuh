// The mbarrier rings' bookkeeping, in one place (CUTLASS's PipelineState): a ring of STAGES slots is used in order,
// use u filling slot u % STAGES in round u / STAGES; an mbarrier's phase parity flips once per round, so a wait for a
// slot's round compares against the round's parity, and the producer's wait for a free slot against the opposite one
// (round 0 finds every slot free).
#pragma once
#include "sm90_primitives.cuh"

namespace trtfuse {

template <int STAGES>
struct PipelineState {
  int count;  // uses of the ring so far: continuous across a persistent CTA's tiles, the same sequence on both sides
  __device__ __forceinline__ int index() const { return count % STAGES; }
  __device__ __forceinline__ int phase() const { return (count / STAGES) & 1; }
  __device__ __forceinline__ PipelineState previous() const { return {count - 1}; }
  __device__ __forceinline__ PipelineState& operator++() {
    ++count;
    return *this;
  }
};

// The full[STAGES] and empty[STAGES] mbarriers of a ring, 8 bytes apart: the copy engine's bytes complete a slot's
// "full" barrier, the consumer warps' arrivals its "empty" one.
template <int STAGES>
struct MbarrierRing {
  uint32_t full0, empty0;
  using State = PipelineState<STAGES>;
  __device__ __forceinline__ uint32_t full(State s) const { return full0 + 8 * s.index(); }
  __device__ __forceinline__ uint32_t empty(State s) const { return empty0 + 8 * s.index(); }
  __device__ __forceinline__ void wait_full(State s) const { sm90::mbar_wait(full(s), s.phase()); }
  __device__ __forceinline__ bool test_full(State s) const { return sm90::mbar_test(full(s), s.phase()); }
  __device__ __forceinline__ void wait_empty(State s) const { sm90::mbar_wait(empty(s), s.phase() ^ 1); }
};

}  // namespace trtfuse
