// Decode-step byte model (see perf_model.h).
#include "runtime/perf_model.h"

#include <cmath>
#include <string>

#include "kernels/gemm/gemm.h"
#include "model/weights.h"

namespace ds {

namespace {

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Layer index of "model.layers.<i>....", or -1.
int layer_of(const std::string& n) {
  const std::string pre = "model.layers.";
  if (n.rfind(pre, 0) != 0) return -1;
  return std::stoi(n.substr(pre.size()));
}

// Whether a 2-D bf16 weight becomes FP8 under the options (the rules of runtime/cuda_model.h).
bool quantised(const std::string& n, const ModelConfig& c, const DecodeBytesOptions& o) {
  if (!o.fp8 || n == "model.embed_tokens.weight") return false;
  if (n == "lm_head.weight") return o.fp8_lm_head && o.concurrency <= gemm::kDecodeMaxRows;
  if (has(n, ".gate.weight") || has(n, "kv_b_proj") || has(n, "f_b_proj") || has(n, "g_b_proj")) return false;
  const int layer = layer_of(n);
  if (layer >= 0 && c.is_kda_layer(layer) && has(n, "self_attn") && !has(n, "o_proj")) {
    const bool gate = has(n, "f_a_proj") || has(n, "g_a_proj") || has(n, "b_proj");
    return o.fp8_kda_proj && !(gate && o.kda_gates_bf16);
  }
  return true;  // MLA fused A (q_proj, kv_a) and o_proj, KDA o_proj, dense FFN, shared and routed experts
}

double tensor_bytes(const TensorSpec& s, const ModelConfig& c, const DecodeBytesOptions& o) {
  int64_t numel = 1;
  for (int64_t d : s.shape) numel *= d;
  if (s.shape.size() == 2 && s.dtype == DType::kBF16 && quantised(s.name, c, o)) {
    const int64_t N = s.shape[0], K = s.shape[1];
    const int64_t scale_cols = (K / 128 + 3) / 4 * 4;  // gemm.h w_scale_cols
    return static_cast<double>(numel) + static_cast<double>((N + 127) / 128 * scale_cols * 4);
  }
  return static_cast<double>(numel) * static_cast<double>(dtype_size(s.dtype));
}

bool is_routed_expert(const std::string& n) { return has(n, ".experts."); }

}  // namespace

DecodeBytes decode_step_bytes(const ModelConfig& c, const DecodeBytesOptions& o) {
  DecodeBytes b;
  const double C = o.concurrency;
  const double E = c.num_experts, k = c.num_experts_per_token;
  b.experts_touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, C)) : 0.0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    if (s.name == "model.embed_tokens.weight") {
      b.weights += C * c.hidden_size * static_cast<double>(dtype_size(s.dtype));
      continue;
    }
    const double bytes = tensor_bytes(s, c, o);
    if (is_routed_expert(s.name)) {
      b.experts += bytes * (b.experts_touched / E);  // each expert's share of the expected touched set
    } else {
      b.weights += bytes;
    }
  }
  const int64_t H = c.linear_attn.num_heads, K = c.linear_attn.head_dim, P = H * K;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  int kda = 0, mla = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) (c.is_kda_layer(i) ? kda : mla) += 1;
  const double kda_state = 2.0 * H * K * K * 4 + 2.0 * (W - 1) * 3 * P * 2;  // read + write
  const double mla_rows = (static_cast<double>(o.context) + 1) * c.mla_latent_dim() * 2;
  b.state = C * (kda * kda_state + mla * mla_rows);
  return b;
}

std::string weights_precision(const DecodeBytesOptions& o) {
  if (!o.fp8) return "bf16";
  return std::string("FP8 block-scaled experts, MLA and o_proj and dense FFN weights; KDA projection ") +
         (!o.fp8_kda_proj     ? "bf16 (DELTASERVE_FP8_KDA_PROJ=0)"
          : o.kda_gates_bf16 ? "q/k/v FP8, gates f_a/g_a/b bf16 (DELTASERVE_FP8_KDA_PROJ=2)"
                             : "FP8 (DELTASERVE_FP8_KDA_PROJ=1)") +
         (o.fp8_lm_head ? "; lm_head FP8 at <= 4 sampled rows (DELTASERVE_FP8_LM_HEAD=1)" : "; lm_head bf16") +
         "; router, MLA kv_b and KDA f_b/g_b bf16";
}

int64_t active_params_per_token(const ModelConfig& c) {
  int64_t total = 0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    if (s.name == "model.embed_tokens.weight") continue;
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    if (is_routed_expert(s.name)) {
      // Counted as TOPK experts per MoE layer: E experts x 3 tensors each; take TOPK / E of every one.
      total += numel * c.num_experts_per_token / c.num_experts;
      continue;
    }
    total += numel;
  }
  return total;
}

}  // namespace ds
