// Expected tensor inventory, WeightSet, validation, deterministic random init, checkpoint I/O, FP8 block scales.
#include "model/weights.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "model/safetensors.h"

namespace ds {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kFp8Block = 128;  // DeepSeek-V3-style 128x128 weight blocks

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Layer projections and experts may be stored block-scaled FP8 (e4m3 + weight_scale_inv). Embeddings, lm_head
// and the router stay 16/32-bit: the router's logits are computed in fp32, where top-k flips are silent.
bool fp8_allowed(const TensorSpec& s) {
  if (s.shape.size() != 2 || s.name.rfind("model.layers.", 0) != 0) return false;
  return !ends_with(s.name, "block_sparse_moe.gate.weight");
}

}  // namespace

// ------------------------------------------------------------------------------------------ tensor inventory

std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& c) {
  // Small fp32 parameters stay fp32 in the checkpoint (spec section 2); everything else uses the model dtype.
  const DType w = (c.dtype == DType::kF32 || c.dtype == DType::kF16) ? c.dtype : DType::kBF16;
  const DType f32 = DType::kF32;
  const int64_t D = c.hidden_size, H = c.linear_attn.num_heads, K = c.linear_attn.head_dim;
  const int64_t P = H * K, W = c.linear_attn.short_conv_kernel_size;
  const int64_t Hm = c.num_attention_heads, L = c.kv_lora_rank;
  const int64_t I = c.moe_intermediate_size, E = c.num_experts;

  std::vector<TensorSpec> v;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType t) { v.push_back({std::move(name), std::move(shape), t}); };
  add("model.embed_tokens.weight", {c.vocab_size, D}, w);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {D}, w);
    add(p + "post_attention_layernorm.weight", {D}, w);
    const std::string a = p + "self_attn.";
    if (c.is_kda_layer(i)) {
      for (const char* x : {"q", "k", "v"}) add(a + x + "_proj.weight", {P, D}, w);
      for (const char* x : {"q", "k", "v"}) add(a + x + "_conv1d.weight", {P, 1, W}, w);
      add(a + "f_a_proj.weight", {K, D}, w);  // forget gate, low rank K
      add(a + "f_b_proj.weight", {P, K}, w);
      add(a + "dt_bias", {P}, f32);
      add(a + "A_log", {1, 1, H, 1}, f32);
      add(a + "b_proj.weight", {H, D}, w);
      add(a + "g_a_proj.weight", {K, D}, w);  // output gate, low rank K
      add(a + "g_b_proj.weight", {P, K}, w);
      add(a + "o_norm.weight", {K}, w);
      add(a + "o_proj.weight", {D, P}, w);
    } else {
      add(a + "q_proj.weight", {Hm * c.mla_qk_head_dim(), D}, w);
      add(a + "kv_a_proj_with_mqa.weight", {c.mla_latent_dim(), D}, w);
      add(a + "kv_a_layernorm.weight", {L}, w);
      add(a + "kv_b_proj.weight", {Hm * (c.qk_nope_head_dim + c.v_head_dim), L}, w);
      add(a + "o_proj.weight", {D, Hm * c.v_head_dim}, w);
    }
    if (c.is_moe_layer(i)) {
      const std::string m = p + "block_sparse_moe.";
      add(m + "gate.weight", {E, D}, w);
      add(m + "gate.e_score_correction_bias", {E}, f32);
      for (int e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", m, e);
        add(x + "w1.weight", {I, D}, w);
        add(x + "w2.weight", {D, I}, w);
        add(x + "w3.weight", {I, D}, w);
      }
      if (c.num_shared_experts > 0) {
        const int64_t Is = I * c.num_shared_experts;
        add(m + "shared_experts.gate_proj.weight", {Is, D}, w);
        add(m + "shared_experts.up_proj.weight", {Is, D}, w);
        add(m + "shared_experts.down_proj.weight", {D, Is}, w);
      }
    } else {
      // Layers before first_k_dense_replace (and off the moe_layer_freq grid) run a dense SwiGLU.
      add(p + "mlp.gate_proj.weight", {c.intermediate_size, D}, w);
      add(p + "mlp.up_proj.weight", {c.intermediate_size, D}, w);
      add(p + "mlp.down_proj.weight", {D, c.intermediate_size}, w);
    }
  }
  add("model.norm.weight", {D}, w);
  add("lm_head.weight", {c.vocab_size, D}, w);
  return v;
}

// ------------------------------------------------------------------------------------------ WeightSet

WeightSet::WeightSet() = default;
WeightSet::~WeightSet() = default;
WeightSet::WeightSet(WeightSet&&) noexcept = default;
WeightSet& WeightSet::operator=(WeightSet&&) noexcept = default;

bool WeightSet::has(const std::string& name) const { return views_.count(name) != 0; }

const TensorView& WeightSet::get(const std::string& name) const {
  auto it = views_.find(name);
  if (it == views_.end()) DS_THROW("weights: tensor '{}' not found", name);
  return it->second;
}

void WeightSet::put(const std::string& name, HostTensor t) {
  // std::map nodes never move, so the view into the owned buffer stays valid (also across WeightSet moves).
  HostTensor& slot = owned_[name] = std::move(t);
  views_[name] = slot.view();
}

void WeightSet::put_view(const std::string& name, const TensorView& v) {
  owned_.erase(name);
  views_[name] = v;
}

std::vector<std::string> WeightSet::names() const {
  std::vector<std::string> r;
  r.reserve(views_.size());
  for (const auto& kv : views_) r.push_back(kv.first);
  return r;
}

void WeightSet::keep_alive(std::shared_ptr<SafetensorsFile> f) { files_.push_back(std::move(f)); }

std::vector<float> WeightSet::get_f32(const std::string& name) const {
  const TensorView& v = get(name);
  if (v.dtype == DType::kF8E4M3) {
    const std::string s = name + "_scale_inv";
    if (!has(s)) DS_THROW("weights: tensor '{}' is e4m3 but '{}' is missing", name, s);
    return dequant_fp8_block(v, get(s));
  }
  if (v.dtype != DType::kF32 && v.dtype != DType::kBF16 && v.dtype != DType::kF16 && v.dtype != DType::kF64)
    DS_THROW("weights: tensor '{}': dtype {} cannot be read as a float weight", name, dtype_name(v.dtype));
  if (!v.is_contiguous()) DS_THROW("weights: tensor '{}' is not contiguous", name);
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_f32(v.data, v.dtype, i);
  return out;
}

// ------------------------------------------------------------------------------------------ validation

namespace {

using Locate = std::function<std::string(const std::string&)>;

void validate_impl(const ModelConfig& c, const WeightSet& w, const Locate& where) {
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    if (!w.has(s.name))
      DS_THROW("{}: missing tensor '{}' (expected {} {})", where(s.name), s.name, dtype_name(s.dtype), shape_str(s.shape));
    const TensorView& v = w.get(s.name);
    if (v.dims() != s.shape)
      DS_THROW("{}: tensor '{}': shape {} but the config needs {}", where(s.name), s.name, v.shape_str(),
               shape_str(s.shape));
    const bool fp16ish = v.dtype == DType::kBF16 || v.dtype == DType::kF16 || v.dtype == DType::kF32;
    const bool fp8 = v.dtype == DType::kF8E4M3 && fp8_allowed(s);
    if (!fp16ish && !fp8)
      DS_THROW("{}: tensor '{}': dtype {} is not supported (expected bf16, f16 or f32{})", where(s.name), s.name,
               dtype_name(v.dtype), fp8_allowed(s) ? ", or f8e4m3 with weight_scale_inv" : "");
    if (fp8) {
      const std::string sn = s.name + "_scale_inv";
      const std::vector<int64_t> want = {ceil_div(s.shape[0], kFp8Block), ceil_div(s.shape[1], kFp8Block)};
      if (!w.has(sn)) DS_THROW("{}: tensor '{}' is f8e4m3 but '{}' is missing", where(s.name), s.name, sn);
      const TensorView& sv = w.get(sn);
      if (sv.dtype != DType::kF32 || sv.dims() != want)
        DS_THROW("{}: tensor '{}': {} {} but f32 {} is needed", where(sn), sn, dtype_name(sv.dtype), sv.shape_str(),
                 shape_str(want));
    }
  }
}

}  // namespace

void validate_weights(const ModelConfig& c, const WeightSet& w) {
  validate_impl(c, w, [](const std::string&) { return std::string("weights"); });
}

// ------------------------------------------------------------------------------------------ random init

namespace {

// Own uniform/normal draws on top of mt19937_64: std::normal_distribution differs between standard libraries,
// and the weights must be the same everywhere (tests compare logits across machines).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1p-53; }  // [0, 1)
  double normal() {                                                       // Box-Muller, pairs cached
    if (has_spare_) { has_spare_ = false; return spare_; }
    const double u1 = static_cast<double>((g_() >> 11) + 1) * 0x1p-53;  // (0, 1]: log is finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 6.283185307179586 * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  std::mt19937_64 g_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// Fills `t` with draw() per element, converting to its dtype (the loop is the whole cost for 48B: keep it
// free of indirect calls).
template <class Draw>
void fill(HostTensor* t, Draw&& draw) {
  const size_t numel = static_cast<size_t>(t->numel());
  if (t->dtype() == DType::kBF16) {
    for (size_t i = 0; i < numel; ++i) t->ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(draw()));
  } else if (t->dtype() == DType::kF32) {
    for (size_t i = 0; i < numel; ++i) t->ptr<float>()[i] = static_cast<float>(draw());
  } else {
    for (size_t i = 0; i < numel; ++i) t->set_f32(i, static_cast<float>(draw()));
  }
}

}  // namespace

HostTensor random_tensor(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
  // Each tensor has its own stream (seed x name): any subset, in any order or in parallel, gives the same values.
  Rng rng(splitmix64(seed ^ splitmix64(fnv1a(spec.name))));
  HostTensor t(spec.dtype, spec.shape);
  const std::string& n = spec.name;
  const int64_t fan_in = spec.shape.size() == 2 ? spec.shape[1] : 1;
  // Residual-branch outputs are scaled down so the residual stream grows ~ sqrt(depth) at most.
  const double out_scale = 0.5 / std::sqrt(2.0 * c.num_hidden_layers);
  enum class Init { kOne, kNormal, kALog, kDtBias } init = Init::kNormal;
  double sd = 1.0;  // for kNormal
  if (ends_with(n, "norm.weight")) {
    init = Init::kOne;  // every RMSNorm (input/post/final, o_norm, kv_a_layernorm)
  } else if (ends_with(n, "_conv1d.weight")) {
    sd = 0.5;
  } else if (ends_with(n, "A_log")) {
    init = Init::kALog;
  } else if (ends_with(n, "dt_bias")) {
    init = Init::kDtBias;
  } else if (ends_with(n, "e_score_correction_bias")) {
    sd = 0.01;
  } else if (n == "model.embed_tokens.weight") {
    sd = 1.0;
  } else if (spec.shape.size() == 2) {
    const bool out_proj = ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight") || ends_with(n, "w2.weight");
    sd = (out_proj ? out_scale : 1.0) / std::sqrt(static_cast<double>(fan_in));
  } else {
    DS_THROW("random_tensor: no init rule for tensor '{}' {}", n, shape_str(spec.shape));
  }
  switch (init) {
    case Init::kOne: fill(&t, [] { return 1.0; }); break;
    case Init::kNormal: fill(&t, [&] { return sd * rng.normal(); }); break;
    // Decay rate exp(A_log) in [1, 16).
    case Init::kALog: fill(&t, [&] { return std::log(1.0 + 15.0 * rng.uniform()); }); break;
    // softplus(dt_bias) in [0.001, 0.1): inverse softplus y -> log(expm1(y)).
    case Init::kDtBias: fill(&t, [&] { return std::log(std::expm1(0.001 + 0.099 * rng.uniform())); }); break;
  }
  return t;
}

WeightSet random_weights(const ModelConfig& c, uint64_t seed) {
  validate_config(c, "random_weights");
  // Tensors are generated in parallel: each has its own stream, so the values do not depend on the order or the
  // thread count. Largest first, so the two [V, D] tables do not end up last on one thread.
  const std::vector<TensorSpec> specs = checkpoint_tensor_specs(c);
  std::vector<size_t> order(specs.size());
  std::vector<int64_t> numel(specs.size(), 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    order[i] = i;
    for (int64_t d : specs[i].shape) numel[i] *= d;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numel[a] > numel[b]; });
  std::vector<HostTensor> tensors(specs.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      try {
        tensors[order[k]] = random_tensor(c, specs[order[k]], seed);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = order.size();
      }
    }
  };
  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), specs.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  WeightSet w;
  for (size_t i = 0; i < specs.size(); ++i) w.put(specs[i].name, std::move(tensors[i]));
  return w;
}

// ------------------------------------------------------------------------------------------ checkpoint I/O

namespace {

void write_config_json(const fs::path& dir, const ModelConfig& c) {
  const fs::path path = dir / "config.json";
  const std::string tmp = fmt::format("{}.tmp.{}", path.string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << config_to_json(c).dump(2) << "\n";
    out.close();
    if (!out) DS_THROW("{}: cannot write", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) DS_THROW("{}: cannot rename into place: {}", path.string(), ec.message());
}

// Adds a file's tensor to `w` as a zero-copy view, or as a copy when a non-padding writer left it misaligned
// for its element type (kernels and the CPU reference read whole elements).
void add_from_file(WeightSet* w, const SafetensorsFile& f, const std::string& name) {
  const TensorView v = f.view(name);
  if (reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype) == 0) return w->put_view(name, v);
  HostTensor t(v.dtype, v.dims());
  std::memcpy(t.bytes(), v.data, v.nbytes());
  w->put(name, std::move(t));
}

}  // namespace

Checkpoint load_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  Checkpoint ck;
  ck.config = load_config((d / "config.json").string());
  const fs::path index = d / "model.safetensors.index.json", single = d / "model.safetensors";
  std::map<std::string, std::string> where;  // tensor -> file, for error messages
  std::string default_source;
  if (fs::exists(index)) {
    default_source = index.string();
    SafetensorsShards shards = open_safetensors_index(index.string());
    for (const auto& [name, f] : shards.tensor_file) {
      add_from_file(&ck.weights, *f, name);
      where[name] = f->path();
    }
    for (auto& f : shards.files) ck.weights.keep_alive(f);
  } else if (fs::exists(single)) {
    default_source = single.string();
    auto f = SafetensorsFile::open(single.string());
    for (const std::string& name : f->names()) {
      add_from_file(&ck.weights, *f, name);
      where[name] = f->path();
    }
    ck.weights.keep_alive(f);
  } else {
    DS_THROW("{}: neither model.safetensors nor model.safetensors.index.json exists", dir);
  }
  validate_impl(ck.config, ck.weights, [&](const std::string& name) {
    auto it = where.find(name);
    return it != where.end() ? it->second : default_source;
  });
  LOG_DEBUG("loaded {} tensors from {}", ck.weights.names().size(), dir);
  return ck;
}

void save_checkpoint(const std::string& dir, const ModelConfig& c, const WeightSet& w) {
  validate_config(c, dir + "/config.json");
  validate_weights(c, w);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : w.names()) tensors.emplace_back(name, w.get(name));
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_config_json(dir, c);
}

void save_random_checkpoint(const std::string& dir, const ModelConfig& c, uint64_t seed) {
  validate_config(c, dir + "/config.json");
  fs::create_directories(dir);
  const std::vector<TensorSpec> specs = checkpoint_tensor_specs(c);
  std::vector<SafetensorsEntry> entries;
  for (const TensorSpec& s : specs) entries.push_back({s.name, s.dtype, s.shape});
  HostTensor current;  // only one tensor in memory at a time
  write_safetensors_streaming((fs::path(dir) / "model.safetensors").string(), entries, [&](size_t i) {
    current = random_tensor(c, specs[i], seed);
    return current.view();
  }, {{"format", "pt"}});
  write_config_json(dir, c);
}

// ------------------------------------------------------------------------------------------ FP8 blocks

std::vector<float> dequant_fp8_block(const TensorView& w, const TensorView& scale_inv) {
  if (w.dtype != DType::kF8E4M3 || w.ndim != 2 || !w.is_contiguous())
    DS_THROW("dequant_fp8_block: weight must be contiguous 2-D f8e4m3, got {} {}", dtype_name(w.dtype), w.shape_str());
  const int64_t N = w.size(0), K = w.size(1), KB = ceil_div(K, kFp8Block);
  const std::vector<int64_t> want = {ceil_div(N, kFp8Block), KB};
  if (scale_inv.dtype != DType::kF32 || scale_inv.dims() != want || !scale_inv.is_contiguous())
    DS_THROW("dequant_fp8_block: scale_inv for weight {} must be contiguous f32 {}, got {} {}", w.shape_str(),
             shape_str(want), dtype_name(scale_inv.dtype), scale_inv.shape_str());
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = e4m3_to_f32(static_cast<uint8_t>(i));
  const auto* q = static_cast<const uint8_t*>(w.data);
  std::vector<float> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      out[n * K + k] = lut[q[n * K + k]] * load_as_f32(scale_inv.data, DType::kF32, (n / kFp8Block) * KB + k / kFp8Block);
  return out;
}

void quant_fp8_block(const float* w, int64_t n, int64_t k, HostTensor* out_w, HostTensor* out_scale_inv) {
  CHECK(n >= 0 && k >= 0, "quant_fp8_block: shape [{}, {}]", n, k);
  const int64_t NB = ceil_div(n, kFp8Block), KB = ceil_div(k, kFp8Block);
  *out_w = HostTensor(DType::kF8E4M3, {n, k});
  *out_scale_inv = HostTensor(DType::kF32, {NB, KB});
  uint8_t* q = out_w->bytes();
  float* s = out_scale_inv->ptr<float>();
  for (int64_t nb = 0; nb < NB; ++nb) {
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t r0 = nb * kFp8Block, r1 = std::min(n, r0 + kFp8Block);
      const int64_t c0 = kb * kFp8Block, c1 = std::min(k, c0 + kFp8Block);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t cc = c0; cc < c1; ++cc) amax = std::max(amax, std::fabs(w[r * k + cc]));
      // An all-zero block gets scale 1 (not 0), so dequantisation never multiplies by 0/0.
      const float si = amax > 0 ? amax / kE4M3Max : 1.0f;
      s[nb * KB + kb] = si;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t cc = c0; cc < c1; ++cc) q[r * k + cc] = f32_to_e4m3(w[r * k + cc] / si);
    }
  }
}

}  // namespace ds
