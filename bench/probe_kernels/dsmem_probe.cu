// Profiling only (bench/dsmem_probe.py), never a tactic: how fast one SM moves data into, or out of, another SM's shared
// memory in its cluster (distributed shared memory, sm_90), against its own shared memory. It decides whether a kernel
// that reduces int32 partial sums across the CTAs of a cluster (a res4 chain: docs/design/chain-conv.md) can pay.
//
// Each CTA of CLUSTER (a define) owns a 64 KB buffer and runs `iters` passes over 64 KB: 256 threads, one 16-byte access
// each per step, 8 steps unrolled (8 accesses in flight a thread). `remote` 1: the buffer of the next CTA in the cluster
// (rank + 1), through mapa's shared::cluster address; 0: its own.
//
// probe_store  every pass writes word (x, rank, it, i) to slot i; the last pass's values are then copied to
//              out[cta][4096] for the host to check (the writer of a buffer is the previous rank).
// probe_load   every pass reads slot (i + it) % 4096 and adds its four words into a per-thread sum; sums[cta][thread]
//              for the host to check against the slots' known contents.
#ifndef CLUSTER
#define CLUSTER 4
#endif

namespace {
constexpr int kSlots = 4096;  // 16-byte slots: 64 KB
constexpr int kThreads = 256;

__device__ __forceinline__ unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of `local` (a shared::cta address) in CTA `rank` of this cluster.
__device__ __forceinline__ unsigned peer_address(unsigned local, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned slot_word(unsigned writer, int it, int i) { return (writer * 131u + it * 7u) ^ (i * 2654435761u); }
}  // namespace

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(kThreads)
probe_store(int iters, int remote, int4* out) {
  extern __shared__ int4 buf[];
  const unsigned rank = cluster_rank();
  const unsigned base = remote ? peer_address(shared_address(buf), (rank + 1) % CLUSTER) : shared_address(buf);
  cluster_barrier();  // every peer's buffer exists before anyone writes to it
  for (int it = 0; it < iters; ++it) {
#pragma unroll 8
    for (int i = threadIdx.x; i < kSlots; i += kThreads) {
      const unsigned w = slot_word(rank, it, i);
      if (remote)
        asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(base + 16 * i), "r"(w), "r"(rank), "r"(it), "r"(i) : "memory");
      else
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(base + 16 * i), "r"(w), "r"(rank), "r"(it), "r"(i) : "memory");
    }
  }
  cluster_barrier();  // the peer's writes to this buffer are done and visible
  for (int i = threadIdx.x; i < kSlots; i += kThreads) out[blockIdx.x * (long long)kSlots + i] = buf[i];
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(kThreads)
probe_load(int iters, int remote, unsigned* sums) {
  extern __shared__ int4 buf[];
  const unsigned rank = cluster_rank();
  for (int i = threadIdx.x; i < kSlots; i += kThreads) buf[i] = make_int4(slot_word(rank, 0, i), rank, 0, i);
  cluster_barrier();  // the peer's buffer is filled before anyone reads it
  const unsigned base = remote ? peer_address(shared_address(buf), (rank + 1) % CLUSTER) : shared_address(buf);
  unsigned sum = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll 8
    for (int i = threadIdx.x; i < kSlots; i += kThreads) {
      unsigned a, b, c, d;
      const unsigned address = base + 16 * ((i + it) % kSlots);
      if (remote)
        asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(address));
      else
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(address));
      sum += a + b + c + d;
    }
  }
  cluster_barrier();  // no CTA leaves while a peer may still read its buffer
  sums[blockIdx.x * kThreads + threadIdx.x] = sum;
}
