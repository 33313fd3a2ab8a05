// CPU definitions of the util ops (fp32 math): the SwiGLU product, the column copy and the random fill.
#pragma once

#include <cstdint>

#include "kernels/util/util.h"

namespace ds::util {

// y[t, i] = silu(x[t, i]) * x[t, I + i], silu(g) = g / (1 + exp(-g)); x [T, x_stride], y [T, I] dense, unrounded.
void silu_mul_ref(const float* x, int64_t x_stride, int T, int I, float* y);

// The value fill_random writes at element i (before rounding to the output dtype).
float fill_value_ref(const FillParams& p, int64_t i);
// fill_random on host memory: p.out is a host buffer of p.n elements of p.dtype (bf16 or f32).
void fill_random_ref(const FillParams& p);

}  // namespace ds::util
