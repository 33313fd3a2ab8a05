// The two vocabulary ops: embedding lookup (ids -> rows of embed_tokens) and lm_head (hidden -> fp32 logits through
// the cuBLASLt GEMM wrapper).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/gemm/gemm.h"

namespace ds::embed {

struct EmbedParams {
  const int32_t* ids = nullptr;   // [T] token ids; an id outside [0, V) (a padding row) yields a zero row
  const bf16_t* table = nullptr;  // [V, D] embed_tokens.weight
  bf16_t* out = nullptr;          // [T, D] dense
  int T = 0, V = 0, D = 0;        // D % 8 == 0 (16-byte rows)
};
void embed_lookup(const EmbedParams& p, CUstream_st* stream);

// logits[T, V] (f32) = x[T, D] @ lm_head[V, D]^T. fp32 logits: the sampler's softmax and argmax read them
// directly and bf16 logits would tie distinct tokens (8 mantissa bits at |logit| ~ 20 is a step of 0.125).
struct LmHeadParams {
  TensorView x;       // [T, D] bf16 (the final RMSNorm output, or its input when norm_w is set)
  TensorView w;       // [V, D] bf16 lm_head.weight, or its FP8 copy (e4m3, decode GEMV only: T <= 4)
  TensorView logits;  // [T, V] f32
  const bf16_t* norm_w = nullptr;  // decode GEMV only (T <= 4): apply the final RMSNorm to x first (gemm.h)
  float norm_eps = 0.0f;
  TensorView w_scale;  // FP8 w only: its 128x128 block scales (gemm.h layout)
};
void lm_head(gemm::GemmRunner& runner, const LmHeadParams& p, CUstream_st* stream);

}  // namespace ds::embed
