// Device helpers shared by the KDA kernels: bf16 vector loads, activations, warp reductions, ldmatrix /
// mma.sync (m16n8k16 bf16 -> fp32), cp.async, bulk copies on mbarriers and thread-block-cluster barriers (sm_90).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/math_constants.h"
#include "kernels/common/mbarrier.cuh"

namespace ds::kda::dev {

using bf16 = __nv_bfloat16;

// ---- activations (fp32) -----------------------------------------------------------------------------
// MUFU exp2 / log2 / reciprocal with denormals flushed: the non-ftz forms (__expf, __logf, __fdividef in a build
// without --use_fast_math) add a range check and two fix-up multiplies to every call, ~3 of the prefill conv/gate
// phase's ~10 instructions per activation. Flushing only changes results below 2^-126.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2_ftz(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {  // rcp(inf) = 0
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp_fast(float x) { return ex2_ftz(x * kLog2e); }
__device__ __forceinline__ float log_fast(float x) { return lg2_ftz(x) * 0.693147180559945309f; }
// 1 / (1 + e^-z) -> 0 as z -> -inf (the reciprocal of inf is 0).
__device__ __forceinline__ float sigmoidf_(float z) { return rcp_ftz(1.0f + exp_fast(-z)); }
__device__ __forceinline__ float siluf_(float z) { return z * sigmoidf_(z); }
// z sigmoid(z) = z/2 (1 + tanh(z/2)): one MUFU op (tanh.approx, relative error ~2^-11) instead of two.
__device__ __forceinline__ float silu_tanh(float z) {
  const float h = 0.5f * z;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
  return fmaf(h, t, h);
}
// PyTorch softplus (beta 1, threshold 20) on the MUFU log and exp: log(1 + e^z) to ~2e-7 absolute (below
// z = -15 it is e^z to fp32 precision), where log1pf costs ~25 instructions (the prefill's conv/gate phase).
// Both MUFU ops run for every z and a select picks the result: a conditional log compiled to a branch per value,
// which kept the prefill's 16 softplus of a pass from interleaving (e = inf past z ~ 88 is never selected).
__device__ __forceinline__ float softplusf_(float z) {
  const float e = exp_fast(z);
  const float l = log_fast(1.0f + e);
  return z > 20.0f ? z : z < -15.0f ? e : l;
}
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// ---- 4 consecutive bf16 (8 bytes) <-> float4 ---------------------------------------------------------
// bf16 -> fp32 is exact: the low half shifted up, the high half masked, one integer op per value
// (__bfloat1622float2 compiles the high half to a PRMT and a shift: ~50 extra instructions per pass of the prefill's
// conv phase).
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
__device__ __forceinline__ float4 bf16x4_to_float4(uint2 r) {
  const float2 a = unpack_bf16x2(r.x), b = unpack_bf16x2(r.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load_bf16x4(const bf16* p) {
  return bf16x4_to_float4(*reinterpret_cast<const uint2*>(p));
}
// Read-only global data (the compiler may then move the load across shared-memory stores).
__device__ __forceinline__ float4 ldg_bf16x4(const bf16* p) {
  return bf16x4_to_float4(__ldg(reinterpret_cast<const uint2*>(p)));
}
__device__ __forceinline__ void store_bf16x4(bf16* p, float4 v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 r;
  r.x = *reinterpret_cast<uint32_t*>(&a);
  r.y = *reinterpret_cast<uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = r;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo -> low 16 bits (lower column index in mma)
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---- warp reductions -----------------------------------------------------------------------------------
template <int kFirst, int kLast>  // xor-butterfly over lane bits kFirst..kLast (masks 1<<kFirst .. 1<<kLast)
__device__ __forceinline__ float xor_sum(float v) {
#pragma unroll
  for (int b = kFirst; b <= kLast; ++b) v += __shfl_xor_sync(0xffffffffu, v, 1 << b);
  return v;
}
template <int kFirst, int kLast>
__device__ __forceinline__ float xor_max(float v) {
#pragma unroll
  for (int b = kFirst; b <= kLast; ++b) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1 << b));
  return v;
}

// ---- tensor cores: ldmatrix + mma.sync m16n8k16 (bf16 in, fp32 accumulate) ----------------------------
// Fragment layouts (g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (row g, cols 2t,2t+1), a1 (row g+8, same cols), a2 (row g, cols 2t+8,+9), a3 (g+8, +8)
//   B 16x8  (k x n):   b0 (k 2t,2t+1, n g),  b1 (k 2t+8,2t+9, n g)
//   C 16x8  fp32:      c0,c1 (row g, cols 2t,2t+1),  c2,c3 (row g+8, same cols)
// x4 loads: lane l gives the row address of matrix l/8; the per-lane address for a 16x16 tile at (r0, c0) of
// a row-major array is (r0 + (l & 7) + ((l >> 3) & 1) * 8, c0 + (l >> 4) * 8) -> matrices (rows 0-7, cols
// 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
using ::ds::mbar::smem_u32;  // a generic pointer into shared memory as a 32-bit shared address
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// tf32 m16n8k8 (A row-major 16x8: a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); B 8x8: b0 (t, g) b1 (t+4, g)).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// x = hi + lo: a product through hi*hi + hi*lo + lo*hi (3xTF32) keeps ~fp32 accuracy. hi is x rounded to tf32
// (half away from zero, as cvt.rna, by integer add and mask: finite x only); lo = x - hi (exact) is passed as
// fp32 bits: the tensor core reads a tf32 operand's top 19 bits, so lo is truncated there, an error of at most
// 2^-10 |lo| <= 2^-21 |x|. cvt.rna.tf32.f32 is not one instruction on sm_90 (range check, add, select, mask):
// two of them per split were a fifth of the Akk/Aqk phase's instructions.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
// acc += A B in ~fp32 accuracy from A and B already split into tf32 hi + lo (split_tf32), the small products first:
// for an A operand shared by several products (the prefill's diagonal blocks split each factor once).
__device__ __forceinline__ void mma3_tf32_split(float (&acc)[4], const uint32_t (&ahi)[4], const uint32_t (&alo)[4],
                                                uint32_t bhi0, uint32_t bhi1, uint32_t blo0, uint32_t blo1) {
  mma_tf32(acc, alo, bhi0, bhi1);
  mma_tf32(acc, ahi, blo0, blo1);
  mma_tf32(acc, ahi, bhi0, bhi1);
}
// acc += A B in ~fp32 accuracy: A (16x8, mma_tf32's layout) and B (8x8: b0, b1) split into tf32 hi + lo. The three
// products accumulate separately (value(e) sums them), so a loop over k runs three independent mma chains instead
// of one three times as long: the prefill's blocked inverse is a latency chain of these.
struct Mma3Acc {
  float hh[4] = {}, hl[4] = {}, lh[4] = {};
  __device__ __forceinline__ float value(int e) const { return hh[e] + (hl[e] + lh[e]); }
};
__device__ __forceinline__ void mma3_tf32(Mma3Acc& acc, const float (&a)[4], float b0, float b1) {
  uint32_t ah[4], al[4], bh0, bl0, bh1, bl1;
#pragma unroll
  for (int e = 0; e < 4; ++e) split_tf32(a[e], ah[e], al[e]);
  split_tf32(b0, bh0, bl0);
  split_tf32(b1, bh1, bl1);
  mma_tf32(acc.lh, al, bh0, bh1);
  mma_tf32(acc.hl, ah, bl0, bl1);
  mma_tf32(acc.hh, ah, bh0, bh1);
}
// Per-lane address offsets of the x4 pattern above.
__device__ __forceinline__ int ldsm_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int ldsm_col(int lane) { return (lane >> 4) * 8; }

// ---- cp.async (16-byte, L2 only) -------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>  // wait until at most kPending of this thread's cp.async groups are still in flight
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- bulk copies (the TMA unit, sm_90) on shared-memory mbarriers: kernels/common/mbarrier.cuh ------------
using ::ds::mbar::bulk_copy_g2s;
using ::ds::mbar::mbar_arrive;
using ::ds::mbar::mbar_arrive_expect_tx;
using ::ds::mbar::mbar_fence_init;
using ::ds::mbar::mbar_init;
using ::ds::mbar::mbar_wait;

// ---- thread-block clusters (sm_90): split arrive/wait so independent work can hide the barrier ----------
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// Reads a float from the shared memory of CTA `rank` of this cluster at the address of `p` in ours.
__device__ __forceinline__ float ld_cluster_f32(const float* p, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(p)), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace ds::kda::dev
