// RMSNorm references (see norm_ref.h for the rounding contract).
#include "kernels/norm/norm_ref.h"

#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace ds::norm {

namespace {

void norm_row(const float* x, const float* w, int D, float eps, float* y, Rounding rounding) {
  // Sum of squares in double: the reference should not lose bits for D in the thousands.
  double ss = 0.0;
  for (int d = 0; d < D; ++d) ss += static_cast<double>(x[d]) * x[d];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / D) + eps);
  for (int d = 0; d < D; ++d) {
    float n = x[d] * r;
    if (rounding == Rounding::kBf16) n = round_bf16(n);
    y[d] = w[d] * n;
  }
}

}  // namespace

void rmsnorm_ref(const float* x, const float* w, int T, int D, float eps, float* y, Rounding rounding) {
  CHECK(T >= 0 && D > 0, "T={} D={}", T, D);
  for (int t = 0; t < T; ++t) norm_row(x + static_cast<size_t>(t) * D, w, D, eps, y + static_cast<size_t>(t) * D, rounding);
}

void add_rmsnorm_ref(const float* x, float* residual, const float* w, int T, int D, float eps, float* y,
                     Rounding rounding) {
  CHECK(T >= 0 && D > 0, "T={} D={}", T, D);
  for (int t = 0; t < T; ++t) {
    float* r = residual + static_cast<size_t>(t) * D;
    const float* xr = x + static_cast<size_t>(t) * D;
    for (int d = 0; d < D; ++d) r[d] += xr[d];
    norm_row(r, w, D, eps, y + static_cast<size_t>(t) * D, rounding);
  }
}

}  // namespace ds::norm
