// The device model's memory plan (cuda_model_plan.h), the kernels' config checks and device_model_bytes: host
// arithmetic only, built in CPU-only builds too.
#include "runtime/cuda_model_plan.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "kernels/mla/mla.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/norm.h"

namespace ds {

namespace devmodel {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

class Builder {
 public:
  Builder(const ModelConfig& c, const IsFp8& is_fp8) : is_fp8_(is_fp8) {
    for (TensorSpec& s : checkpoint_tensor_specs(c)) specs_.emplace(s.name, std::move(s));
  }

  // A piece: checkpoint tensor `name` at rows [row0, ...) of a destination with `cols` columns.
  Piece piece(const std::string& name, int64_t row0, int64_t cols) const {
    const TensorSpec& spec = find(name);
    const int64_t numel = numel_of(spec);
    CHECK(numel % cols == 0, "device model plan: tensor '{}' ({} elements) is not whole rows of {}", name, numel, cols);
    return Piece{spec, row0, numel / cols, 0, 0, cols};
  }
  // Rows [src_row0, src_row0 + rows) of tensor `name` seen as rows of `cols`, at dest row row0.
  Piece rows_of(const std::string& name, int64_t row0, int64_t cols, int64_t src_row0, int64_t rows) const {
    Piece p = piece(name, row0, cols);
    CHECK(src_row0 >= 0 && src_row0 + rows <= p.rows, "device model plan: rows [{}, {}) of '{}' ({} rows)", src_row0,
          src_row0 + rows, name, p.rows);
    p.src_row0 = src_row0;
    p.rows = rows;
    return p;
  }
  // Columns [src_col0, src_col0 + cols) of tensor `name` seen as rows of `src_cols` (every row), at dest row row0.
  Piece cols_of(const std::string& name, int64_t row0, int64_t src_cols, int64_t src_col0, int64_t cols) const {
    Piece p = piece(name, row0, src_cols);
    CHECK(src_col0 >= 0 && src_col0 + cols <= src_cols, "device model plan: columns [{}, {}) of '{}' ({} columns)",
          src_col0, src_col0 + cols, name, src_cols);
    p.src_col0 = src_col0;
    return p;
  }
  const TensorSpec& find(const std::string& name) const {
    auto it = specs_.find(name);
    CHECK(it != specs_.end(), "device model plan: no checkpoint tensor '{}'", name);
    return it->second;
  }
  static int64_t numel_of(const TensorSpec& s) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    return n;
  }

  bool src_fp8(const Piece& p) const { return is_fp8_ && is_fp8_(p.spec.name); }

  // FP8 blocks are 128x128: each piece must start on a block edge (its checkpoint scales then stack as rows do)
  // and the row length must be whole blocks.
  static bool fp8_possible(const std::vector<Piece>& pieces, int64_t cols) {
    if (cols % kBlock != 0) return false;
    for (const Piece& p : pieces)
      if (p.row0 % kBlock != 0) return false;
    return true;
  }
  bool wants_fp8(bool requested, const std::vector<Piece>& pieces, int64_t cols) const {
    bool any = requested;
    for (const Piece& p : pieces) any = any || src_fp8(p);
    return any && fp8_possible(pieces, cols);
  }

  // scale_pitch: floats per FP8 scale row; 0 = cols/128 (the MoE layout).
  void add(std::string what, Kind kind, int64_t rows, int64_t cols, std::vector<Piece> pieces,
           std::function<void(void*, void*, int)> bind, int64_t scale_pitch = 0) {
    Dest d;
    d.scale_pitch = scale_pitch > 0 ? scale_pitch : cols / kBlock;
    d.what = std::move(what);
    d.kind = kind;
    d.rows = rows;
    d.cols = cols;
    d.pieces = std::move(pieces);
    for (const Piece& p : d.pieces)
      if (p.sliced(cols))
        plan_.slice_scratch_bytes =
            std::max(plan_.slice_scratch_bytes, static_cast<size_t>(p.numel()) * (kind == Kind::kF32 ? 4 : 2));
    d.bind = std::move(bind);
    d.offset = plan_.bytes;
    plan_.bytes += align_up(d.data_bytes());
    if (kind == Kind::kFP8) {
      d.scale_offset = plan_.bytes;
      plan_.bytes += align_up(d.scale_bytes());
      for (const Piece& p : d.pieces)
        plan_.quant_scratch_bytes = std::max(plan_.quant_scratch_bytes, static_cast<size_t>(p.rows * cols) * 2);
    }
    plan_.dests.push_back(std::move(d));
  }

  // A GEMM weight [rows, cols] as DeviceLinear: FP8 per wants_fp8, else bf16.
  void linear(std::string what, bool fp8_requested, int64_t rows, int64_t cols, std::vector<Piece> pieces,
              DeviceLinear* out) {
    const bool fp8 = wants_fp8(fp8_requested, pieces, cols);
    linear_as(std::move(what), fp8, rows, cols, std::move(pieces), out);
  }
  void linear_as(std::string what, bool fp8, int64_t rows, int64_t cols, std::vector<Piece> pieces, DeviceLinear* out) {
    const int64_t pitch = gemm::w_scale_cols(cols);  // cuBLASLt reads 16-byte scale rows (gemm.h)
    add(
        std::move(what), fp8 ? Kind::kFP8 : Kind::kBF16, rows, cols, std::move(pieces),
        [out, fp8, rows, cols, pitch](void* data, void* scale, int dev) {
          out->w = TensorView(data, fp8 ? DType::kF8E4M3 : DType::kBF16, {rows, cols}, Device::kCUDA, dev);
          out->scale =
              fp8 ? TensorView(scale, DType::kF32, {ceil_div(rows, kBlock), pitch}, Device::kCUDA, dev) : TensorView();
        },
        pitch);
  }
  template <class T>
  void raw(std::string what, Kind kind, int64_t rows, int64_t cols, std::vector<Piece> pieces, const T** out) {
    add(std::move(what), kind, rows, cols, std::move(pieces),
        [out](void* data, void*, int) { *out = static_cast<const T*>(data); });
  }
  // A one-tensor vector (norm weight, bias): [1, n].
  template <class T>
  void vec(std::string what, Kind kind, const std::string& name, int64_t n, const T** out) {
    raw(std::move(what), kind, 1, n, {piece(name, 0, n)}, out);
  }

  Plan take() { return std::move(plan_); }

 private:
  const IsFp8& is_fp8_;
  std::map<std::string, TensorSpec> specs_;
  Plan plan_;
};

}  // namespace

int64_t Piece::numel() const {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  return n;
}
bool Piece::sliced(int64_t dest_cols) const {
  const int64_t sc = src_cols > 0 ? src_cols : dest_cols;
  return src_row0 != 0 || src_col0 != 0 || sc != dest_cols || rows * dest_cols != numel();
}

size_t Dest::data_bytes() const {
  const size_t n = static_cast<size_t>(rows * cols);
  return kind == Kind::kF32 ? n * 4 : kind == Kind::kBF16 ? n * 2 : n;
}
size_t Dest::scale_bytes() const {
  return kind == Kind::kFP8 ? static_cast<size_t>(ceil_div(rows, kBlock) * scale_pitch) * 4 : 0;
}
int64_t Dest::covered_rows() const {
  int64_t r = 0;
  for (const Piece& p : pieces) r += p.rows;
  return r;
}

Plan plan_device_model(const ModelConfig& c, const DeviceModelOptions& o, const IsFp8& is_fp8, DeviceModel* m) {
  if (auto why = device_shard_unsupported(c, o)) DS_THROW("device model plan: {}", *why);
  Builder b(c, is_fp8);
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const int64_t H = c.linear_attn.num_heads, K = c.linear_attn.head_dim, P = H * K;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  const int64_t Hm = c.num_attention_heads, Lr = c.kv_lora_rank, qk = c.mla_qk_head_dim();
  const int64_t Id = c.intermediate_size, I = c.moe_intermediate_size, E = c.num_experts;
  const int64_t Is = I * c.num_shared_experts;
  m->config = c;
  m->options = o;
  m->layers.assign(static_cast<size_t>(c.num_hidden_layers), DeviceLayer{});

  // This rank's slice: TEP splits heads and the dense FFN rows over tp ranks (each rank a contiguous block),
  // experts over ep ranks; everything else is whole (replicated).
  DeviceShard& sh = m->shard;
  sh.tp_rank = o.tp_rank;
  sh.tp_size = o.tp_size;
  sh.ep_rank = o.ep_rank;
  sh.ep_size = o.ep_size;
  const int64_t tp = o.tp_size, tr = o.tp_rank;
  const int64_t Hl = H / tp, h0 = tr * Hl, Pl = Hl * K;       // KDA
  const int64_t Hml = Hm / tp, m0 = tr * Hml, Rql = Hml * qk;  // MLA
  const int64_t Idl = Id / tp, i0 = tr * Idl;                  // dense FFN
  const int64_t EL = E / o.ep_size, e0 = o.ep_rank * EL;       // experts
  sh.kda_heads = static_cast<int>(Hl);
  sh.mla_heads = static_cast<int>(Hml);
  sh.dense_I = static_cast<int>(Idl);
  sh.expert_begin = static_cast<int>(e0);
  sh.expert_end = static_cast<int>(e0 + EL);
  sh.shared_dense = c.num_shared_experts > 0 && sh.data_parallel();
  sh.shared_in_moe = c.num_shared_experts > 0 && !sh.shared_dense && tr == 0;

  b.raw("embed_tokens", Kind::kBF16, V, D, {b.piece("model.embed_tokens.weight", 0, D)}, &m->embed);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    DeviceLayer& L = m->layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i), a = p + "self_attn.", tag = fmt::format("layer {} ", i);
    L.kda = c.is_kda_layer(i);
    L.moe = c.is_moe_layer(i);
    b.vec(tag + "input_layernorm", Kind::kBF16, p + "input_layernorm.weight", D, &L.input_norm);
    b.vec(tag + "post_attention_layernorm", Kind::kBF16, p + "post_attention_layernorm.weight", D, &L.post_norm);
    if (L.kda) {
      KdaLayerWeights& k = L.k;
      k.col_q = 0;
      k.col_k = static_cast<int>(Pl);
      k.col_v = static_cast<int>(2 * Pl);
      k.col_fa = static_cast<int>(3 * Pl);
      k.col_ga = static_cast<int>(3 * Pl + K);
      k.col_b = static_cast<int>(3 * Pl + 2 * K);
      k.proj_cols = static_cast<int>(ceil_div(3 * Pl + 2 * K + Hl, kProjRowPad) * kProjRowPad);
      // q/k/v/b rows of this rank's heads; the low-rank f_a / g_a projections are whole on every rank.
      if (o.fp8 && o.fp8_kda_proj && o.kda_gates_bf16) {  // q/k/v in FP8 (3 Pl rows: 128-row blocks), gates bf16
        b.linear(tag + "KDA proj q/k/v", true, 3 * Pl, D,
                 {b.rows_of(a + "q_proj.weight", k.col_q, D, h0 * K, Pl),
                  b.rows_of(a + "k_proj.weight", k.col_k, D, h0 * K, Pl),
                  b.rows_of(a + "v_proj.weight", k.col_v, D, h0 * K, Pl)},
                 &k.proj);
        const int64_t g0 = k.col_fa;  // the gates' first row in the packed layout
        b.linear_as(tag + "KDA proj gates", false, k.proj_cols - g0, D,
                    {b.piece(a + "f_a_proj.weight", k.col_fa - g0, D), b.piece(a + "g_a_proj.weight", k.col_ga - g0, D),
                     b.rows_of(a + "b_proj.weight", k.col_b - g0, D, h0, Hl)},
                    &k.proj_gates);
      } else {
        b.linear(tag + "KDA proj", o.fp8 && o.fp8_kda_proj, k.proj_cols, D,
                 {b.rows_of(a + "q_proj.weight", k.col_q, D, h0 * K, Pl),
                  b.rows_of(a + "k_proj.weight", k.col_k, D, h0 * K, Pl),
                  b.rows_of(a + "v_proj.weight", k.col_v, D, h0 * K, Pl), b.piece(a + "f_a_proj.weight", k.col_fa, D),
                  b.piece(a + "g_a_proj.weight", k.col_ga, D), b.rows_of(a + "b_proj.weight", k.col_b, D, h0, Hl)},
                 &k.proj);
      }
      b.linear_as(tag + "KDA f_b_proj", false, Pl, K, {b.rows_of(a + "f_b_proj.weight", 0, K, h0 * K, Pl)}, &k.f_b);
      b.linear_as(tag + "KDA g_b_proj", false, Pl, K, {b.rows_of(a + "g_b_proj.weight", 0, K, h0 * K, Pl)}, &k.g_b);
      // o_proj columns of this rank's heads: its output is a partial sum (all-reduced by the forward).
      b.linear(tag + "KDA o_proj", o.fp8, D, Pl, {b.cols_of(a + "o_proj.weight", 0, P, h0 * K, Pl)}, &k.o_proj);
      b.raw(tag + "KDA conv_w", Kind::kBF16, 3 * Pl, W,
            {b.rows_of(a + "q_conv1d.weight", 0, W, h0 * K, Pl), b.rows_of(a + "k_conv1d.weight", Pl, W, h0 * K, Pl),
             b.rows_of(a + "v_conv1d.weight", 2 * Pl, W, h0 * K, Pl)},
            &k.conv_w);
      b.raw(tag + "KDA A_log", Kind::kF32, 1, Hl, {b.cols_of(a + "A_log", 0, H, h0, Hl)}, &k.A_log);
      b.raw(tag + "KDA dt_bias", Kind::kF32, 1, Pl, {b.cols_of(a + "dt_bias", 0, P, h0 * K, Pl)}, &k.dt_bias);
      b.vec(tag + "KDA o_norm", Kind::kF32, a + "o_norm.weight", K, &k.o_norm);
    } else {
      MlaLayerWeights& ml = L.m;
      const int64_t R = c.mla_latent_dim();
      const int64_t kvb = c.qk_nope_head_dim + c.v_head_dim;
      // [q_proj rows of this rank's heads ; kv_a_proj_with_mqa whole]: the layout of mla::pack_fused_a_weight.
      b.linear(tag + "MLA fused_a", o.fp8, Rql + R, D,
               {b.rows_of(a + "q_proj.weight", 0, D, m0 * qk, Rql), b.piece(a + "kv_a_proj_with_mqa.weight", Rql, D)},
               &ml.fused_a);
      b.vec(tag + "MLA kv_a_layernorm", Kind::kBF16, a + "kv_a_layernorm.weight", Lr, &ml.kv_a_norm);
      b.raw(tag + "MLA kv_b_proj", Kind::kBF16, Hml * kvb, Lr,
            {b.rows_of(a + "kv_b_proj.weight", 0, Lr, m0 * kvb, Hml * kvb)}, &ml.kv_b);
      const int64_t ov = Hm * c.v_head_dim, ovl = Hml * c.v_head_dim;
      b.linear(tag + "MLA o_proj", o.fp8, D, ovl, {b.cols_of(a + "o_proj.weight", 0, ov, m0 * c.v_head_dim, ovl)},
               &ml.o_proj);
    }
    if (L.moe) {
      MoeLayerWeights& e = L.e;
      const std::string mp = p + "block_sparse_moe.";
      b.raw(tag + "MoE router", Kind::kBF16, E, D, {b.piece(mp + "gate.weight", 0, D)}, &e.gate_w);
      b.vec(tag + "MoE e_score_correction_bias", Kind::kF32, mp + "gate.e_score_correction_bias", E, &e.gate_bias);
      std::vector<Piece> w13, w2, s13, s2;
      for (int64_t x = e0; x < e0 + EL; ++x) {
        const std::string ep = fmt::format("{}experts.{}.", mp, x);
        w13.push_back(b.piece(ep + "w1.weight", (x - e0) * 2 * I, D));
        w13.push_back(b.piece(ep + "w3.weight", (x - e0) * 2 * I + I, D));
        w2.push_back(b.piece(ep + "w2.weight", (x - e0) * D, I));
      }
      e.has_shared = sh.shared_in_moe;
      if (e.has_shared) {
        s13 = {b.piece(mp + "shared_experts.gate_proj.weight", 0, D), b.piece(mp + "shared_experts.up_proj.weight", Is, D)};
        s2 = {b.piece(mp + "shared_experts.down_proj.weight", 0, Is)};
      }
      // One format for the routed and the shared experts (the MoE op's contract).
      bool any = o.fp8, possible = true;
      for (const auto* set : {&w13, &w2, &s13, &s2}) {
        for (const Piece& pc : *set) any = any || b.src_fp8(pc);
        possible = possible && Builder::fp8_possible(*set, set == &w13 || set == &s13 ? D : (set == &w2 ? I : Is));
      }
      const bool fp8 = any && possible;
      e.format = fp8 ? moe::WeightFormat::kFP8Block : moe::WeightFormat::kBF16;
      const Kind kind = fp8 ? Kind::kFP8 : Kind::kBF16;
      auto set_w = [](const void** w, const void** s) {
        return [w, s](void* data, void* scale, int) {
          *w = data;
          *s = scale;
        };
      };
      b.add(tag + "MoE experts w13", kind, EL * 2 * I, D, std::move(w13), set_w(&e.experts.w13, &e.experts.w13_scale));
      b.add(tag + "MoE experts w2", kind, EL * D, I, std::move(w2), set_w(&e.experts.w2, &e.experts.w2_scale));
      if (e.has_shared) {
        b.add(tag + "MoE shared w13", kind, 2 * Is, D, std::move(s13), set_w(&e.shared.w13, &e.shared.w13_scale));
        b.add(tag + "MoE shared w2", kind, D, Is, std::move(s2), set_w(&e.shared.w2, &e.shared.w2_scale));
      }
      if (sh.shared_dense) {
        b.linear(tag + "MoE shared gate_up (dense)", fp8, 2 * Is, D,
                 {b.piece(mp + "shared_experts.gate_proj.weight", 0, D),
                  b.piece(mp + "shared_experts.up_proj.weight", Is, D)},
                 &e.shared_dense.gate_up);
        b.linear(tag + "MoE shared down (dense)", fp8, D, Is, {b.piece(mp + "shared_experts.down_proj.weight", 0, Is)},
                 &e.shared_dense.down);
      }
    } else {
      DenseFfnWeights& f = L.dense;
      b.linear(tag + "dense gate_up", o.fp8, 2 * Idl, D,
               {b.rows_of(p + "mlp.gate_proj.weight", 0, D, i0, Idl), b.rows_of(p + "mlp.up_proj.weight", Idl, D, i0, Idl)},
               &f.gate_up);
      b.linear(tag + "dense down", o.fp8, D, Idl, {b.cols_of(p + "mlp.down_proj.weight", 0, Id, i0, Idl)}, &f.down);
    }
  }
  b.vec("final norm", Kind::kBF16, "model.norm.weight", D, &m->final_norm);
  b.linear_as("lm_head", false, V, D, {b.piece("lm_head.weight", 0, D)}, &m->lm_head);
  if (o.fp8 && o.fp8_lm_head)  // a second copy: prefill-sized steps keep the bf16 weight (cuBLASLt's FP8 GEMM has
                               // no fp32 output)
    b.linear_as("lm_head (FP8 decode copy)", true, V, D, {b.piece("lm_head.weight", 0, D)}, &m->lm_head_fp8);
  Plan plan = b.take();
  m->bytes = plan.bytes;
  return plan;
}

void bind_plan(const Plan& p, char* base, int device) {
  for (const Dest& d : p.dests) d.bind(base + d.offset, d.kind == Kind::kFP8 ? base + d.scale_offset : nullptr, device);
}

}  // namespace devmodel

std::optional<std::string> device_model_unsupported(const ModelConfig& c, const DeviceModelOptions& o) {
  (void)o;
  if (c.num_shared_experts > 1)
    return fmt::format("num_shared_experts = {}: the MoE op runs at most one shared expert (its I must equal the "
                       "routed experts' moe_intermediate_size)",
                       c.num_shared_experts);
  if (c.linear_attn.head_dim != 128)
    return fmt::format("linear_attn_config.head_dim = {}: the KDA kernels are built for 128", c.linear_attn.head_dim);
  if (c.linear_attn.short_conv_kernel_size != 4)
    return fmt::format("linear_attn_config.short_conv_kernel_size = {}: the KDA kernels are built for 4 taps",
                       c.linear_attn.short_conv_kernel_size);
  if (c.hidden_size % 128 != 0)
    return fmt::format("hidden_size = {}: FP8 blocks and the MoE kernels need a multiple of 128", c.hidden_size);
  if (c.moe_intermediate_size % 128 != 0 || c.intermediate_size % 128 != 0)
    return fmt::format("intermediate sizes {} / {} (moe / dense): the MoE and FP8 kernels need multiples of 128",
                       c.moe_intermediate_size, c.intermediate_size);
  if (auto e = norm::rmsnorm_unsupported(c.hidden_size)) return *e;
  bool any_mla = false, any_moe = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    any_mla = any_mla || c.is_mla_layer(i);
    any_moe = any_moe || c.is_moe_layer(i);
  }
  if (any_mla) {
    mla::MlaDims d;
    d.heads = c.num_attention_heads;
    d.latent = c.kv_lora_rank;
    d.rope = c.qk_rope_head_dim;
    d.nope = c.qk_nope_head_dim;
    d.value = c.v_head_dim;
    if (auto e = mla::mla_unsupported(d)) return *e;
  }
  if (any_moe) {
    moe::RouterParams r;
    r.E = c.num_experts;
    r.topk = c.num_experts_per_token;
    r.num_expert_group = c.num_expert_group;
    r.topk_group = c.topk_group;
    r.renormalize = c.moe_renormalize;
    r.routed_scaling_factor = c.routed_scaling_factor;
    if (auto e = moe::moe_route_unsupported(r, c.hidden_size)) return *e;
  }
  return std::nullopt;
}

std::optional<std::string> device_shard_unsupported(const ModelConfig& c, const DeviceModelOptions& o) {
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    return fmt::format("tensor-parallel rank {} of {}", o.tp_rank, o.tp_size);
  if (o.ep_size < 1 || o.ep_rank < 0 || o.ep_rank >= o.ep_size)
    return fmt::format("expert-parallel rank {} of {}", o.ep_rank, o.ep_size);
  if (o.tp_size > 1 && (o.ep_size != o.tp_size || o.ep_rank != o.tp_rank))
    return fmt::format("TEP with tp {} needs ep == tp on the same ranks (got ep rank {} of {}): experts split by "
                       "their intermediate rows (ep 1) are not built",
                       o.tp_size, o.ep_rank, o.ep_size);
  bool any_kda = false, any_mla = false, any_dense = false, any_moe = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    any_kda = any_kda || c.is_kda_layer(i);
    any_mla = any_mla || c.is_mla_layer(i);
    any_moe = any_moe || c.is_moe_layer(i);
    any_dense = any_dense || !c.is_moe_layer(i);
  }
  const int tp = o.tp_size;
  if (any_kda && c.linear_attn.num_heads % tp != 0)
    return fmt::format("{} KDA heads do not split over tp {} ranks", c.linear_attn.num_heads, tp);
  if (any_mla && c.num_attention_heads % tp != 0)
    return fmt::format("{} MLA heads do not split over tp {} ranks", c.num_attention_heads, tp);
  if (any_dense && c.intermediate_size % tp != 0)
    return fmt::format("dense FFN intermediate_size {} does not split over tp {} ranks", c.intermediate_size, tp);
  if (any_moe && c.num_experts % o.ep_size != 0)
    return fmt::format("{} experts do not split over ep {} ranks", c.num_experts, o.ep_size);
  return std::nullopt;
}

size_t device_model_bytes(const ModelConfig& c, const DeviceModelOptions& o) {
  validate_config(c, "device_model_bytes");
  DeviceModel m;
  return devmodel::plan_device_model(c, o, {}, &m).bytes;
}

}  // namespace ds
