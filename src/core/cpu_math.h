// Small fp32 helpers shared by the CPU references and the CPU engine.
#pragma once

namespace ds {

// Dot product with eight independent partial sums: vectorisable without -ffast-math and more accurate than one
// running sum (the references' accumulation order, fixed here once).
inline float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ds
