// Device helpers of the MoE kernels: mma.sync wrappers, vector loads, bf16/e4m3 conversions that mirror
// core/dtype.h's rounding (RNE, e4m3 saturating to +-448), and the SwiGLU activation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "kernels/common/pdl.cuh"
#include "kernels/moe/moe_cuda_check.h"
#include "kernels/moe/moe_bits.h"

namespace ds::moe::detail {

inline constexpr float kE4M3MaxF = 448.0f;

// ---- tensor-core MMAs (sm_80+ bf16; sm_89+ e4m3), fp32 accumulate in place
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- loads: weights are streamed once (no L1 allocation); activations are re-read by many warps (L1) and are a
// predecessor's output, so they take the coherent path (pdl::load_prior), never .nc.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_act(const void* p) { return ::ds::pdl::load_prior(static_cast<const uint4*>(p)); }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// ---- conversions
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_bf16_bits(lo)) | (static_cast<uint32_t>(f32_to_bf16_bits(hi)) << 16);
}
// RNE, finite values beyond +-448 and +-inf saturate to +-448, NaN -> NaN: core/dtype.h's f32_to_e4m3.
__device__ __forceinline__ uint8_t f32_to_e4m3_sat(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
// bf16x2 with both halves = 2^p (p in [-133, 127]: bf16 subnormals below -126).
__device__ __forceinline__ uint32_t bf16x2_pow2(int p) {
  const uint32_t h = p >= -126 ? static_cast<uint32_t>(p + 127) << 7 : (1u << (p + 133));
  return h | (h << 16);
}

// ---- programmatic dependent launch (sm_90): every MoE kernel may start while its predecessor finishes.
// pdl_wait() returns once the preceding grid has completed and its writes are visible; each kernel calls it
// before reading anything the previous kernel wrote, then pdl_trigger() lets the next kernel get scheduled.
// Both are no-ops for a launch without the attribute.
__device__ __forceinline__ void pdl_wait() { ::ds::pdl::wait(); }
__device__ __forceinline__ void pdl_trigger() { ::ds::pdl::launch_dependents(); }

template <class... KArgs, class... Args>
void launch(bool use_pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
  MOE_CUDA_CHECK(::ds::pdl::launch(use_pdl, kernel, grid, block, smem, s, std::forward<Args>(args)...));
}

// SwiGLU's gate activation with the reference's formula (x / (1 + e^-x), accurate expf).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// The same on the MUFU exp and a fast division (a few ulp): the FP8 prefill GEMMs' epilogue, where expf and the
// IEEE division (with its slow-path branch) made up most of the 128-row kernel's epilogue, ~30 % of its consumer
// time at T = 16,384 (ncu, docs/perf-moe.md run 14). h is quantised to e4m3 right after, 3 mantissa bits.
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// Eight columns [col, col + 8) of the finalize of token t: out = sum_k w[t,k] * y[t,k] (k ascending, routes with
// e2p >= 0 only) + shared + residual, fp32, one bf16 rounding. The one definition of that arithmetic, used by
// finalize_kernel and by the stream GEMM2's fused finalize (bitwise equal results). kL2: y and shared were
// written by other CTAs of the running kernel, so they are read through L2 (not the non-coherent path); the rest
// comes from earlier kernels (pdl::load_prior). residual is read before out is written by the same thread (out may
// alias it).
template <bool kL2>
__device__ __forceinline__ void finalize8(const bf16_t* y, const int32_t* e2p, const float* w, const bf16_t* shared,
                                          const bf16_t* residual, int t, int K, int D, int col, bf16_t* out) {
  float acc[8] = {};
  for (int k = 0; k < K; ++k) {
    const size_t tk = static_cast<size_t>(t) * K + k;
    if (::ds::pdl::load_prior(e2p + tk) < 0) continue;
    const float wk = ::ds::pdl::load_prior(w + tk);
    const uint4* src = reinterpret_cast<const uint4*>(y + tk * D + col);
    const uint4 v = kL2 ? __ldcg(src) : ld_act(src);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] += wk * bf16_lo(word(v, i));
      acc[2 * i + 1] += wk * bf16_hi(word(v, i));
    }
  }
  const size_t row = static_cast<size_t>(t) * D + col;
  const bf16_t* adds[2] = {shared, residual};
  for (int a = 0; a < 2; ++a) {
    const bf16_t* add = adds[a];
    if (!add) continue;
    const uint4* src = reinterpret_cast<const uint4*>(add + row);
    const uint4 v = kL2 && a == 0 ? __ldcg(src) : ::ds::pdl::load_prior(src);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] += bf16_lo(word(v, i));
      acc[2 * i + 1] += bf16_hi(word(v, i));
    }
  }
  uint4 o;
  o.x = pack_bf16x2(acc[0], acc[1]);
  o.y = pack_bf16x2(acc[2], acc[3]);
  o.z = pack_bf16x2(acc[4], acc[5]);
  o.w = pack_bf16x2(acc[6], acc[7]);
  *reinterpret_cast<uint4*>(out + row) = o;
}

__device__ __forceinline__ float warp_max(float v, int width = 32) {
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace ds::moe::detail
