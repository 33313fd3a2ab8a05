// Kimi-Linear model configuration (HF config.json, model_type "kimi_linear") and the built-in presets.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace ds {

struct LinearAttnConfig {
  std::vector<int> full_attn_layers;  // 1-based layer numbers of MLA layers
  std::vector<int> kda_layers;        // 1-based layer numbers of KDA layers
  int num_heads = 32;                 // H
  int head_dim = 128;                 // K = V
  int short_conv_kernel_size = 4;     // W

  bool operator==(const LinearAttnConfig&) const = default;
};

struct ModelConfig {
  std::string model_type = "kimi_linear";
  std::vector<std::string> architectures;
  DType dtype = DType::kBF16;  // "dtype" (or legacy "torch_dtype")
  int vocab_size = 0;
  int hidden_size = 0;            // D
  int intermediate_size = 0;      // dense FFN of layers < first_k_dense_replace
  int moe_intermediate_size = 0;  // I (routed and shared experts)
  int num_hidden_layers = 0;
  int num_attention_heads = 0;    // MLA heads
  int num_key_value_heads = 0;
  int head_dim = 0;               // present in the file, unused by any layer
  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;
  int num_experts = 0;            // E
  int num_experts_per_token = 0;  // TOPK
  int num_shared_experts = 0;
  int num_expert_group = 1;
  int topk_group = 1;
  bool use_grouped_topk = true;
  bool moe_renormalize = true;
  std::string moe_router_activation_func = "sigmoid";
  float routed_scaling_factor = 1.0f;
  float rms_norm_eps = 1e-5f;
  int kv_lora_rank = 0;               // L = 512
  std::optional<int> q_lora_rank;     // null for Kimi-Linear (only null is supported)
  int qk_nope_head_dim = 0;           // 128
  int qk_rope_head_dim = 0;           // 64 (used unrotated: NoPE)
  int v_head_dim = 0;                 // 128
  bool mla_use_nope = true;
  bool tie_word_embeddings = false;
  int bos_token_id = 0;
  int eos_token_id = 0;
  int pad_token_id = 0;
  int64_t model_max_length = 0;   // 0 when config.json does not give one
  int num_nextn_predict_layers = 0;
  double rope_theta = 10000.0;        // unused (NoPE)
  LinearAttnConfig linear_attn;

  // ---- derived (0-based layer index i)
  bool is_kda_layer(int i) const;  // (i+1) in linear_attn.kda_layers
  bool is_mla_layer(int i) const { return !is_kda_layer(i); }
  bool is_moe_layer(int i) const { return i >= first_k_dense_replace && (i % moe_layer_freq) == 0; }
  int kda_proj_dim() const { return linear_attn.num_heads * linear_attn.head_dim; }  // P = H*K
  int mla_qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }       // 192
  int mla_latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }            // 576

  bool operator==(const ModelConfig&) const = default;  // field-by-field (config round-trip tests)
};

// Parses and validates a config.json document; `source` names the file in every error.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::string& path);
nlohmann::json config_to_json(const ModelConfig& c);
// Throws ds::Error naming the field for anything the engine cannot run (unknown model type, layer lists that do
// not cover every layer exactly once, unsupported head dims, bad MoE shape...).
void validate_config(const ModelConfig& c, const std::string& source = "config");
inline constexpr int kMaxLayers = 1024;  // num_hidden_layers accepted by validate_config and preset_config

// Presets: "tiny" (the embedded default model) and "kimi-linear-48b-a3b" (the real shape). `layers` > 0 keeps
// the first `layers` layers (MLA layers stay at every 4th position, as in the real model, and the last layer
// is MLA when layers >= 4).
ModelConfig preset_config(std::string_view name, int layers = 0);
std::vector<std::string> preset_names();

}  // namespace ds
