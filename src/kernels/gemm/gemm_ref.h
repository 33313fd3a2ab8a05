// CPU references of the GEMM wrapper and the FP8 quantisers (fp32; the definitions the CUDA code is tested against).
#pragma once

#include <cstdint>

namespace ds::gemm {

// out[m, n] = sum_k x[m, k] * w[n, k]  (double accumulation). x [M, K], w [N, K], out [M, N].
void gemm_ref(const float* x, const float* w, int M, int N, int K, float* out);

// scale = max(amax, kAmaxFloor) / 448 per 1x128 group, q = e4m3(x / scale) (saturating).
//   x [M, K] (values already bf16-representable), q [M, K], scale [K/128, M] (sa[kb * M + m]).
void quantize_act_fp8_ref(const float* x, int M, int K, uint8_t* q, float* scale);
// The same per 128x128 block: w [N, K], q [N, K], scale [ceil(N/128), K/128] (sb[nb * (K/128) + kb]).
void quantize_weight_fp8_ref(const float* w, int N, int K, uint8_t* q, float* scale);

// Inverses (code * scale), in the layouts above.
void dequantize_act_fp8_ref(const uint8_t* q, const float* scale, int M, int K, float* x);
void dequantize_weight_fp8_ref(const uint8_t* q, const float* scale, int N, int K, float* w);

}  // namespace ds::gemm
