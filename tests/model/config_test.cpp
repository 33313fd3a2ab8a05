// config.json parsing, validation messages, round trip and the built-in presets.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "model/config.h"

namespace ds {
namespace {

using nlohmann::json;

// Spec section 1, verbatim, annotations included (nlohmann's parser skips // comments when asked).
constexpr const char* kSpecConfig = R"json(
{
  "architectures": ["KimiLinearForCausalLM"],
  "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig",
               "AutoModel": "modeling_kimi.KimiLinearModel",
               "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
  "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
  "dtype": "bfloat16",
  "first_k_dense_replace": 1,
  "head_dim": 72,                      // = hidden/heads default; UNUSED by any layer
  "hidden_act": "silu",
  "hidden_size": 2304,
  "initializer_range": 0.02,
  "intermediate_size": 9216,           // dense FFN of layer 0 only
  "kv_lora_rank": 512,
  "linear_attn_config": {
    "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],                          // 1-based
    "head_dim": 128,
    "kda_layers": [1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],    // 1-based
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
  "rope_theta": 10000.0,               // UNUSED (NoPE)
  "routed_scaling_factor": 2.446,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "transformers_version": "4.57.0",   // 4.57.1 in a re-saved MLX copy
  "use_cache": true,
  "use_grouped_topk": true,
  "v_head_dim": 128,
  "vocab_size": 163840
}
)json";

json spec_json() { return json::parse(kSpecConfig, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true); }

// Runs parse_config on `j` and returns the error message ("" when it parsed).
std::string parse_error(const json& j, const std::string& source = "test/config.json") {
  try {
    parse_config(j, source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Applies `mutate` to the real config and expects an error naming the source and containing `fragment`.
void expect_rejected(const std::function<void(json&)>& mutate, const std::string& fragment) {
  json j = spec_json();
  mutate(j);
  const std::string msg = parse_error(j);
  EXPECT_NE(msg.find("test/config.json"), std::string::npos) << "message does not name the file: " << msg;
  EXPECT_NE(msg.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << msg;
}

TEST(Config, ParsesTheRealCheckpointConfig) {
  const ModelConfig c = parse_config(spec_json(), "spec");
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"KimiLinearForCausalLM"});
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.hidden_size, 2304);
  EXPECT_EQ(c.intermediate_size, 9216);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 72);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_token, 8);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.num_expert_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_TRUE(c.use_grouped_topk);
  EXPECT_TRUE(c.moe_renormalize);
  EXPECT_EQ(c.moe_router_activation_func, "sigmoid");
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_TRUE(c.mla_use_nope);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_EQ(c.eos_token_id, 163586);
  EXPECT_EQ(c.pad_token_id, 163839);
  EXPECT_EQ(c.model_max_length, 1048576);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.linear_attn.num_heads, 32);
  EXPECT_EQ(c.linear_attn.head_dim, 128);
  EXPECT_EQ(c.linear_attn.short_conv_kernel_size, 4);
  EXPECT_EQ(c.kda_proj_dim(), 4096);
  EXPECT_EQ(c.mla_qk_head_dim(), 192);
  EXPECT_EQ(c.mla_latent_dim(), 576);
  // Layer map (spec section 1): MLA at 0-based 3, 7, ..., 23, 26; dense FFN only at layer 0.
  std::vector<int> mla;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_mla_layer(i)) mla.push_back(i);
  EXPECT_EQ(mla, (std::vector<int>{3, 7, 11, 15, 19, 23, 26}));
  EXPECT_FALSE(c.is_moe_layer(0));
  for (int i = 1; i < 27; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
  EXPECT_EQ(c, preset_config("kimi-linear-48b-a3b"));
}

TEST(Config, AcceptsLegacyTorchDtype) {
  json j = spec_json();
  j.erase("dtype");
  j["torch_dtype"] = "float16";
  EXPECT_EQ(parse_config(j, "t").dtype, DType::kF16);
  j.erase("torch_dtype");
  EXPECT_EQ(parse_config(j, "t").dtype, DType::kBF16);  // default when neither is given
}

TEST(Config, RoundTripsThroughJson) {
  for (const ModelConfig& c : {preset_config("kimi-linear-48b-a3b"), preset_config("tiny"),
                               preset_config("tiny", 9), preset_config("kimi-linear-48b-a3b", 5)}) {
    const json j = config_to_json(c);
    EXPECT_EQ(parse_config(j, "roundtrip"), c) << j.dump(2);
    // Through text too: floats are written in their shortest form (2.446, not 2.4460000991821289).
    const std::string text = j.dump(2);
    EXPECT_EQ(parse_config(json::parse(text), "roundtrip"), c);
    EXPECT_EQ(text.find("2.4460000"), std::string::npos);
  }
}

TEST(Config, LoadConfigNamesThePath) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ds_config_test_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "config.json").string(), bad = (dir / "bad.json").string();
  std::ofstream(good) << kSpecConfig;  // comments: a real config.json has none, so this must fail...
  std::ofstream(bad) << "{\"model_type\": ";
  auto msg = [](const std::string& path) -> std::string {
    try {
      load_config(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg(good).find("not valid JSON"), std::string::npos);
  std::ofstream(good, std::ios::trunc) << spec_json().dump(2);  // ...and the plain JSON loads.
  EXPECT_EQ(load_config(good), preset_config("kimi-linear-48b-a3b"));
  EXPECT_NE(msg(bad).find(bad + ": not valid JSON"), std::string::npos) << msg(bad);
  const std::string missing = (dir / "nope.json").string();
  EXPECT_NE(msg(missing).find(missing + ": cannot open"), std::string::npos) << msg(missing);
  std::filesystem::remove_all(dir);
}

TEST(Config, RejectsWrongModelTypeAndMissingFields) {
  expect_rejected([](json& j) { j["model_type"] = "deepseek_v3"; }, "field 'model_type': 'deepseek_v3' is not supported");
  expect_rejected([](json& j) { j.erase("model_type"); }, "field 'model_type': missing");
  expect_rejected([](json& j) { j.erase("hidden_size"); }, "field 'hidden_size': missing");
  expect_rejected([](json& j) { j.erase("linear_attn_config"); }, "field 'linear_attn_config': missing");
  expect_rejected([](json& j) { j["linear_attn_config"].erase("head_dim"); }, "field 'linear_attn_config.head_dim': missing");
  EXPECT_NE(parse_error(json::array()).find("expected a JSON object"), std::string::npos);
}

TEST(Config, RejectsWrongJsonTypes) {
  expect_rejected([](json& j) { j["hidden_size"] = "2304"; }, "field 'hidden_size': expected an integer, got string");
  expect_rejected([](json& j) { j["hidden_size"] = 2304.5; }, "field 'hidden_size': expected an integer, got number");
  expect_rejected([](json& j) { j["num_experts"] = 1e12; }, "field 'num_experts': expected an integer");
  expect_rejected([](json& j) { j["vocab_size"] = 5000000000LL; }, "field 'vocab_size': integer 5000000000 out of range");
  expect_rejected([](json& j) { j["rms_norm_eps"] = "1e-5"; }, "field 'rms_norm_eps': expected a number");
  expect_rejected([](json& j) { j["mla_use_nope"] = 1; }, "field 'mla_use_nope': expected a boolean");
  expect_rejected([](json& j) { j["dtype"] = 16; }, "field 'dtype': expected a string");
  expect_rejected([](json& j) { j["dtype"] = "float8"; }, "field 'dtype': unsupported dtype 'float8'");
  expect_rejected([](json& j) { j["architectures"] = "KimiLinearForCausalLM"; }, "field 'architectures': expected an array");
  expect_rejected([](json& j) { j["linear_attn_config"] = 3; }, "field 'linear_attn_config': expected an object");
  expect_rejected([](json& j) { j["linear_attn_config"]["kda_layers"] = {1, "2"}; },
                  "field 'linear_attn_config.kda_layers': expected an array of integers");
}

TEST(Config, RejectsLayerListsThatDoNotCoverEveryLayerOnce) {
  expect_rejected([](json& j) { j["linear_attn_config"]["full_attn_layers"] = {4, 8, 12, 16, 20, 24}; },
                  "layer 27 (1-based) is in neither kda_layers nor full_attn_layers");
  expect_rejected([](json& j) { j["linear_attn_config"]["full_attn_layers"].push_back(1); },
                  "layer 1 is listed more than once");
  expect_rejected([](json& j) { j["linear_attn_config"]["kda_layers"].push_back(3); }, "layer 3 is listed more than once");
  expect_rejected([](json& j) { j["linear_attn_config"]["kda_layers"].push_back(28); },
                  "field 'linear_attn_config.kda_layers': layer 28 is out of range [1, 27]");
  expect_rejected([](json& j) { j["linear_attn_config"]["full_attn_layers"].push_back(0); },
                  "field 'linear_attn_config.full_attn_layers': layer 0 is out of range");
  expect_rejected([](json& j) { j["num_hidden_layers"] = 26; }, "layer 27 is out of range [1, 26]");
}

TEST(Config, RejectsHeadDimsTheKernelsDoNotSupport) {
  expect_rejected([](json& j) { j["linear_attn_config"]["head_dim"] = 64; },
                  "field 'linear_attn_config.head_dim': 64 is not supported (KDA kernels support head_dim 128)");
  expect_rejected([](json& j) { j["qk_nope_head_dim"] = 64; }, "field 'qk_nope_head_dim': 64 is not supported");
  expect_rejected([](json& j) { j["qk_rope_head_dim"] = 32; }, "field 'qk_rope_head_dim': 32 is not supported");
  expect_rejected([](json& j) { j["v_head_dim"] = 64; }, "field 'v_head_dim': 64 is not supported");
  expect_rejected([](json& j) { j["kv_lora_rank"] = 256; }, "field 'kv_lora_rank': 256 is not supported");
  expect_rejected([](json& j) { j["q_lora_rank"] = 1536; }, "field 'q_lora_rank': 1536 is not supported (only null");
  expect_rejected([](json& j) { j["mla_use_nope"] = false; }, "field 'mla_use_nope': must be true");
  expect_rejected([](json& j) { j.erase("mla_use_nope"); }, "field 'mla_use_nope': must be true");
  expect_rejected([](json& j) { j["linear_attn_config"]["num_heads"] = 0; }, "field 'linear_attn_config.num_heads'");
  expect_rejected([](json& j) { j["linear_attn_config"]["short_conv_kernel_size"] = 0; },
                  "field 'linear_attn_config.short_conv_kernel_size': 0 is out of range");
}

TEST(Config, RejectsBadMoeShapes) {
  expect_rejected([](json& j) { j["num_experts"] = 0; }, "field 'num_experts': 0 is out of range [1, 1024]");
  expect_rejected([](json& j) { j["num_experts"] = 2048; }, "field 'num_experts': 2048 is out of range");
  expect_rejected([](json& j) { j["num_experts_per_token"] = 17; }, "field 'num_experts_per_token': 17 is out of range [1, 16]");
  expect_rejected([](json& j) { j["num_experts_per_token"] = 0; }, "field 'num_experts_per_token'");
  expect_rejected([](json& j) { j["num_experts"] = 4; j["num_expert_group"] = 1; }, "num_experts_per_token': 8 is out of range [1, 4]");
  expect_rejected([](json& j) { j["num_expert_group"] = 3; }, "field 'num_expert_group': 3 must be >= 1 and divide num_experts 256");
  expect_rejected([](json& j) { j["topk_group"] = 2; }, "field 'topk_group': 2 is out of range [1, num_expert_group 1]");
  expect_rejected([](json& j) { j["moe_router_activation_func"] = "softmax"; }, "field 'moe_router_activation_func': 'softmax'");
  expect_rejected([](json& j) { j["routed_scaling_factor"] = 0; }, "field 'routed_scaling_factor'");
  expect_rejected([](json& j) { j["num_shared_experts"] = -1; }, "field 'num_shared_experts'");
}

TEST(Config, RejectsBadSizesAndIds) {
  expect_rejected([](json& j) { j["hidden_size"] = 2300; }, "field 'hidden_size': 2300 must be a positive multiple of 128");
  expect_rejected([](json& j) { j["moe_intermediate_size"] = 1000; }, "field 'moe_intermediate_size': 1000 must be a positive multiple of 128");
  expect_rejected([](json& j) { j["intermediate_size"] = 9200; }, "field 'intermediate_size'");
  expect_rejected([](json& j) { j["vocab_size"] = 0; }, "field 'vocab_size': 0 must be > 0");
  expect_rejected([](json& j) { j["eos_token_id"] = 163840; }, "field 'eos_token_id': 163840 is outside the vocabulary [0, 163840)");
  expect_rejected([](json& j) { j["bos_token_id"] = -1; }, "field 'bos_token_id'");
  expect_rejected([](json& j) { j["pad_token_id"] = 200000; }, "field 'pad_token_id'");
  expect_rejected([](json& j) { j["rms_norm_eps"] = 0; }, "field 'rms_norm_eps': 0 must be a finite number > 0");
  expect_rejected([](json& j) { j["first_k_dense_replace"] = -1; }, "field 'first_k_dense_replace': -1 must be >= 0");
  expect_rejected([](json& j) { j["moe_layer_freq"] = 0; }, "field 'moe_layer_freq': 0 must be >= 1");
  expect_rejected([](json& j) { j["num_hidden_layers"] = 0; }, "field 'num_hidden_layers': 0 is out of range");
  expect_rejected([](json& j) { j["hidden_act"] = "gelu"; }, "field 'hidden_act': 'gelu' is not supported");
  expect_rejected([](json& j) { j["rope_scaling"] = {{"type", "yarn"}}; }, "field 'rope_scaling': must be null");
  expect_rejected([](json& j) { j["tie_word_embeddings"] = true; }, "field 'tie_word_embeddings'");
}

TEST(Presets, TinyHasTheDocumentedValues) {
  const ModelConfig c = preset_config("tiny");
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.intermediate_size, 512);
  EXPECT_EQ(c.moe_intermediate_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.linear_attn.kda_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(c.linear_attn.full_attn_layers, (std::vector<int>{4}));
  EXPECT_EQ(c.linear_attn.num_heads, 2);
  EXPECT_EQ(c.linear_attn.head_dim, 128);
  EXPECT_EQ(c.linear_attn.short_conv_kernel_size, 4);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.num_expert_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.bos_token_id, 256);
  EXPECT_EQ(c.eos_token_id, 258);
  EXPECT_EQ(c.pad_token_id, 263);
  EXPECT_EQ(c.model_max_length, 4096);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_TRUE(c.mla_use_nope);
  EXPECT_TRUE(c.is_kda_layer(0) && c.is_kda_layer(1) && c.is_kda_layer(2) && c.is_mla_layer(3));
  EXPECT_EQ(preset_config("tiny", 4), c);
}

TEST(Presets, LayerCountKeepsTheRealLayerPattern) {
  EXPECT_EQ(preset_config("kimi-linear-48b-a3b", 27), preset_config("kimi-linear-48b-a3b"));
  const ModelConfig four = preset_config("kimi-linear-48b-a3b", 4);
  EXPECT_EQ(four.num_hidden_layers, 4);
  EXPECT_EQ(four.linear_attn.kda_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(four.linear_attn.full_attn_layers, (std::vector<int>{4}));
  const ModelConfig t27 = preset_config("tiny", 27);
  EXPECT_EQ(t27.linear_attn.full_attn_layers, (std::vector<int>{4, 8, 12, 16, 20, 24, 27}));
  EXPECT_EQ(t27.linear_attn.kda_layers.size(), 20u);
  EXPECT_EQ(preset_config("tiny", 3).linear_attn.full_attn_layers, std::vector<int>{});  // below 4: all KDA
  EXPECT_EQ(preset_config("tiny", 1).linear_attn.kda_layers, std::vector<int>{1});
  EXPECT_EQ(preset_config("tiny", 9).linear_attn.full_attn_layers, (std::vector<int>{4, 8, 9}));
  EXPECT_EQ(preset_config("tiny", 8).linear_attn.full_attn_layers, (std::vector<int>{4, 8}));
}

TEST(Presets, UnknownNameListsTheValidOnes) {
  try {
    preset_config("kimi-k3");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown model preset 'kimi-k3'"), std::string::npos) << m;
    for (const auto& n : preset_names()) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
  EXPECT_THROW(preset_config("tiny", -1), Error);
}

// A huge --layers is refused before any layer list is built (it once allocated 8 GB for 2e9 layers first).
TEST(Presets, LayerCountIsCheckedBeforeBuilding) {
  EXPECT_EQ(preset_config("tiny", kMaxLayers).num_hidden_layers, kMaxLayers);
  for (const int n : {kMaxLayers + 1, 2000000000}) {
    try {
      preset_config("tiny", n);
      FAIL() << "no error for " << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range [1, 1024]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ds
