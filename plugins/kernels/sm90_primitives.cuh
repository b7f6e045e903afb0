// Hopper (sm_90a) primitives of the wgmma conv kernel (wgmma_conv.cu): mbarriers, the bulk tensor
// copy engine (TMA), async-proxy fences, register reallocation and the wgmma shared-memory matrix
// descriptor. Thin wrappers over PTX so the kernel reads as a pipeline, not as asm.
#pragma once
#include "int_types.cuh"

namespace trtfuse {
namespace sm90 {

// A CUtensorMap as the kernel receives it: 128 opaque bytes, 64-byte aligned, passed by value as a
// `const __grid_constant__` parameter (NVRTC has no cuda.h; the host encodes it with
// cuTensorMapEncodeTiled, plugins/wgmma.py).
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (shared::cta, 8 bytes) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Make the initialised barriers visible to the async proxy (the copy engine completes on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with this parity has completed (a fresh barrier counts phase "parity 1" as done).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Whether the phase with this parity has completed, without waiting (mbarrier.test_wait)
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// ---- fences ----
// Generic-proxy shared-memory writes that the async proxy (TMA, wgmma) reads next.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- TMA: global -> shared, completion counted in bytes on an mbarrier ----
__device__ __forceinline__ void prefetch_tensor_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}

// The same box written at the same offset into the shared memory of every CTA of the cluster in
// `cta_mask`, completing bytes on the mbarrier at the same offset in each of them.
__device__ __forceinline__ void tma_load_5d_multicast(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1,
                                                      int c2, int c3, int c4, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar), "h"(cta_mask)
      : "memory");
}

// ---- TMA: shared -> global (bulk groups); elements outside the tensor are not written ----
__device__ __forceinline__ void tma_store_5d(const TensorMap* map, uint32_t src, int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
      ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The committed bulk stores have read their shared memory (it may be rewritten) / have completed.
__device__ __forceinline__ void bulk_wait_group_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_group_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- clusters ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster: arrive (release) then wait (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrive on the mbarrier at local shared address `bar` of cluster CTA `cta` (possibly this one).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
      ::"r"(bar), "r"(cta)
      : "memory");
}

// ---- programmatic dependent launch (a launch with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) ----
// The next grid in the stream may be scheduled once every CTA of this one has said so (or exited); its CTAs then take
// SMs as this grid's CTAs leave them, so a grid whose CTAs are all resident loses nothing by saying it at once.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// Waits until the grids this one depends on have completed and their memory is visible: before the first read of
// anything they write (activations, residual) and the first write of anything they may still read (the output).
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// ---- register reallocation between warpgroups (needs __launch_bounds__(threads, 1)) ----
template <int REGS>
__device__ __forceinline__ void regs_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// ---- named barrier over a subset of warps (id 0 is __syncthreads) ----
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrive without waiting: counts toward `threads` of a barrier other warps bar.sync on (a token handed on).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ordering ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Shared-memory matrix descriptor of a K-major operand tile as a TMA box with a swizzle writes it:
// start address >> 4 in bits 0-13; leading byte offset (unused for swizzled K-major) = 1; stride byte
// offset (bytes between 8-row core-matrix groups) >> 4 in bits 32-45; base offset 0 (tiles start aligned
// to the swizzle pattern); layout type in bits 62-63.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t smem_byte_addr, uint32_t group_bytes, uint64_t layout) {
  return (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(group_bytes >> 4) << 32 |
         layout << 62;
}
// Dense 32-byte rows, CU_TENSOR_MAP_SWIZZLE_32B (one k32 step of s8 is exactly the swizzle width):
// 8 rows x 32 B = 256 B per group, layout type 3.
__device__ __forceinline__ uint64_t desc_kmajor_sw32(uint32_t smem_byte_addr) { return desc_kmajor(smem_byte_addr, 256, 3); }
// Rows of 64 bytes, CU_TENSOR_MAP_SWIZZLE_64B: 8 rows x 64 B = 512 B per group, layout type 2 (the stride-2 windows'
// pair rows; their k32 step is the descriptor of (row + 32 h), as below).
__device__ __forceinline__ uint64_t desc_kmajor_sw64(uint32_t smem_byte_addr) { return desc_kmajor(smem_byte_addr, 512, 2); }
// Rows of 128 bytes, CU_TENSOR_MAP_SWIZZLE_128B (tile 1024-byte aligned): 1024 B per group, layout type
// 1. The k32 step j of such a tile is the descriptor of (tile + 32 j): the hardware applies the swizzle to
// the full address, as for any K offset inside one swizzle atom.
__device__ __forceinline__ uint64_t desc_kmajor_sw128(uint32_t smem_byte_addr) { return desc_kmajor(smem_byte_addr, 1024, 1); }
// No swizzle (layout type 0): core matrices of 8 rows x 16 bytes, each 128 contiguous bytes; the leading byte offset
// is the distance between a k32 step's two 16-byte K halves, the stride byte offset between 8-row groups.
__device__ __forceinline__ uint64_t desc_kmajor_interleave(uint32_t smem_byte_addr, uint32_t k_half_bytes, uint32_t group_bytes) {
  return (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t)(k_half_bytes >> 4) << 16 | (uint64_t)(group_bytes >> 4) << 32;
}

}  // namespace sm90
}  // namespace trtfuse
