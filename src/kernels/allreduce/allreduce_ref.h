// CPU reference of the fused MoE finalize + all-reduce + residual add + RMSNorm over R ranks: the definition the
// CUDA kernel and the unfused path are tested against (contract in allreduce.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace ds::allreduce {

// The value after rounding to the activation dtype (bf16 or fp16, nearest-even).
float round_act(DType dtype, float x);

struct FusedArNormRefArgs {
  DType dtype = DType::kBF16;
  int T = 0, D = 0, TOPK = 0;
  float eps = 1e-5f;
  // One entry per rank (R = expert_out.size()); every value representable in `dtype`.
  std::vector<const float*> expert_out;            // [T, TOPK, D]
  std::vector<const int32_t*> expanded_to_permuted;  // [T * TOPK], negative: dropped
  std::vector<const float*> topk_weights;          // [T, TOPK]
  std::vector<const float*> shared_out;            // [T, D] or nullptr
  const float* residual = nullptr;                 // [T, D] (the same on every rank)
  const float* norm_w = nullptr;                   // [D]
  float* sum = nullptr;                            // [T, D] out, optional: the rounded all-reduce sum
  float* residual_out = nullptr;                   // [T, D] out
  float* y = nullptr;                              // [T, D] out
};
void fused_ar_norm_ref(const FusedArNormRefArgs& a);

}  // namespace ds::allreduce
