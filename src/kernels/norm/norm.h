// RMSNorm CUDA ops (bf16 in/out, fp32 math): plain, and fused with the residual add of the layer boundary.
// Definitions and rounding contract: norm_ref.h (y = w * (x * rsqrt(mean(x^2) + eps)), rounded once to bf16).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"

struct CUstream_st;

namespace ds::norm {

inline constexpr int kMaxDim = 8192;  // 256 threads x 4 vectors of 8 values held in registers

struct RmsNormParams {
  const bf16_t* x = nullptr;  // [T, D] rows of stride x_stride (elements)
  int64_t x_stride = 0;
  const bf16_t* w = nullptr;  // [D]
  bf16_t* y = nullptr;        // [T, D] dense (may alias x when x_stride == D)
  int T = 0, D = 0;
  float eps = 1e-5f;
};

// residual <- bf16(residual + x); y = RMSNorm(residual) * w, computed from the rounded residual (exactly what the
// unfused add-then-norm pair stores and reads back).
struct AddRmsNormParams {
  const bf16_t* x = nullptr;   // [T, D] dense: the sublayer output being added
  bf16_t* residual = nullptr;  // [T, D] dense, in/out
  const bf16_t* w = nullptr;   // [D]
  bf16_t* y = nullptr;         // [T, D] dense (may alias x, not residual)
  int T = 0, D = 0;
  float eps = 1e-5f;
};

// nullopt when supported: 8 <= D <= 8192, D % 8 == 0 (16-byte rows). Inline: host code and CI use it without CUDA.
inline std::optional<std::string> rmsnorm_unsupported(int D) {
  if (D < 8 || D > kMaxDim || D % 8 != 0)
    return "rmsnorm: D = " + std::to_string(D) + " unsupported (need 8 <= D <= 8192 and D % 8 == 0)";
  return std::nullopt;
}
void rmsnorm(const RmsNormParams& p, CUstream_st* stream);
void add_rmsnorm(const AddRmsNormParams& p, CUstream_st* stream);

}  // namespace ds::norm
