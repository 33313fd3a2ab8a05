// Small elementwise CUDA ops the forward needs between the big kernels (bf16 in/out, fp32 math), and the
// counter-based random fill that builds full-size random models directly in GPU memory. CPU definitions:
// util_ref.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace ds::util {

// y[t, i] = bf16( silu(x[t, i]) * x[t, I + i] ) for i < I: the dense SwiGLU on the packed [gate ; up] GEMM output.
// x rows of stride x_stride (>= 2I), y rows of stride y_stride (0 = dense, I). fp32 math, one rounding.
// 16-byte vectors when I, both strides and both pointers allow it; any shape and alignment works.
struct SiluMulParams {
  const bf16_t* x = nullptr;
  int64_t x_stride = 0;
  bf16_t* y = nullptr;
  int T = 0, I = 0;
  int64_t y_stride = 0;
};
void silu_mul(const SiluMulParams& p, CUstream_st* stream);

// dst[t, 0:cols] = src[t, col0 : col0 + cols]: a column slice copied into a dense buffer (the KDA f_a / g_a
// slices of the packed projection output, which the low-rank GEMMs need dense). dst_stride >= cols.
struct CopyColumnsParams {
  const bf16_t* src = nullptr;
  int64_t src_stride = 0;
  int col0 = 0, cols = 0;
  bf16_t* dst = nullptr;
  int64_t dst_stride = 0;
  int T = 0;
};
void copy_columns(const CopyColumnsParams& p, CUstream_st* stream);

// Random fill, deterministic in (seed, element index) and independent of the launch shape: element i draws
// Philox4x32-10(counter = i, key = seed) and uses words x, y only:
//   kNormal   mean + sd * sqrt(-2 ln u1) cos(2 pi u2)   u1 = (x>>8 + 1) 2^-24 in (0, 1], u2 = (y>>8) 2^-24
//   kUniform  lo + (hi - lo) * u                        u = (x>>8) 2^-24 in [0, 1)
//   kConst    value
// then an optional map: kLog1p15 -> log(1 + 15 u) (A_log init), kInvSoftplus -> log(expm1(u)) (dt_bias init),
// applied to the drawn value. fp32 math, rounded once to the output dtype. fill_value_ref() is the definition.
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
  int grid = 0;                // blocks; 0 = heuristic (tests force shapes to show the values do not depend on it)
};
void fill_random(const FillParams& p, CUstream_st* stream);

}  // namespace ds::util
