// CPU definitions of the util ops; fill_value.h holds the random fill's per-element expression shared with CUDA.
#include "kernels/util/util_ref.h"

#include <cmath>

#include "core/error.h"
#include "kernels/util/fill_value.h"

namespace ds::util {

void silu_mul_ref(const float* x, int64_t x_stride, int T, int I, float* y) {
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < I; ++i) {
      const float g = x[t * x_stride + i], u = x[t * x_stride + I + i];
      y[static_cast<int64_t>(t) * I + i] = g / (1.0f + std::exp(-g)) * u;
    }
}

float fill_value_ref(const FillParams& p, int64_t i) { return detail::fill_value(detail::fill_args(p), i); }

void fill_random_ref(const FillParams& p) {
  CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF32, "fill_random_ref: dtype {} (bf16 or f32)",
        dtype_name(p.dtype));
  CHECK(p.n >= 0 && (p.n == 0 || p.out), "fill_random_ref: n = {}, out = {}", p.n, p.out);
  const detail::FillArgs f = detail::fill_args(p);
  for (int64_t i = 0; i < p.n; ++i) {
    const float v = detail::fill_value(f, i);
    if (p.dtype == DType::kBF16) static_cast<uint16_t*>(p.out)[i] = f32_to_bf16(v);
    else static_cast<float*>(p.out)[i] = v;
  }
}

}  // namespace ds::util
