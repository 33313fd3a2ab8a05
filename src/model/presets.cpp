// Built-in model configs: the real Kimi-Linear-48B-A3B shape and the "tiny" embedded default model.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace ds {

namespace {

// config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct, verbatim (spec section 1 without the annotations).
constexpr const char* kKimiLinear48BJson = R"json({
  "architectures": ["KimiLinearForCausalLM"],
  "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig",
               "AutoModel": "modeling_kimi.KimiLinearModel",
               "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
  "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
  "dtype": "bfloat16",
  "first_k_dense_replace": 1,
  "head_dim": 72,
  "hidden_act": "silu",
  "hidden_size": 2304,
  "initializer_range": 0.02,
  "intermediate_size": 9216,
  "kv_lora_rank": 512,
  "linear_attn_config": {
    "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    "head_dim": 128,
    "kda_layers": [1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],
    "num_heads": 32,
    "short_conv_kernel_size": 4
  },
  "mla_use_nope": true,
  "model_max_length": 1048576,
  "model_type": "kimi_linear",
  "moe_intermediate_size": 1024,
  "moe_layer_freq": 1,
  "moe_renormalize": true,
  "moe_router_activation_func": "sigmoid",
  "num_attention_heads": 32,
  "num_expert_group": 1,
  "num_experts": 256,
  "num_experts_per_token": 8,
  "num_hidden_layers": 27,
  "num_key_value_heads": 32,
  "num_nextn_predict_layers": 0,
  "num_shared_experts": 1,
  "q_lora_rank": null,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "routed_scaling_factor": 2.446,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "transformers_version": "4.57.0",
  "use_cache": true,
  "use_grouped_topk": true,
  "v_head_dim": 128,
  "vocab_size": 163840
})json";

// The embedded default model: every kernel shape of the real model (KDA K = 128, MLA 128/64/128/512, FP8
// block multiples) at a size the CPU reference runs in milliseconds. Other code depends on these values.
ModelConfig tiny_config() {
  ModelConfig c;
  c.architectures = {"KimiLinearForCausalLM"};
  c.dtype = DType::kBF16;
  c.vocab_size = 320;  // 256 bytes + special tokens
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 128;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.num_expert_group = 1;
  c.topk_group = 1;
  c.use_grouped_topk = true;
  c.moe_renormalize = true;
  c.moe_router_activation_func = "sigmoid";
  c.routed_scaling_factor = 2.446f;
  c.rms_norm_eps = 1e-5f;
  c.kv_lora_rank = 512;
  c.q_lora_rank = std::nullopt;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.mla_use_nope = true;
  c.tie_word_embeddings = false;
  c.bos_token_id = 256;
  c.eos_token_id = 258;
  c.pad_token_id = 263;
  c.model_max_length = 4096;
  c.num_nextn_predict_layers = 0;
  c.rope_theta = 10000.0;
  c.linear_attn.num_heads = 2;
  c.linear_attn.head_dim = 128;
  c.linear_attn.short_conv_kernel_size = 4;
  c.linear_attn.kda_layers = {1, 2, 3};
  c.linear_attn.full_attn_layers = {4};
  return c;
}

// Keeps `n` layers with the real model's pattern: MLA at every 4th layer (1-based 4, 8, ...) and at the last
// layer once there are at least 4 (so n = 27 reproduces the checkpoint's map exactly).
void set_layer_count(ModelConfig* c, int n) {
  c->num_hidden_layers = n;
  c->linear_attn.kda_layers.clear();
  c->linear_attn.full_attn_layers.clear();
  for (int l = 1; l <= n; ++l) {
    const bool mla = l % 4 == 0 || (n >= 4 && l == n);
    (mla ? c->linear_attn.full_attn_layers : c->linear_attn.kda_layers).push_back(l);
  }
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "kimi-linear-48b-a3b"}; }

ModelConfig preset_config(std::string_view name, int layers) {
  ModelConfig c;
  if (name == "tiny") {
    c = tiny_config();
  } else if (name == "kimi-linear-48b-a3b") {
    c = parse_config(nlohmann::json::parse(kKimiLinear48BJson), "preset kimi-linear-48b-a3b");
  } else {
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    DS_THROW("unknown model preset '{}' (valid presets: {})", name, valid);
  }
  // Checked before set_layer_count builds the layer lists (2e9 layers would allocate 8 GB first); the bound is
  // validate_config's.
  if (layers < 0 || layers > kMaxLayers)
    DS_THROW("preset {}: layer count {} is out of range [1, {}] (or 0 for the preset's own)", name, layers,
             kMaxLayers);
  if (layers > 0) set_layer_count(&c, layers);
  validate_config(c, fmt::format("preset {}", name));
  return c;
}

}  // namespace ds
