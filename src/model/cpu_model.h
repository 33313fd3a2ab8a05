// CpuModel: the whole Kimi-Linear forward in fp32 on the CPU (spec section 2), the reference the CUDA engine's
// logits are compared against, and the engine behind the embedded default model when there is no GPU.
//
// Precision: weights are converted to fp32 once at construction (WeightSet::get_f32, FP8 dequantised) and every
// activation stays fp32 — no bf16 rounding anywhere, so this is the exact math of the spec; a bf16 engine differs
// from it by activation rounding only. The one HF/vLLM choice that is not rounding: kv_a_layernorm uses
// config.rms_norm_eps (vLLM), see mla_ref.h.
//
// Thread-safety: a CpuModel is immutable after construction; forward() may run concurrently on different
// SequenceStates.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/moe/moe_ref.h"
#include "model/config.h"
#include "model/weights.h"

namespace ds {

// Per-layer state of one sequence. KDA layers use recurrent + conv, MLA layers use latent.
struct LayerState {
  std::vector<float> recurrent;  // KDA [H, K, V] fp32 (row = key dim)
  std::vector<float> conv;       // KDA [W-1, 3P] last W-1 pre-conv projections, oldest first; q | k | v channels
  std::vector<float> latent;     // MLA [t, L + Dr] latent cache rows [c_n ; k_pe], one per token so far
};

// Everything a sequence carries between forward() calls: prefill then decode continue exactly.
struct SequenceState {
  std::vector<LayerState> layers;  // [num_hidden_layers]
  int64_t num_tokens = 0;          // tokens consumed so far (the position of the next token)

  // Back to a fresh sequence (zero state, empty caches) without giving up the allocations.
  void reset();
};

struct CpuModelOptions {
  enum class Kda {
    kAuto,       // chunked form for T > 1, recurrent for T = 1 (how the kernels split prefill and decode)
    kRecurrent,  // token-by-token delta rule always
    kChunked,    // chunkwise UT/WY form always
  };
  enum class Mla {
    kAuto,      // expanded for T > 1, weight-absorbed for T = 1
    kExpanded,
    kAbsorbed,
  };
  Kda kda = Kda::kAuto;
  Mla mla = Mla::kAuto;
  int kda_chunk = 64;
  bool hf_biased_routing = false;  // MoE weights from the biased scores (HF); see moe_ref.h
  // The KDA output o rounded to bf16 before o_norm, as the model (and the CUDA kernels) do; false keeps it fp32, so
  // tests of the chunked / recurrent equivalence see the maths without a rounding boundary in between.
  bool kda_o_bf16 = true;

  // Defaults, with hf_biased_routing from DELTASERVE_HF_BIASED_ROUTING.
  static CpuModelOptions from_env();
};

class CpuModel {
 public:
  // Validates the weights against the config (validate_weights) and converts them to fp32.
  CpuModel(const ModelConfig& config, const WeightSet& weights, CpuModelOptions options = {});
  ~CpuModel();
  CpuModel(const CpuModel&) = delete;
  CpuModel& operator=(const CpuModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const CpuModelOptions& options() const { return options_; }
  int vocab_size() const { return config_.vocab_size; }

  // A fresh state sized for this model (KDA state zeroed, MLA caches empty).
  SequenceState new_state() const;

  // Runs `tokens` (appended to whatever `state` holds) and returns the logits of the last token [vocab], or of
  // every token [T, vocab] with all_logits. Throws ds::Error for an empty batch or an id outside the vocabulary.
  std::vector<float> forward(const std::vector<int32_t>& tokens, SequenceState& state, bool all_logits = false) const;

 private:
  struct KdaWeights;
  struct MlaWeights;
  struct FfnWeights;
  struct Layer;

  void kda_forward(const Layer& l, const float* x, int T, LayerState& s, float* out) const;
  void mla_forward(const Layer& l, const float* x, int T, LayerState& s, float* out) const;
  void ffn_forward(const Layer& l, const float* x, int T, float* h) const;  // h += FFN(x)

  ModelConfig config_;
  CpuModelOptions options_;
  moe::RouterParams router_;
  std::vector<float> embed_;    // [vocab, D]
  std::vector<float> norm_;     // [D]
  std::vector<float> lm_head_;  // [vocab, D]
  std::vector<Layer> layers_;
};

// y [T, N] = x [T, K] . W^T for W [N, K] (nn.Linear layout): the one matmul of the CPU engine.
void cpu_linear(const float* x, const float* w, int T, int K, int N, float* y);

}  // namespace ds
