// RMSNorm CPU references in fp32 (plain and fused residual-add), the definitions the CUDA norms are tested against.
//
// Rounding contract: HF's KimiRMSNorm computes x * rsqrt(mean(x^2) + eps) in fp32, rounds that to the activation
// dtype (bf16) and only then multiplies by the weight; vLLM multiplies in fp32 and rounds once at the end. The
// difference is below bf16 resolution. The reference keeps everything fp32 by default (kNone) and offers the HF
// rounding (kBf16) so a kernel that follows HF can be checked bit-for-bit.
#pragma once

namespace ds::norm {

enum class Rounding {
  kNone,  // y = w * (x * rsqrt(mean(x^2) + eps)), all fp32 (vLLM's order, no intermediate rounding)
  kBf16,  // y = w * bf16(x * rsqrt(mean(x^2) + eps))              (HF KimiRMSNorm)
};

// y = RMSNorm(x) * w over the last dim.
//   x [T, D], w [D], y [T, D] (y may alias x)
void rmsnorm_ref(const float* x, const float* w, int T, int D, float eps, float* y,
                 Rounding rounding = Rounding::kNone);

// Fused residual add + RMSNorm (the layer-boundary pattern h = h + f(h); a = RMSNorm(h)):
//   residual [T, D] in/out: residual += x;  y = RMSNorm(residual) * w.
//   x [T, D], w [D], y [T, D] (y may alias x, not residual)
void add_rmsnorm_ref(const float* x, float* residual, const float* w, int T, int D, float eps, float* y,
                     Rounding rounding = Rounding::kNone);

}  // namespace ds::norm
