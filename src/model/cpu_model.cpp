// The fp32 Kimi-Linear forward on the CPU: embedding, KDA / MLA attention, dense / MoE FFN, final norm, lm_head.
#include "model/cpu_model.h"

#include <algorithm>
#include <cmath>

#include "core/env.h"
#include "core/cpu_math.h"
#include "core/error.h"
#include "kernels/kda/kda_ref.h"
#include "kernels/mla/mla_ref.h"
#include "kernels/norm/norm_ref.h"

namespace ds {

struct CpuModel::KdaWeights {
  std::vector<float> qkv;      // [3P, D] q_proj | k_proj | v_proj stacked: one matmul for the three
  std::vector<float> conv;     // [3P, W] q_conv1d | k_conv1d | v_conv1d
  std::vector<float> f_a, f_b; // [R, D], [P, R] forget-gate low rank
  std::vector<float> g_a, g_b; // [R, D], [P, R] output-gate low rank
  std::vector<float> b;        // [H, D] beta
  std::vector<float> A_log;    // [H]
  std::vector<float> dt_bias;  // [P]
  std::vector<float> o_norm;   // [K]
  std::vector<float> o_proj;   // [D, P]
  int f_rank = 0, g_rank = 0;
};

struct CpuModel::MlaWeights {
  std::vector<float> q;        // [Hm * (Dn + Dr), D]
  std::vector<float> kv_a;     // [L + Dr, D]
  std::vector<float> kv_norm;  // [L]
  std::vector<float> kv_b;     // [Hm * (Dn + Dv), L]
  std::vector<float> o_proj;   // [D, Hm * Dv]
};

struct CpuModel::FfnWeights {
  bool moe = false;
  // Dense (moe == false) or shared expert (moe == true; empty when num_shared_experts == 0).
  std::vector<float> gate, up, down;  // [Ifn, D], [Ifn, D], [D, Ifn]
  int ffn_I = 0;
  // MoE.
  std::vector<float> router;          // [E, D]
  std::vector<float> bias;            // [E] e_score_correction_bias (empty: none)
  std::vector<float> w1, w3, w2;      // [E, I, D], [E, I, D], [E, D, I]
};

struct CpuModel::Layer {
  bool kda = false;
  std::vector<float> input_norm, post_norm;  // [D]
  KdaWeights k;
  MlaWeights m;
  FfnWeights f;
};

namespace {


float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& w, int T, int K, int N) {
  std::vector<float> y(static_cast<size_t>(T) * N);
  cpu_linear(x.data(), w.data(), T, K, N, y.data());
  return y;
}

// Fetches a tensor as fp32 and checks its element count (validate_weights checked shapes already; this guards
// the reshapes done here).
std::vector<float> fetch(const WeightSet& w, const std::string& name, size_t numel) {
  std::vector<float> v = w.get_f32(name);
  CHECK_EQ(v.size(), numel);
  return v;
}

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

}  // namespace

void cpu_linear(const float* x, const float* w, int T, int K, int N, float* y) {
  // Blocks of 32 weight rows stay in L1/L2 while every token row passes over them, so a prefill of T tokens
  // reads the weights once instead of T times.
  constexpr int kRows = 32;
  for (int n0 = 0; n0 < N; n0 += kRows) {
    const int n1 = std::min(N, n0 + kRows);
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * K;
      float* yt = y + static_cast<size_t>(t) * N;
      for (int n = n0; n < n1; ++n) yt[n] = dot_f32(xt, w + static_cast<size_t>(n) * K, K);
    }
  }
}

void SequenceState::reset() {
  for (auto& l : layers) {
    std::fill(l.recurrent.begin(), l.recurrent.end(), 0.0f);
    std::fill(l.conv.begin(), l.conv.end(), 0.0f);
    l.latent.clear();
  }
  num_tokens = 0;
}

CpuModelOptions CpuModelOptions::from_env() {
  CpuModelOptions o;
  o.hf_biased_routing = get_knob(knobs::kHfBiasedRouting) != 0;
  return o;
}

CpuModel::~CpuModel() = default;

CpuModel::CpuModel(const ModelConfig& c, const WeightSet& w, CpuModelOptions options)
    : config_(c), options_(options) {
  validate_config(c);
  validate_weights(c, w);
  CHECK(options_.kda_chunk >= 1, "kda_chunk {}", options_.kda_chunk);
  const size_t D = c.hidden_size, V = c.vocab_size;
  const size_t H = c.linear_attn.num_heads, K = c.linear_attn.head_dim, P = H * K;
  const size_t W = c.linear_attn.short_conv_kernel_size;
  const size_t Hm = c.num_attention_heads, L = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim,
               Dv = c.v_head_dim;
  const size_t E = c.num_experts, I = c.moe_intermediate_size;

  embed_ = fetch(w, "model.embed_tokens.weight", V * D);
  norm_ = fetch(w, "model.norm.weight", D);
  lm_head_ = fetch(w, "lm_head.weight", V * D);

  router_.E = c.num_experts;
  router_.topk = c.num_experts_per_token;
  router_.num_expert_group = c.use_grouped_topk ? c.num_expert_group : 1;
  router_.topk_group = c.use_grouped_topk ? c.topk_group : 1;
  router_.scoring = c.moe_router_activation_func == "softmax" ? moe::ScoringFunc::kSoftmax : moe::ScoringFunc::kSigmoid;
  router_.renormalize = c.moe_renormalize;
  router_.routed_scaling_factor = c.routed_scaling_factor;
  router_.hf_biased_weights = options_.hf_biased_routing;

  layers_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    Layer& l = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    l.input_norm = fetch(w, p + "input_layernorm.weight", D);
    l.post_norm = fetch(w, p + "post_attention_layernorm.weight", D);
    const std::string a = p + "self_attn.";
    if (c.is_kda_layer(i)) {
      l.kda = true;
      KdaWeights& k = l.k;
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) append(k.qkv, fetch(w, a + n + ".weight", P * D));
      for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) append(k.conv, fetch(w, a + n + ".weight", P * W));
      k.f_rank = static_cast<int>(w.get(a + "f_a_proj.weight").size(0));
      k.g_rank = static_cast<int>(w.get(a + "g_a_proj.weight").size(0));
      k.f_a = fetch(w, a + "f_a_proj.weight", k.f_rank * D);
      k.f_b = fetch(w, a + "f_b_proj.weight", P * k.f_rank);
      k.g_a = fetch(w, a + "g_a_proj.weight", k.g_rank * D);
      k.g_b = fetch(w, a + "g_b_proj.weight", P * k.g_rank);
      k.b = fetch(w, a + "b_proj.weight", H * D);
      k.A_log = fetch(w, a + "A_log", H);  // [1, 1, H, 1] flattened
      k.dt_bias = fetch(w, a + "dt_bias", P);
      k.o_norm = fetch(w, a + "o_norm.weight", K);
      k.o_proj = fetch(w, a + "o_proj.weight", D * P);
    } else {
      MlaWeights& m = l.m;
      m.q = fetch(w, a + "q_proj.weight", Hm * (Dn + Dr) * D);
      m.kv_a = fetch(w, a + "kv_a_proj_with_mqa.weight", (L + Dr) * D);
      m.kv_norm = fetch(w, a + "kv_a_layernorm.weight", L);
      m.kv_b = fetch(w, a + "kv_b_proj.weight", Hm * (Dn + Dv) * L);
      m.o_proj = fetch(w, a + "o_proj.weight", D * Hm * Dv);
    }
    FfnWeights& f = l.f;
    if (c.is_moe_layer(i)) {
      f.moe = true;
      const std::string b = p + "block_sparse_moe.";
      f.router = fetch(w, b + "gate.weight", E * D);
      if (w.has(b + "gate.e_score_correction_bias")) f.bias = fetch(w, b + "gate.e_score_correction_bias", E);
      // Experts stacked [E, ...] once here, the layout the grouped expert kernels read.
      for (size_t e = 0; e < E; ++e) {
        const std::string x = b + "experts." + std::to_string(e) + ".";
        append(f.w1, fetch(w, x + "w1.weight", I * D));
        append(f.w3, fetch(w, x + "w3.weight", I * D));
        append(f.w2, fetch(w, x + "w2.weight", D * I));
      }
      if (c.num_shared_experts > 0) {
        f.ffn_I = c.num_shared_experts * c.moe_intermediate_size;
        f.gate = fetch(w, b + "shared_experts.gate_proj.weight", f.ffn_I * D);
        f.up = fetch(w, b + "shared_experts.up_proj.weight", f.ffn_I * D);
        f.down = fetch(w, b + "shared_experts.down_proj.weight", D * f.ffn_I);
      }
    } else {
      f.ffn_I = c.intermediate_size;
      f.gate = fetch(w, p + "mlp.gate_proj.weight", f.ffn_I * D);
      f.up = fetch(w, p + "mlp.up_proj.weight", f.ffn_I * D);
      f.down = fetch(w, p + "mlp.down_proj.weight", D * f.ffn_I);
    }
  }
}

SequenceState CpuModel::new_state() const {
  const auto& la = config_.linear_attn;
  const size_t P = static_cast<size_t>(la.num_heads) * la.head_dim;
  SequenceState s;
  s.layers.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i].kda) continue;
    s.layers[i].recurrent.assign(static_cast<size_t>(la.num_heads) * la.head_dim * la.head_dim, 0.0f);
    s.layers[i].conv.assign(static_cast<size_t>(la.short_conv_kernel_size - 1) * 3 * P, 0.0f);
  }
  return s;
}

void CpuModel::kda_forward(const Layer& l, const float* x_ptr, int T, LayerState& s, float* out) const {
  const auto& la = config_.linear_attn;
  const int D = config_.hidden_size, H = la.num_heads, K = la.head_dim, P = H * K, W = la.short_conv_kernel_size;
  const KdaWeights& k = l.k;
  const std::vector<float> x(x_ptr, x_ptr + static_cast<size_t>(T) * D);

  // q, k, v: projection -> causal depthwise conv (state carries the last W-1 inputs) -> SiLU.
  const std::vector<float> qkv_pre = linear(x, k.qkv, T, D, 3 * P);
  std::vector<float> qkv(qkv_pre.size());
  const int32_t cu[2] = {0, T};
  kda::short_conv_ref(qkv_pre.data(), k.conv.data(), cu, 1, 3 * P, W, s.conv.data(), qkv.data());
  std::vector<float> q(static_cast<size_t>(T) * P), kk(q.size()), v(q.size());
  for (int t = 0; t < T; ++t) {
    const float* row = qkv.data() + static_cast<size_t>(t) * 3 * P;
    std::copy(row, row + P, q.begin() + static_cast<size_t>(t) * P);
    std::copy(row + P, row + 2 * P, kk.begin() + static_cast<size_t>(t) * P);
    std::copy(row + 2 * P, row + 3 * P, v.begin() + static_cast<size_t>(t) * P);
  }

  // Per-channel log decay g, and beta.
  const std::vector<float> f = linear(linear(x, k.f_a, T, D, k.f_rank), k.f_b, T, k.f_rank, P);
  std::vector<float> g(f.size());
  kda::gate_ref(f.data(), k.A_log.data(), k.dt_bias.data(), T, H, K, g.data());
  std::vector<float> beta = linear(x, k.b, T, D, H);
  for (auto& b : beta) b = sigmoid(b);

  kda::RecurrenceArgs r;
  r.q = q.data(), r.k = kk.data(), r.v = v.data(), r.g = g.data(), r.beta = beta.data(), r.cu_seqlens = cu;
  r.N = 1, r.H = H, r.K = K, r.V = K;
  r.scale = 1.0f / std::sqrt(static_cast<float>(K));
  r.qk_l2norm = true;
  std::vector<float> o(static_cast<size_t>(T) * P);
  const bool chunked = options_.kda == CpuModelOptions::Kda::kChunked ||
                       (options_.kda == CpuModelOptions::Kda::kAuto && T > 1);
  if (chunked)
    kda::chunked_ref(r, s.recurrent.data(), o.data(), options_.kda_chunk);
  else
    kda::recurrent_ref(r, s.recurrent.data(), o.data());

  // Per-head RMSNorm with o_norm, times sigmoid of the low-rank output gate, then o_proj.
  const std::vector<float> gz = linear(linear(x, k.g_a, T, D, k.g_rank), k.g_b, T, k.g_rank, P);
  std::vector<float> on(o.size());
  kda::gated_rmsnorm_ref(o.data(), gz.data(), k.o_norm.data(), T, H, K, config_.rms_norm_eps, on.data(),
                         options_.kda_o_bf16);
  cpu_linear(on.data(), k.o_proj.data(), T, P, D, out);
}

void CpuModel::mla_forward(const Layer& l, const float* x_ptr, int T, LayerState& s, float* out) const {
  const ModelConfig& c = config_;
  const int D = c.hidden_size, Hm = c.num_attention_heads, L = c.kv_lora_rank, Dn = c.qk_nope_head_dim,
            Dr = c.qk_rope_head_dim, Dv = c.v_head_dim, R = L + Dr;
  const MlaWeights& m = l.m;
  const std::vector<float> x(x_ptr, x_ptr + static_cast<size_t>(T) * D);
  const std::vector<float> q = linear(x, m.q, T, D, Hm * (Dn + Dr));
  const std::vector<float> ckv = linear(x, m.kv_a, T, D, R);

  // Append the new rows to this sequence's latent cache (one contiguous "page").
  const int64_t past = static_cast<int64_t>(s.latent.size() / R);
  const int ctx = static_cast<int>(past + T);
  s.latent.resize(static_cast<size_t>(ctx) * R);
  std::vector<int64_t> slots(T);
  for (int t = 0; t < T; ++t) slots[t] = past + t;
  mla::append_latent_ref(ckv.data(), m.kv_norm.data(), c.rms_norm_eps, slots.data(), T, L, Dr, s.latent.data());

  const int32_t cu[2] = {0, T}, ctx_lens[1] = {ctx}, table[1] = {0};
  std::vector<float> attn(static_cast<size_t>(T) * Hm * Dv);
  mla::AttentionArgs a;
  a.q = q.data(), a.cu_seqlens = cu, a.ctx_lens = ctx_lens;
  a.cache = {s.latent.data(), table, ctx, 1};
  a.wkv_b = m.kv_b.data();
  a.N = 1, a.H = Hm, a.L = L, a.Dn = Dn, a.Dr = Dr, a.Dv = Dv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(Dn + Dr));
  a.out = attn.data();
  const bool absorbed = options_.mla == CpuModelOptions::Mla::kAbsorbed ||
                        (options_.mla == CpuModelOptions::Mla::kAuto && T == 1);
  if (absorbed)
    mla::attention_absorbed_ref(a);
  else
    mla::attention_expanded_ref(a);
  cpu_linear(attn.data(), m.o_proj.data(), T, Hm * Dv, D, out);
}

void CpuModel::ffn_forward(const Layer& l, const float* x, int T, float* h) const {
  const int D = config_.hidden_size;
  const FfnWeights& f = l.f;
  if (!f.moe) {
    std::vector<float> y(static_cast<size_t>(T) * D);
    moe::swiglu_ref(x, f.gate.data(), f.up.data(), f.down.data(), T, D, f.ffn_I, y.data());
    for (size_t i = 0; i < y.size(); ++i) h[i] += y[i];
    return;
  }
  moe::MoeArgs a;
  a.x = x, a.T = T, a.D = D, a.I = config_.moe_intermediate_size;
  a.router = router_;
  std::vector<float> logits(static_cast<size_t>(T) * router_.E);  // router GEMM in fp32, as HF
  cpu_linear(x, f.router.data(), T, D, router_.E, logits.data());
  std::vector<int32_t> ids(static_cast<size_t>(T) * router_.topk);
  std::vector<float> weights(ids.size());
  moe::route_ref(logits.data(), f.bias.empty() ? nullptr : f.bias.data(), T, router_, ids.data(), weights.data());
  a.gate_w = nullptr;  // routed above (separated routing), so the router GEMM uses the fast matmul
  a.topk_ids = ids.data(), a.topk_weights = weights.data();
  a.w1 = f.w1.data(), a.w3 = f.w3.data(), a.w2 = f.w2.data();
  a.shared_I = f.ffn_I;
  a.shared_gate = f.gate.data(), a.shared_up = f.up.data(), a.shared_down = f.down.data();
  a.residual = h, a.out = h;  // h += routed + shared
  moe::moe_ref(a);
}

std::vector<float> CpuModel::forward(const std::vector<int32_t>& tokens, SequenceState& state, bool all_logits) const {
  const int T = static_cast<int>(tokens.size());
  CHECK(T > 0, "forward: empty token batch");
  CHECK_EQ(state.layers.size(), layers_.size());
  const int D = config_.hidden_size, V = config_.vocab_size;
  for (int32_t id : tokens)
    if (id < 0 || id >= V) DS_THROW("token id {} outside the vocabulary [0, {})", id, V);

  std::vector<float> h(static_cast<size_t>(T) * D);  // residual stream
  for (int t = 0; t < T; ++t)
    std::copy_n(embed_.begin() + static_cast<size_t>(tokens[t]) * D, D, h.begin() + static_cast<size_t>(t) * D);

  std::vector<float> a(h.size()), attn(h.size());
  const float eps = config_.rms_norm_eps;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    norm::rmsnorm_ref(h.data(), l.input_norm.data(), T, D, eps, a.data());
    if (l.kda)
      kda_forward(l, a.data(), T, state.layers[i], attn.data());
    else
      mla_forward(l, a.data(), T, state.layers[i], attn.data());
    norm::add_rmsnorm_ref(attn.data(), h.data(), l.post_norm.data(), T, D, eps, a.data());  // h += attn; a = norm(h)
    ffn_forward(l, a.data(), T, h.data());
  }
  state.num_tokens += T;

  const int first = all_logits ? 0 : T - 1, rows = T - first;
  std::vector<float> hn(static_cast<size_t>(rows) * D);
  norm::rmsnorm_ref(h.data() + static_cast<size_t>(first) * D, norm_.data(), rows, D, eps, hn.data());
  std::vector<float> logits(static_cast<size_t>(rows) * V);
  cpu_linear(hn.data(), lm_head_.data(), rows, D, V, logits.data());
  return logits;
}

}  // namespace ds
