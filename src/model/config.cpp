// config.json <-> ModelConfig: typed field reading, validation against what the kernels support, writing.
#include "model/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace ds {

using nlohmann::json;

namespace {

const char* json_type(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

// Reads fields of one JSON object; every error names the source file and the (dotted) field.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    DS_THROW("{}: field '{}{}': {}", source_, prefix_, key, what);
  }

  const json& require(const char* key) const {
    if (!has(key)) fail(key, "missing (required)");
    return obj_.at(key);
  }

  int64_t get_int64(const char* key) const {
    const json& v = require(key);
    if (!v.is_number_integer()) fail(key, fmt::format("expected an integer, got {} {}", json_type(v), v.dump()));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(key, fmt::format("integer {} out of range", v.dump()));
    return v.get<int64_t>();
  }
  int get_int(const char* key) const {
    const int64_t x = get_int64(key);
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
      fail(key, fmt::format("integer {} out of range", x));
    return static_cast<int>(x);
  }
  int get_int(const char* key, int def) const { return has(key) ? get_int(key) : def; }
  int64_t get_int64(const char* key, int64_t def) const { return has(key) ? get_int64(key) : def; }

  double get_double(const char* key) const {
    const json& v = require(key);
    if (!v.is_number()) fail(key, fmt::format("expected a number, got {} {}", json_type(v), v.dump()));
    return v.get<double>();
  }
  double get_double(const char* key, double def) const { return has(key) ? get_double(key) : def; }

  bool get_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) fail(key, fmt::format("expected a boolean, got {} {}", json_type(v), v.dump()));
    return v.get<bool>();
  }

  std::string get_string(const char* key) const {
    const json& v = require(key);
    if (!v.is_string()) fail(key, fmt::format("expected a string, got {} {}", json_type(v), v.dump()));
    return v.get<std::string>();
  }
  std::string get_string(const char* key, const std::string& def) const { return has(key) ? get_string(key) : def; }

  std::vector<int> get_int_list(const char* key) const {
    const json& v = require(key);
    if (!v.is_array()) fail(key, fmt::format("expected an array of integers, got {}", json_type(v)));
    std::vector<int> out;
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX)
        fail(key, fmt::format("expected an array of integers, found element {}", e.dump()));
      out.push_back(e.get<int>());
    }
    return out;
  }
  std::vector<std::string> get_string_list(const char* key) const {
    if (!has(key)) return {};
    const json& v = obj_.at(key);
    if (!v.is_array()) fail(key, fmt::format("expected an array of strings, got {}", json_type(v)));
    std::vector<std::string> out;
    for (const json& e : v) {
      if (!e.is_string()) fail(key, fmt::format("expected an array of strings, found element {}", e.dump()));
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

DType dtype_from_config_name(const FieldReader& r, const char* key, const std::string& s) {
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "half" || s == "fp16") return DType::kF16;
  if (s == "float32" || s == "float" || s == "fp32") return DType::kF32;
  r.fail(key, fmt::format("unsupported dtype '{}' (expected bfloat16, float16 or float32)", s));
}

const char* dtype_config_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    default: DS_THROW("config: dtype {} cannot be written to config.json", dtype_name(t));
  }
}

// Shortest decimal that reads back as the same float, so 2.446f is written as 2.446 (not 2.4460000991821289)
// and the write -> parse round trip is exact.
double float_for_json(float f) { return std::stod(fmt::format("{}", f)); }

[[noreturn]] void invalid(const std::string& source, const char* field, const std::string& what) {
  DS_THROW("{}: field '{}': {}", source, field, what);
}

}  // namespace

bool ModelConfig::is_kda_layer(int i) const {
  const auto& v = linear_attn.kda_layers;
  return std::find(v.begin(), v.end(), i + 1) != v.end();
}

ModelConfig parse_config(const json& j, const std::string& source) {
  if (!j.is_object()) DS_THROW("{}: expected a JSON object at the top level, got {}", source, json_type(j));
  const FieldReader r(j, source);
  ModelConfig c;

  // model_type first: a config of another architecture should say so, not fail on some missing field.
  c.model_type = r.get_string("model_type");
  if (c.model_type != "kimi_linear")
    r.fail("model_type", fmt::format("'{}' is not supported (expected 'kimi_linear')", c.model_type));
  c.architectures = r.get_string_list("architectures");

  // "dtype" is the current name; transformers < 4.56 wrote "torch_dtype".
  if (r.has("dtype")) c.dtype = dtype_from_config_name(r, "dtype", r.get_string("dtype"));
  else if (r.has("torch_dtype")) c.dtype = dtype_from_config_name(r, "torch_dtype", r.get_string("torch_dtype"));

  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.moe_intermediate_size = r.get_int("moe_intermediate_size");
  c.num_hidden_layers = r.get_int("num_hidden_layers");
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.num_key_value_heads = r.get_int("num_key_value_heads", c.num_attention_heads);
  c.head_dim = r.get_int("head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  c.first_k_dense_replace = r.get_int("first_k_dense_replace", c.first_k_dense_replace);
  c.moe_layer_freq = r.get_int("moe_layer_freq", c.moe_layer_freq);
  c.num_experts = r.get_int("num_experts");
  c.num_experts_per_token = r.get_int("num_experts_per_token");
  c.num_shared_experts = r.get_int("num_shared_experts", 0);
  c.num_expert_group = r.get_int("num_expert_group", 1);
  c.topk_group = r.get_int("topk_group", 1);
  c.use_grouped_topk = r.get_bool("use_grouped_topk", c.use_grouped_topk);
  c.moe_renormalize = r.get_bool("moe_renormalize", c.moe_renormalize);
  c.moe_router_activation_func = r.get_string("moe_router_activation_func", c.moe_router_activation_func);
  c.routed_scaling_factor = static_cast<float>(r.get_double("routed_scaling_factor", c.routed_scaling_factor));
  c.rms_norm_eps = static_cast<float>(r.get_double("rms_norm_eps", c.rms_norm_eps));
  c.kv_lora_rank = r.get_int("kv_lora_rank");
  if (r.has("q_lora_rank")) c.q_lora_rank = r.get_int("q_lora_rank");
  c.qk_nope_head_dim = r.get_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.get_int("qk_rope_head_dim");
  c.v_head_dim = r.get_int("v_head_dim");
  // HF's KimiLinearConfig defaults mla_use_nope to false (rotary MLA), which this engine does not implement.
  c.mla_use_nope = r.get_bool("mla_use_nope", false);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.bos_token_id = r.get_int("bos_token_id");
  c.eos_token_id = r.get_int("eos_token_id");
  c.pad_token_id = r.get_int("pad_token_id", c.eos_token_id);
  c.model_max_length = r.get_int64("model_max_length", 0);
  c.num_nextn_predict_layers = r.get_int("num_nextn_predict_layers", 0);
  c.rope_theta = r.get_double("rope_theta", c.rope_theta);

  // Fields that would change the math if they held anything else.
  const std::string act = r.get_string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", fmt::format("'{}' is not supported (expected 'silu')", act));
  if (r.has("rope_scaling")) r.fail("rope_scaling", "must be null (the MLA layers use no positions)");

  const json& la = r.require("linear_attn_config");
  if (!la.is_object()) r.fail("linear_attn_config", fmt::format("expected an object, got {}", json_type(la)));
  const FieldReader lr(la, source, "linear_attn_config.");
  c.linear_attn.full_attn_layers = lr.get_int_list("full_attn_layers");
  c.linear_attn.kda_layers = lr.get_int_list("kda_layers");
  c.linear_attn.num_heads = lr.get_int("num_heads");
  c.linear_attn.head_dim = lr.get_int("head_dim");
  c.linear_attn.short_conv_kernel_size = lr.get_int("short_conv_kernel_size", 4);

  validate_config(c, source);
  return c;
}

void validate_config(const ModelConfig& c, const std::string& src) {
  auto need = [&](bool ok, const char* field, const std::string& what) {
    if (!ok) invalid(src, field, what);
  };
  need(c.model_type == "kimi_linear", "model_type",
       fmt::format("'{}' is not supported (expected 'kimi_linear')", c.model_type));
  need(c.dtype == DType::kBF16 || c.dtype == DType::kF16 || c.dtype == DType::kF32, "dtype",
       fmt::format("{} is not supported (expected bfloat16, float16 or float32)", dtype_name(c.dtype)));

  const int L = c.num_hidden_layers;
  need(L >= 1 && L <= kMaxLayers, "num_hidden_layers", fmt::format("{} is out of range [1, {}]", L, kMaxLayers));
  need(c.vocab_size > 0, "vocab_size", fmt::format("{} must be > 0", c.vocab_size));
  // FP8 weights are scaled per 128x128 block and the GEMM tiles assume whole blocks along K and N.
  need(c.hidden_size > 0 && c.hidden_size % 128 == 0, "hidden_size",
       fmt::format("{} must be a positive multiple of 128 (FP8 blocks)", c.hidden_size));
  need(c.intermediate_size > 0 && c.intermediate_size % 128 == 0, "intermediate_size",
       fmt::format("{} must be a positive multiple of 128", c.intermediate_size));
  need(c.moe_intermediate_size > 0 && c.moe_intermediate_size % 128 == 0, "moe_intermediate_size",
       fmt::format("{} must be a positive multiple of 128", c.moe_intermediate_size));
  need(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps), "rms_norm_eps",
       fmt::format("{} must be a finite number > 0", c.rms_norm_eps));
  need(c.first_k_dense_replace >= 0, "first_k_dense_replace", fmt::format("{} must be >= 0", c.first_k_dense_replace));
  need(c.moe_layer_freq >= 1, "moe_layer_freq", fmt::format("{} must be >= 1", c.moe_layer_freq));
  need(c.model_max_length >= 0, "model_max_length", fmt::format("{} must be >= 0", c.model_max_length));
  need(c.num_nextn_predict_layers == 0, "num_nextn_predict_layers",
       fmt::format("{}: multi-token-prediction layers are not supported", c.num_nextn_predict_layers));
  need(!c.tie_word_embeddings, "tie_word_embeddings", "tied embeddings are not supported (Kimi-Linear unties them)");
  for (auto [field, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id},
                           std::pair{"pad_token_id", c.pad_token_id}})
    need(id >= 0 && id < c.vocab_size, field, fmt::format("{} is outside the vocabulary [0, {})", id, c.vocab_size));

  // Layer map: every layer 1..L is exactly one of KDA / MLA.
  std::vector<int> seen(static_cast<size_t>(std::max(L, 0)) + 1, 0);
  for (auto [field, list] : {std::pair{"linear_attn_config.kda_layers", &c.linear_attn.kda_layers},
                             std::pair{"linear_attn_config.full_attn_layers", &c.linear_attn.full_attn_layers}}) {
    for (int n : *list) {
      need(n >= 1 && n <= L, field,
           fmt::format("layer {} is out of range [1, {}] (layer numbers are 1-based)", n, L));
      need(++seen[n] == 1, field, fmt::format("layer {} is listed more than once across kda_layers/full_attn_layers", n));
    }
  }
  for (int n = 1; n <= L; ++n)
    need(seen[n] == 1, "linear_attn_config",
         fmt::format("layer {} (1-based) is in neither kda_layers nor full_attn_layers", n));

  // KDA: the chunked and recurrent kernels are built for K = V = 128.
  need(c.linear_attn.num_heads >= 1, "linear_attn_config.num_heads",
       fmt::format("{} must be >= 1", c.linear_attn.num_heads));
  need(c.linear_attn.head_dim == 128, "linear_attn_config.head_dim",
       fmt::format("{} is not supported (KDA kernels support head_dim 128)", c.linear_attn.head_dim));
  // The conv references take any width; the bound only rejects nonsense (the checkpoint uses 4).
  need(c.linear_attn.short_conv_kernel_size >= 2 && c.linear_attn.short_conv_kernel_size <= 8,
       "linear_attn_config.short_conv_kernel_size",
       fmt::format("{} is out of range [2, 8]", c.linear_attn.short_conv_kernel_size));

  // MLA: the latent-cache kernels are built for exactly the Kimi/DeepSeek shapes, NoPE, no q low-rank.
  need(c.num_attention_heads >= 1, "num_attention_heads", fmt::format("{} must be >= 1", c.num_attention_heads));
  need(c.num_key_value_heads >= 1, "num_key_value_heads", fmt::format("{} must be >= 1", c.num_key_value_heads));
  need(c.qk_nope_head_dim == 128, "qk_nope_head_dim",
       fmt::format("{} is not supported (MLA kernels support 128)", c.qk_nope_head_dim));
  need(c.qk_rope_head_dim == 64, "qk_rope_head_dim",
       fmt::format("{} is not supported (MLA kernels support 64)", c.qk_rope_head_dim));
  need(c.v_head_dim == 128, "v_head_dim", fmt::format("{} is not supported (MLA kernels support 128)", c.v_head_dim));
  need(c.kv_lora_rank == 512, "kv_lora_rank",
       fmt::format("{} is not supported (MLA kernels support 512)", c.kv_lora_rank));
  need(!c.q_lora_rank.has_value(), "q_lora_rank",
       fmt::format("{} is not supported (only null: queries are projected at full rank)", c.q_lora_rank.value_or(0)));
  need(c.mla_use_nope, "mla_use_nope", "must be true (the MLA layers are implemented without RoPE)");

  // MoE routing.
  need(c.num_experts >= 1 && c.num_experts <= 1024, "num_experts", fmt::format("{} is out of range [1, 1024]", c.num_experts));
  const int max_topk = std::min(16, c.num_experts);
  need(c.num_experts_per_token >= 1 && c.num_experts_per_token <= max_topk, "num_experts_per_token",
       fmt::format("{} is out of range [1, {}] (at most 16 and at most num_experts)", c.num_experts_per_token, max_topk));
  need(c.num_shared_experts >= 0, "num_shared_experts", fmt::format("{} must be >= 0", c.num_shared_experts));
  need(c.num_expert_group >= 1 && c.num_experts % c.num_expert_group == 0, "num_expert_group",
       fmt::format("{} must be >= 1 and divide num_experts {}", c.num_expert_group, c.num_experts));
  need(c.topk_group >= 1 && c.topk_group <= c.num_expert_group, "topk_group",
       fmt::format("{} is out of range [1, num_expert_group {}]", c.topk_group, c.num_expert_group));
  need(c.moe_router_activation_func == "sigmoid", "moe_router_activation_func",
       fmt::format("'{}' is not supported (expected 'sigmoid')", c.moe_router_activation_func));
  need(c.routed_scaling_factor > 0 && std::isfinite(c.routed_scaling_factor), "routed_scaling_factor",
       fmt::format("{} must be a finite number > 0", c.routed_scaling_factor));
}

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DS_THROW("{}: cannot open config file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) DS_THROW("{}: read error", path);
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    DS_THROW("{}: not valid JSON: {}", path, e.what());
  }
  return parse_config(j, path);
}

json config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = c.architectures;
  j["model_type"] = c.model_type;
  j["dtype"] = dtype_config_name(c.dtype);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_token"] = c.num_experts_per_token;
  j["num_shared_experts"] = c.num_shared_experts;
  j["num_expert_group"] = c.num_expert_group;
  j["topk_group"] = c.topk_group;
  j["use_grouped_topk"] = c.use_grouped_topk;
  j["moe_renormalize"] = c.moe_renormalize;
  j["moe_router_activation_func"] = c.moe_router_activation_func;
  j["routed_scaling_factor"] = float_for_json(c.routed_scaling_factor);
  j["rms_norm_eps"] = float_for_json(c.rms_norm_eps);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["mla_use_nope"] = c.mla_use_nope;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["pad_token_id"] = c.pad_token_id;
  j["model_max_length"] = c.model_max_length;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["linear_attn_config"] = {
      {"full_attn_layers", c.linear_attn.full_attn_layers},
      {"kda_layers", c.linear_attn.kda_layers},
      {"num_heads", c.linear_attn.num_heads},
      {"head_dim", c.linear_attn.head_dim},
      {"short_conv_kernel_size", c.linear_attn.short_conv_kernel_size},
  };
  return j;
}

}  // namespace ds
