// MoE CPU references in fp32 (spec section 6): router (sigmoid, bias-corrected grouped top-k, renormalise,
// routed scaling), SwiGLU experts, finalize (weighted sum + shared expert + residual), and the whole block.
//
// Dimension names: T tokens, D hidden, E experts, I expert intermediate, TOPK experts per token, G groups.
//
// Router definition (DeepSeek-V3 "noaux_tc", what vLLM's grouped_topk computes):
//   s   = sigmoid(logits)                         (or softmax over E: ScoringFunc::kSoftmax)
//   sb  = s + bias                                 selection scores (bias = e_score_correction_bias, may be null)
//   groups: E / G consecutive experts each; group score = sum of the top-2 sb in the group (top-1 if a group
//           has one expert); the topk_group best groups stay, every expert of the other groups is excluded
//           (vLLM masks them to -inf; HF DeepSeek-V3 masks to 0.0, which could pick a masked expert when every
//           kept sb is negative: not copied)
//   ids = the TOPK best sb among kept experts, in descending sb order
//   w   = s[ids]   (vLLM, the trained behaviour)  |  sb[ids]  (hf_biased_weights: HF's in-place-add aliasing)
//   w   = w / (sum(w) + 1e-20)   if renormalize   (HF's epsilon; vLLM omits it; applied for TOPK = 1 too, as vLLM)
//   w   = w * routed_scaling_factor               (after renormalisation)
// Tie rule (kernels copy it): on equal scores the LOWER expert (or group) index wins. NaN scores rank below
// every number (as -inf), so a NaN logit can never displace a finite one.
#pragma once

#include <cstdint>

namespace ds::moe {

enum class ScoringFunc { kSigmoid, kSoftmax };

struct RouterParams {
  int E = 0;
  int topk = 0;                        // TOPK <= 16 for the CUDA router; any value <= kept experts here
  int num_expert_group = 1;            // G; E % G == 0
  int topk_group = 1;                  // groups kept, 1 <= topk_group <= G
  ScoringFunc scoring = ScoringFunc::kSigmoid;
  bool renormalize = true;             // config moe_renormalize
  float routed_scaling_factor = 1.0f;
  bool hf_biased_weights = false;      // weights from the biased scores (knobs::kHfBiasedRouting)
};

inline constexpr float kRenormEps = 1e-20f;

// logits [T, E] fp32, bias [E] (nullptr = none) -> topk_ids [T, TOPK] int32, topk_weights [T, TOPK] fp32.
void route_ref(const float* logits, const float* bias, int T, const RouterParams& p, int32_t* topk_ids,
               float* topk_weights);

// SwiGLU FFN: y = W_down (silu(W_gate x) * (W_up x)).
//   x [T, D], w_gate [I, D], w_up [I, D], w_down [D, I], y [T, D]
void swiglu_ref(const float* x, const float* w_gate, const float* w_up, const float* w_down, int T, int D, int I,
                float* y);

// Routed experts, unweighted: expert_out[t, k] = E_{topk_ids[t, k]}(x[t]); a negative id writes zeros.
//   w1 (gate) [E, I, D], w3 (up) [E, I, D], w2 (down) [E, D, I]  (HF experts.{e}.w1/w3/w2 stacked over e)
struct ExpertArgs {
  const float* x = nullptr;            // [T, D]
  const int32_t* topk_ids = nullptr;   // [T, TOPK]
  const float* w1 = nullptr;           // [E, I, D]
  const float* w3 = nullptr;           // [E, I, D]
  const float* w2 = nullptr;           // [E, D, I]
  int T = 0, D = 0, I = 0, E = 0, TOPK = 0;
  float* expert_out = nullptr;         // [T, TOPK, D]
};
void experts_ref(const ExpertArgs& a);

// out[t] = sum_k topk_weights[t, k] * expert_out[t, k] + shared_out[t] + residual[t]; the shared expert is
// unscaled (routed_scaling_factor is already inside topk_weights). Negative ids contribute nothing.
struct FinalizeArgs {
  const float* expert_out = nullptr;   // [T, TOPK, D]
  const int32_t* topk_ids = nullptr;   // [T, TOPK]
  const float* topk_weights = nullptr; // [T, TOPK]
  const float* shared_out = nullptr;   // [T, D] or nullptr
  const float* residual = nullptr;     // [T, D] or nullptr
  int T = 0, D = 0, TOPK = 0;
  float* out = nullptr;                // [T, D] (may alias residual)
};
void finalize_ref(const FinalizeArgs& a);

// The whole MoE block. In-op routing when gate_w is set (topk_ids/topk_weights are written), separated routing
// when gate_w is null (topk_ids/topk_weights are read: the caller routed). Router logits are fp32 (HF).
struct MoeArgs {
  const float* x = nullptr;            // [T, D]
  int T = 0, D = 0, I = 0;
  RouterParams router;                 // E and TOPK come from here
  const float* gate_w = nullptr;       // [E, D] router weight, or nullptr (separated routing)
  const float* bias = nullptr;         // [E] e_score_correction_bias or nullptr
  int32_t* topk_ids = nullptr;         // [T, TOPK] out (in-op) / in (separated)
  float* topk_weights = nullptr;       // [T, TOPK] out (in-op) / in (separated)
  const float* w1 = nullptr;           // [E, I, D]
  const float* w3 = nullptr;           // [E, I, D]
  const float* w2 = nullptr;           // [E, D, I]
  int shared_I = 0;                    // shared expert intermediate (num_shared_experts * I); 0 = none
  const float* shared_gate = nullptr;  // [shared_I, D]
  const float* shared_up = nullptr;    // [shared_I, D]
  const float* shared_down = nullptr;  // [D, shared_I]
  const float* residual = nullptr;     // [T, D] or nullptr
  float* out = nullptr;                // [T, D]
};
void moe_ref(const MoeArgs& a);

}  // namespace ds::moe
