// Warp-level tensor-core helpers shared by the MLA attention kernels: cp.async, ldmatrix, mma.sync m16n8k16 bf16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ds::mla::dev {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination (rows past the context), so
// masked rows hold zeros, never stale values that could be NaN.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16x16, row) * b (16x8, col), fp32 accumulators. Fragment layout (PTX ISA): c[0..1] at row lane/4,
// columns 2*(lane%4) + {0,1}; c[2..3] at row lane/4 + 8.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Address of the A-fragment row a lane supplies to ldmatrix_x4 for a 16x16 tile at (row0, col0) of a row-major
// [rows][pitch] bf16 array: lanes 0-15 rows 0-15 at col0, lanes 16-31 rows 0-15 at col0 + 8.
__device__ __forceinline__ const __nv_bfloat16* a_frag_ptr(const __nv_bfloat16* base, int pitch, int row0, int col0,
                                                          int lane) {
  return base + (row0 + (lane & 15)) * pitch + col0 + (lane >> 4) * 8;
}
// B fragments of two adjacent n-tiles (n0..n0+15) x k16 from a [n][k] array (keys stored by row):
// matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15) -> b[0],b[1] for n-tile 0, b[2],b[3] for n-tile 1.
__device__ __forceinline__ const __nv_bfloat16* b_frag_ptr(const __nv_bfloat16* base, int pitch, int n0, int k0,
                                                          int lane) {
  return base + (n0 + (lane & 7) + (lane >> 4) * 8) * pitch + k0 + ((lane >> 3) & 1) * 8;
}
// B fragments of two adjacent n-tiles from a [k][n] array (values stored by key row), for ldmatrix_x4_trans.
__device__ __forceinline__ const __nv_bfloat16* bt_frag_ptr(const __nv_bfloat16* base, int pitch, int k0, int n0,
                                                           int lane) {
  return base + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8;
}

}  // namespace ds::mla::dev
