// Small elementwise CUDA ops the forward needs between the big kernels (bf16 in/out, fp32 math), and the
// counter-based random fill that builds full-size random models directly in GPU memory.
#pragma once

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace ds::util {

// y[t, i] = bf16( silu(x[t, i]) * x[t, I + i] ) for i < I: the dense SwiGLU on the packed [gate ; up] GEMM output.
// x rows of stride x_stride (>= 2I), y dense [T, I].
struct SiluMulParams {
  const bf16_t* x = nullptr;
  int64_t x_stride = 0;
  bf16_t* y = nullptr;
  int T = 0, I = 0;
};
void silu_mul(const SiluMulParams& p, CUstream_st* stream);

// dst[t, 0:cols] = src[t, col0 : col0 + cols]: a column slice copied into a dense buffer (the KDA f_a / g_a
// slices of the packed projection output, which the low-rank GEMMs need dense).
struct CopyColumnsParams {
  const bf16_t* src = nullptr;
  int64_t src_stride = 0;
  int col0 = 0, cols = 0;
  bf16_t* dst = nullptr;
  int64_t dst_stride = 0;
  int T = 0;
};
void copy_columns(const CopyColumnsParams& p, CUstream_st* stream);

// Random fill, deterministic in (seed, element index) and independent of the launch shape:
//   kNormal   mean + sd * N(0, 1)
//   kUniform  lo + (hi - lo) * U[0, 1)
//   kConst    value
// then an optional map: kLog1p15 -> log(1 + 15 u) (A_log init), kInvSoftplus -> log(expm1(u)) (dt_bias init).
enum class FillDist : uint8_t { kNormal, kUniform, kConst };
enum class FillMap : uint8_t { kNone, kLog1p15, kInvSoftplus };
struct FillParams {
  void* out = nullptr;
  DType dtype = DType::kBF16;  // kBF16 or kF32
  int64_t n = 0;
  uint64_t seed = 0;
  FillDist dist = FillDist::kNormal;
  FillMap map = FillMap::kNone;
  float a = 0.0f, b = 1.0f;    // kNormal: mean, sd; kUniform: lo, hi; kConst: value (a)
};
void fill_random(const FillParams& p, CUstream_st* stream);

}  // namespace ds::util
