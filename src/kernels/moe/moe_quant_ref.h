// CPU references (fp32) for what moe_ref.h does not define: the quantised weight/activation formats of the
// MoE op, its dispatch (expanded_to_permuted), and the experts evaluated at the kernels' quantisation points.
//
// Activation quantisers (the kernels reproduce them bit for bit):
//   FP8 block 1x128: scale = amax / 448 (1 if amax == 0), q = e4m3(v / scale)       (e4m3 saturates at 448)
//   MXFP8 1x32:      s = e8m0_scale_for_amax(amax, 448), q = e4m3(v * 2^-(s-127))
// Weight quantisers (test-data generators; the kernels only dequantise):
//   FP8 block 128x128: as above per block;  MXFP8/MXFP4 1x32 along K: e8m0 as above with 448 / 6;
//   NVFP4 1x16 along K: global g = amax(matrix) / (448 * 6), block scale s = e4m3(amax_blk / (6 g)),
//                       q = e2m1(v / (s g)), value = q * s * g.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/moe/moe.h"

namespace ds::moe {

// ---- activations: x [rows, K] -> q e4m3 [rows, K] + scale (f32 [rows, K/128] | e8m0 [rows, K/32])
void quantize_act_ref(const float* x, int rows, int K, ActFormat f, uint8_t* q, void* scale);
void dequantize_act_ref(const uint8_t* q, const void* scale, int rows, int K, ActFormat f, float* out);
// Quantise-dequantise in place (bf16: round to bf16).
void fake_quantize_act_ref(float* x, int rows, int K, ActFormat f);

// ---- weights: n matrices of [R, K] in the layouts of moe.h's ExpertWeights.
struct QuantWeights {
  std::vector<uint8_t> data;    // bf16 | e4m3 | packed e2m1
  std::vector<uint8_t> scale;   // f32 [n, R/128, K/128] | e8m0 [n, R, K/32] | e4m3 [n, R, K/16]
  std::vector<float> global;    // [n] (NVFP4)
};
QuantWeights quantize_weights_ref(const float* w, int n, int R, int K, WeightFormat f);
void dequantize_weights_ref(const QuantWeights& q, int n, int R, int K, WeightFormat f, float* out);

// ---- dispatch: expanded_to_permuted [T*TOPK] and per-group counts, the op's stable order (shared expert
// rows [0, T) first when has_shared, then local experts in order, routes ascending inside an expert).
void dispatch_ref(const int32_t* topk_ids, int T, int TOPK, int expert_begin, int EL, bool has_shared,
                  int32_t* expanded_to_permuted, std::vector<int>* group_counts);

// ---- experts at the kernels' quantisation points:
//   xa = fake_quant(x, act); g, u = xa . W13 rows (fp32); h = silu(g) * u; ha = fake_quant(h, act);
//   y = round_bf16(ha . W2 rows). Weights are the dequantised fp32 values.
struct QuantExpertArgs {
  const float* x = nullptr;           // [T, D] (bf16 values)
  const int32_t* topk_ids = nullptr;  // [T, TOPK] global ids
  int T = 0, D = 0, I = 0, TOPK = 0;
  int expert_begin = 0, EL = 0;       // routes outside [begin, begin + EL) give zero rows
  const float* w13 = nullptr;         // [EL, 2I, D]
  const float* w2 = nullptr;          // [EL, D, I]
  const float* shared_w13 = nullptr;  // [2I, D] or nullptr
  const float* shared_w2 = nullptr;   // [D, I]
  ActFormat act = ActFormat::kBF16;
  float* expert_out = nullptr;        // [T, TOPK, D]
  float* shared_out = nullptr;        // [T, D] (when shared weights are given)
};
void experts_quant_ref(const QuantExpertArgs& a);

}  // namespace ds::moe
