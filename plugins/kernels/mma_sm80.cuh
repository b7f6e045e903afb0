// Warp-level primitives: cp.async (global -> shared), ldmatrix (shared -> registers) and the int8
// tensor-core MMA m16n8k32 (sm_80+). Thin wrappers so the kernel reads as a GEMM, not as asm.
#pragma once
#include "int_types.cuh"

namespace trtfuse {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination (padding, out-of-range rows).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D = A(16x32 s8, row) * B(32x8 s8, col) + D, s32 accumulators.
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Shared tiles are rows of 64 bytes (BK = 64 int8) = four 16-byte chunks. ldmatrix reads 8 rows of
// one chunk column at a time; XOR-ing the chunk with bits 1..2 of the row puts those 8 rows in 8
// distinct 16-byte bank groups (rows r and r+2 would otherwise share banks: 2 * 64 B = 128 B).
__device__ __forceinline__ int swizzle_64B(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// The B (weight) tile is read by ldmatrix in the channel order WarpMma uses (rows 16j + 4m + 2b + e
// form matrix b: see WarpMma), so its 8 rows are pairs {4m, 4m+1} (m = 0..3) of a 16-row group;
// XOR-ing the chunk with bits 2..3 of the row puts them in 8 distinct 16-byte bank groups.
__device__ __forceinline__ int swizzle_64B_b(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 2) & 3)) << 4); }

}  // namespace trtfuse
