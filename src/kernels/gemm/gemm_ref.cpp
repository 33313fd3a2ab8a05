// CPU references of the GEMM and the FP8 block quantisers (see gemm_ref.h).
#include "kernels/gemm/gemm_ref.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/gemm/gemm.h"

namespace ds::gemm {

void gemm_ref(const float* x, const float* w, int M, int N, int K, float* out) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const float* a = x + static_cast<size_t>(m) * K;
      const float* b = w + static_cast<size_t>(n) * K;
      double acc = 0.0;
      for (int k = 0; k < K; ++k) acc += static_cast<double>(a[k]) * b[k];
      out[static_cast<size_t>(m) * N + n] = static_cast<float>(acc);
    }
}

void quantize_act_fp8_ref(const float* x, int M, int K, uint8_t* q, float* scale) {
  CHECK(K % kFp8Block == 0, "K={}", K);
  const int KB = K / kFp8Block;
  for (int m = 0; m < M; ++m)
    for (int kb = 0; kb < KB; ++kb) {
      const float* v = x + static_cast<size_t>(m) * K + kb * kFp8Block;
      float amax = 0.0f;
      for (int i = 0; i < kFp8Block; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float s = std::max(amax, kAmaxFloor) / kE4M3Max;
      for (int i = 0; i < kFp8Block; ++i) q[static_cast<size_t>(m) * K + kb * kFp8Block + i] = f32_to_e4m3(v[i] / s);
      scale[static_cast<size_t>(kb) * M + m] = s;
    }
}

void quantize_weight_fp8_ref(const float* w, int N, int K, uint8_t* q, float* scale) {
  CHECK(K % kFp8Block == 0, "K={}", K);
  const int KB = K / kFp8Block, NB = (N + kFp8Block - 1) / kFp8Block;
  for (int nb = 0; nb < NB; ++nb)
    for (int kb = 0; kb < KB; ++kb) {
      const int r1 = std::min(N, (nb + 1) * kFp8Block);
      float amax = 0.0f;
      for (int r = nb * kFp8Block; r < r1; ++r)
        for (int i = 0; i < kFp8Block; ++i) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * K + kb * kFp8Block + i]));
      const float s = std::max(amax, kAmaxFloor) / kE4M3Max;
      for (int r = nb * kFp8Block; r < r1; ++r)
        for (int i = 0; i < kFp8Block; ++i) {
          const size_t idx = static_cast<size_t>(r) * K + kb * kFp8Block + i;
          q[idx] = f32_to_e4m3(w[idx] / s);
        }
      scale[static_cast<size_t>(nb) * KB + kb] = s;
    }
}

void dequantize_act_fp8_ref(const uint8_t* q, const float* scale, int M, int K, float* x) {
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      x[static_cast<size_t>(m) * K + k] =
          e4m3_to_f32(q[static_cast<size_t>(m) * K + k]) * scale[static_cast<size_t>(k / kFp8Block) * M + m];
}

void dequantize_weight_fp8_ref(const uint8_t* q, const float* scale, int N, int K, float* w) {
  const int KB = K / kFp8Block;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      w[static_cast<size_t>(n) * K + k] = e4m3_to_f32(q[static_cast<size_t>(n) * K + k]) *
                                          scale[static_cast<size_t>(n / kFp8Block) * KB + k / kFp8Block];
}

}  // namespace ds::gemm
