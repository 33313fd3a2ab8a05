// The launches of one CudaForward step: embedding, KDA / MLA attention, dense / MoE FFN, head and sampling.
// Every launch reads device pointers only (the step blob and fixed buffers), so a decode step can be captured.
#include "runtime/cuda_forward_impl.h"

#if defined(DELTASERVE_WITH_CUDA)

#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/embed/embed.h"
#include "kernels/mla/mla.h"
#include "kernels/norm/norm.h"
#include "kernels/sampling/sampling.h"
#include "kernels/util/util.h"

namespace ds {

namespace {

int round_up8(int rows) { return (rows + gemm::kFp8RowMultiple - 1) / gemm::kFp8RowMultiple * gemm::kFp8RowMultiple; }

TensorView dev_view(const void* p, DType t, int64_t rows, int64_t cols, int device) {
  return TensorView(const_cast<void*>(p), t, {rows, cols}, Device::kCUDA, device);
}

}  // namespace

void CudaForward::Impl::linear(const char* name, const bf16_t* in, int rows, int K, const DeviceLinear& w,
                               bf16_t* out, const bf16_t* norm_w, const bf16_t* post_norm_w) {
  CHECK_EQ(w.K(), K);
  const int64_t N = w.N();
  cudaStream_t s = stream.get();
  if (!w.fp8() || w8a16(rows)) {  // bf16, or FP8 weights streamed against bf16 x (decode size)
    op(OpCat::kGemm, name, [&] {
      gemm::GemmParams p{dev_view(in, DType::kBF16, rows, K, device), w.w, {}, w.scale,
                         dev_view(out, DType::kBF16, rows, N, device), name, norm_w, cfg.rms_norm_eps};
      if (post_norm_w) {
        p.post_norm_w = post_norm_w;
        p.post_residual = h;
        p.post_out = x;
        p.post_counter = counters + kPostNormCounter;
      }
      gemm.run(p, s);
    });
    return;
  }
  CHECK(!norm_w && !post_norm_w, "{}: a fused input norm or layer boundary needs the decode GEMV path", name);
  const int M = quantize_fp8_rows(name, in, rows, K);
  op(OpCat::kGemm, name, [&] {
    gemm.run({dev_view(xq, DType::kF8E4M3, M, K, device), w.w,
              dev_view(xs, DType::kF32, K / gemm::kFp8Block, M, device), w.scale,
              dev_view(out, DType::kBF16, M, N, device), name},
             s);
  });
}

int CudaForward::Impl::quantize_fp8_rows(const char* name, const bf16_t* x, int rows, int K) {
  const int M = round_up8(rows);
  CHECK(M <= R && K <= max_k, "{}: FP8 scratch holds {} x {}, needs {} x {}", name, R, max_k, M, K);
  op(OpCat::kGemm, "quantize_act_fp8", [&] {
    gemm::QuantActParams q;
    q.x = x;
    q.x_stride = K;
    q.q = xq;
    q.scale = xs;
    q.M = M;
    q.K = K;
    gemm::quantize_act_fp8(q, stream.get());
  });
  return M;
}

int CudaForward::Impl::mla_decode_splits(const StepMetadata& m) const {
  // Padded (graph-shaped) steps: the split count follows the page width class, fixed per graph.
  const int max_ctx = m.bucket > 0 ? static_cast<int>(std::min<int64_t>(int64_t{m.width} * o.page_size, INT32_MAX))
                                    : std::max(m.max_decode_ctx, 1);
  return mla::decode_num_splits(arch, num_sms, m.num_decodes, Hm, max_ctx);
}

void CudaForward::Impl::run(const StepMetadata& m) {
  NvtxRange step_range(m.bucket > 0 ? "decode_step" : "step");
  cudaStream_t s = stream.get();
  const DevMeta d = dev_meta(m.layout);
  const int rows = m.rows;
  const float eps = cfg.rms_norm_eps;

  op(OpCat::kOther, "embed", [&] {
    embed::embed_lookup({d.ids, model->embed, h, rows, V, D}, s);
  });
  bool pending_dense = false;  // the last dense FFN output waits in ffn_out for its residual add
  bool normed = false;         // TEP: the MoE layer boundary already wrote this layer's input norm into x
  const size_t L = model->layers.size();
  for (size_t i = 0; i < L; ++i) {
    const DeviceLayer& l = model->layers[i];
    NvtxRange layer_range(layer_names[i].c_str());
    // Decode: the layer's first projection applies the input norm itself (x is not written; it reads h).
    const bf16_t* in_norm = !normed && !pending_dense && fuses_input_norm(l, rows) ? l.input_norm : nullptr;
    if (!normed && !in_norm)
      op(OpCat::kOther, "input_norm", [&] {
        if (pending_dense)
          norm::add_rmsnorm({ffn_out, h, l.input_norm, x, rows, D, eps}, s);
        else
          norm::rmsnorm({h, D, l.input_norm, x, rows, D, eps}, s);
      });
    pending_dense = false;
    normed = false;
    const bool post = fuses_post_norm(l, rows);  // o_proj's last block applies the boundary below
    if (l.kda)
      kda_layer(l, kda_index[i], m, d, in_norm, post);
    else
      mla_layer(l, mla_index[i], m, d, in_norm, post);
    if (tep) all_reduce_rows("attn.all_reduce", attn_out, rows);  // o_proj over this rank's heads: a partial sum
    const bool pre = !post && l.moe && moe_pre_norm(l, static_cast<int>(i), rows);  // the MoE router applies it
    if (!post && !pre)
      op(OpCat::kOther, "post_attention_norm", [&] {
        norm::add_rmsnorm({attn_out, h, l.post_norm, x, rows, D, eps}, s);
      });
    // The next layer's input norm (the final norm after the last layer), which the TEP boundary always applies
    // and the one-token MoE op may (DELTASERVE_MOE_FUSED_NORM).
    const bf16_t* next_norm = i + 1 < L ? model->layers[i + 1].input_norm : model->final_norm;
    if (l.moe && tep) {
      moe_layer_tep(l, static_cast<int>(i), rows, next_norm);
      normed = true;
    } else if (l.moe && dep) {
      moe_layer_dep(l, static_cast<int>(i), step_tokens);
    } else if (l.moe) {
      normed = moe_layer(l, static_cast<int>(i), m, next_norm, pre);
    } else {
      dense_ffn(l, m);
      if (tep) all_reduce_rows("ffn.all_reduce", ffn_out, rows);  // down over this rank's rows: a partial sum
      pending_dense = true;
    }
  }
  if (m.num_samples > 0) head(m, d, pending_dense, normed);  // a step of partial prefill chunks samples nothing
}

void CudaForward::Impl::all_reduce_rows(const char* name, bf16_t* data, int rows) {
  op(OpCat::kOther, name,
     [&] { group->all_reduce_sum(data, static_cast<size_t>(rows) * D, DType::kBF16, stream.get()); });
}

void CudaForward::Impl::moe_layer_tep(const DeviceLayer& l, int layer, int rows, const bf16_t* next_norm) {
  cudaStream_t s = stream.get();
  const int K = cfg.num_experts_per_token;
  moe::MoeParams p = moe_call(l, layer, rows);
  p.expert_out = moe_expert_out;
  p.shared_out = l.e.has_shared ? moe_shared_out : nullptr;
  p.expanded_to_permuted = moe_e2p;
  if (separated) {
    route_rows(l, layer, rows);
    p.topk_ids_in = topk_ids;
    p.topk_weights_in = topk_w;
  } else {
    p.topk_ids_out = topk_ids;
    p.topk_weights_out = topk_w;
  }
  moe::MoeResult res;
  op(OpCat::kMoe, "moe", [&] { res = moe::moe_forward(p); });
  op(OpCat::kOther, "moe.finalize_all_reduce_norm", [&] {
    parallel::TpFinalizeNormCall c;
    c.T = rows;
    c.expert_out = moe::MoeTensor(moe_expert_out, DType::kBF16, rows, K, D);
    c.expanded_to_permuted = moe::MoeTensor(moe_e2p, DType::kI32, static_cast<int64_t>(rows) * K);
    c.topk_weights = res.topk_weights;  // the weights the op used (pitfalls.md)
    if (l.e.has_shared) c.shared_out = moe::MoeTensor(moe_shared_out, DType::kBF16, rows, D);
    c.residual = h;
    c.norm_w = next_norm;
    c.y = x;
    c.stream = s;
    // The fused kernel spins on its peers (the unfused path's all-reduce too, gated again inside).
    group->run_spinning(s, [&] { fused_boundaries += tp_final->run(c) ? 1 : 0; });
  });
}

bool CudaForward::Impl::on_decode_gemv(const DeviceLinear& w, int rows) const {
  if (rows > gemm::kDecodeMaxRows) return false;
  return w.fp8() ? w8a16(rows) : gemm.uses_gemv();
}

bool CudaForward::Impl::gemv_takes_norm(const DeviceLinear& w, int rows) const {
  return *o.fused_input_norm && D <= gemm::kNormMaxK && on_decode_gemv(w, rows);
}

bool CudaForward::Impl::fuses_input_norm(const DeviceLayer& l, int rows) const {
  if (tep || dep) return false;
  if (l.kda && l.k.split() && !gemv_takes_norm(l.k.proj_gates, rows)) return false;
  return gemv_takes_norm(l.kda ? l.k.proj : l.m.fused_a, rows);
}

void CudaForward::Impl::kda_projection(const KdaLayerWeights& k, const bf16_t* in, int rows, const bf16_t* in_norm) {
  if (!k.split()) {
    linear("kda.proj", in, rows, D, k.proj, proj, in_norm);
    return;
  }
  const int n1 = static_cast<int>(k.proj.N()), n2 = static_cast<int>(k.proj_gates.N());
  if (rows == 1 && w8a16(1) && gemm.uses_gemv()) {  // both decode GEMVs write their columns of the one packed row
    linear("kda.proj", in, 1, D, k.proj, proj, in_norm);
    linear("kda.proj_gates", in, 1, D, k.proj_gates, proj + n1, in_norm);
    return;
  }
  // Dense outputs (an FP8 GEMM writes round_up8(rows) rows), then packed: [q k v | gates] per row.
  bf16_t* gates = proj_parts + static_cast<size_t>(R) * n1;
  linear("kda.proj", in, rows, D, k.proj, proj_parts, in_norm);
  linear("kda.proj_gates", in, rows, D, k.proj_gates, gates, in_norm);
  op(OpCat::kOther, "kda.pack_proj", [&] {
    util::copy_columns({proj_parts, n1, 0, n1, proj, k.proj_cols, rows}, stream.get());
    util::copy_columns({gates, n2, 0, n2, proj + n1, k.proj_cols, rows}, stream.get());
  });
}

bool CudaForward::Impl::fuses_post_norm(const DeviceLayer& l, int rows) const {
  return *o.fused_post_norm && !tep && D % 8 == 0 && D <= 8192 && on_decode_gemv(l.kda ? l.k.o_proj : l.m.o_proj, rows);
}

void CudaForward::Impl::kda_layer(const DeviceLayer& l, int ki, const StepMetadata& m, const DevMeta& d,
                                  const bf16_t* in_norm, bool post) {
  const KdaLayerWeights& k = l.k;
  cudaStream_t s = stream.get();
  const int rows = m.rows;
  const int rf = static_cast<int>(k.f_b.K()), rg = static_cast<int>(k.g_b.K());

  // [rows, proj_cols] = [q ; k ; v ; f_a ; g_a ; b ; pad]
  kda_projection(k, in_norm ? h : x, rows, in_norm);
  const bool pair = rows <= gemm::kDecodeMaxRows && !k.f_b.fp8() && !k.g_b.fp8() && k.col_fa % 8 == 0 && k.col_ga % 8 == 0 && rf % 8 == 0 &&
                    rg % 8 == 0 && k.proj_cols % 8 == 0;  // 16-byte aligned column slices (always, for Kimi shapes)
  bool pair_ran = false;  // the GEMV pair runs right before the decode kernel (KdaDecodeParams::qkv_ready)
  if (pair) {  // decode: both low-rank GEMMs in one launch, reading f_a / g_a in place
    pair_ran = op(OpCat::kGemm, "kda.f_b_g_b", [&] {
      gemm::gemv_pair_bf16({proj + k.col_fa, k.proj_cols, k.f_b.w.ptr<bf16_t>(), f, static_cast<int>(k.f_b.N()), rf},
                           {proj + k.col_ga, k.proj_cols, k.g_b.w.ptr<bf16_t>(), gz, static_cast<int>(k.g_b.N()), rg},
                           rows, s);
    });
  } else {
    op(OpCat::kOther, "kda.copy_fa_ga", [&] {  // the low-rank GEMMs need dense inputs
      util::copy_columns({proj, k.proj_cols, k.col_fa, rf, fa, rf, rows}, s);
      util::copy_columns({proj, k.proj_cols, k.col_ga, rg, ga, rg, rows}, s);
    });
    linear("kda.f_b", fa, rows, rf, k.f_b, f);
    linear("kda.g_b", ga, rows, rg, k.g_b, gz);
  }

  // q, k, v, beta: strided column views of the proj output, no repacking.
  auto cols = [&](int col, int64_t row0) { return kda::Bf16Rows{proj + row0 * k.proj_cols + col, k.proj_cols}; };
  const size_t hkv = static_cast<size_t>(Hk) * kda::kHeadDim * kda::kHeadDim;
  float* state = state_pool.get<float>() + static_cast<size_t>(ki) * hkv;
  bf16_t* conv = conv_pool.get<bf16_t>() + static_cast<size_t>(ki) * (Wc - 1) * 3 * P;
  const int num_slots = o.max_seqs * num_kda;  // pool rows: slot * num_kda + layer (see plan_and_allocate)

  // The fields decode and prefill share: rows from r0 of the projection outputs and of kda_out, slot ids from
  // `slots`, the layer's pools and weights.
  auto fill_common = [&](auto& p, int64_t r0, const int32_t* slots) {
    p.H = Hk;
    p.q = cols(k.col_q, r0);
    p.k = cols(k.col_k, r0);
    p.v = cols(k.col_v, r0);
    p.beta_logits = cols(k.col_b, r0);
    p.f = {f + r0 * P, P};
    p.gz = {gz + r0 * P, P};
    p.slot_ids = slots;
    p.num_slots = num_slots;
    p.state_pool = state;
    p.conv_pool = conv;
    p.conv_w = k.conv_w;
    p.A_log = k.A_log;
    p.dt_bias = k.dt_bias;
    p.o_norm_w = k.o_norm;
    p.norm_eps = cfg.rms_norm_eps;
    p.out = kda_out + r0 * P;
    p.out_stride = P;
  };
  if (m.num_decodes > 0) {
    kda::KdaDecodeParams p;
    p.N = m.num_decodes;
    fill_common(p, 0, d.kda_slots);
    p.qkv_ready = pair_ran;
    op(OpCat::kKda, "kda.decode", [&] { kda::kda_decode(p, kda_setup, s); });
  }
  if (m.num_prefills > 0) {
    const int64_t r0 = m.num_decodes;  // decode rows hold one token each: token row = sequence row
    kda::KdaPrefillParams p;
    p.N = m.num_prefills;
    p.T = m.prefill_tokens;
    p.cu_seqlens = d.pf_cu;
    p.chunk_offsets = d.pf_chunks;
    p.num_chunks = m.num_chunks;
    fill_common(p, r0, d.kda_slots + m.num_decodes);
    p.workspace = kda_ws;
    p.workspace_bytes = kda_ws_bytes;
    op(OpCat::kKda, "kda.prefill", [&] { kda::kda_prefill(p, s); });
  }
  linear("kda.o_proj", kda_out, rows, P, k.o_proj, attn_out, nullptr, post ? l.post_norm : nullptr);
}

void CudaForward::Impl::mla_layer(const DeviceLayer& l, int mi, const StepMetadata& m, const DevMeta& d,
                                  const bf16_t* in_norm, bool post) {
  const MlaLayerWeights& w = l.m;
  cudaStream_t s = stream.get();
  const int rows = m.rows;
  const size_t layer_rows = static_cast<size_t>(o.num_pages) * o.page_size;
  bf16_t* cache_l = cache.get<bf16_t>() + static_cast<size_t>(mi) * layer_rows * mla::kRow;
  const float scale = 1.0f / std::sqrt(static_cast<float>(mla::kQk));

  // Fused A-GEMM: [rows, H*192 + 576] = [q ; c ; k_pe]. It takes dense operands only.
  mla::FusedAParams fp;
  fp.heads = Hm;
  fp.hidden = D;
  fp.w = w.fused_a.w;
  int M = rows;
  if (in_norm) {  // decode GEMV (fuses_input_norm): x still holds h
    fp.x = dev_view(h, DType::kBF16, M, D, device);
    fp.w_scale = w.fused_a.scale;
    fp.norm_w = in_norm;
    fp.norm_eps = cfg.rms_norm_eps;
  } else if (w.fused_a.fp8() && w8a16(rows)) {
    fp.x = dev_view(x, DType::kBF16, M, D, device);
    fp.w_scale = w.fused_a.scale;
  } else if (w.fused_a.fp8()) {
    M = quantize_fp8_rows("mla.fused_a", x, rows, D);
    fp.x = dev_view(xq, DType::kF8E4M3, M, D, device);
    fp.x_scale = dev_view(xs, DType::kF32, D / gemm::kFp8Block, M, device);
    fp.w_scale = w.fused_a.scale;
  } else {
    fp.x = dev_view(x, DType::kBF16, M, D, device);
  }
  fp.out = dev_view(a_out, DType::kBF16, M, a_cols, device);
  op(OpCat::kGemm, "mla.fused_a", [&] { mla::fused_a_gemm(gemm, fp, s); });

  mla::CacheWriteParams cw;
  cw.ckv = a_out + static_cast<size_t>(Hm) * mla::kQk;
  cw.ckv_stride = a_cols;
  cw.norm_w = w.kv_a_norm;
  cw.slot_mapping = d.slot_mapping;
  cw.cache = cache_l;
  cw.T = rows;
  cw.eps = cfg.rms_norm_eps;
  // DELTASERVE_MLA_FUSED_CACHE_WRITE: a decode-only step writes the cache inside the decode's first kernel.
  const bool fused_write = *o.mla_fused_cache_write && m.num_prefills == 0 && m.num_decodes == rows;
  if (!fused_write) op(OpCat::kMla, "mla.cache_write", [&] { mla::cache_write(cw, s); });

  if (m.num_decodes > 0) {
    mla::DecodeParams p;
    p.q = a_out;
    p.q_stride = a_cols;
    p.wkv_b = w.kv_b;
    p.cache = {cache_l, d.page_table, o.page_size, m.width};
    p.ctx_lens = d.ctx_lens;
    p.N = m.num_decodes;
    p.H = Hm;
    p.num_splits = mla_decode_splits(m);
    p.variant = 0;
    p.scale = scale;
    p.workspace = mla_dec_ws;
    p.out = mla_attn;
    p.write = fused_write ? &cw : nullptr;
    op(OpCat::kMla, "mla.decode", [&] { mla::decode(p, s); });
  }
  for (const MlaPrefillGroup& g : m.mla_groups) {  // usually one; more when the contexts exceed the workspace
    const size_t t0 = static_cast<size_t>(m.num_decodes) + g.tok0, s0 = static_cast<size_t>(m.num_decodes) + g.seq0;
    mla::PrefillParams p;
    p.q = a_out + t0 * a_cols;
    p.q_stride = a_cols;
    p.wkv_b = w.kv_b;
    p.cache = {cache_l, d.page_table + s0 * m.width, o.page_size, m.width};
    p.cu_seqlens = d.grp_cu + g.arr;
    p.ctx_lens = d.ctx_lens + s0;
    p.cu_ctx = d.grp_cu_ctx + g.arr;
    p.N = g.num_seqs;
    p.H = Hm;
    p.T = g.num_tokens;
    p.total_ctx = g.total_ctx;
    p.max_new_tokens = g.max_new_tokens;
    p.scale = scale;
    p.workspace = mla_pf_ws;
    p.out = mla_attn + t0 * Hm * mla::kValue;
    op(OpCat::kMla, "mla.prefill", [&] { mla::prefill(gemm, p, s); });
  }
  linear("mla.o_proj", mla_attn, rows, Hm * mla::kValue, w.o_proj, attn_out, nullptr, post ? l.post_norm : nullptr);
}

moe::MoeParams CudaForward::Impl::moe_call(const DeviceLayer& l, int layer, int rows) const {
  moe::MoeParams p = moe_setup[layer];
  p.T = rows;
  p.x = x;
  p.gate_w = l.e.gate_w;
  p.gate_bias = l.e.gate_bias;
  p.experts = l.e.experts;
  p.shared = l.e.shared;
  p.workspace = moe_ws;
  p.workspace_bytes = moe_ws_bytes;
  p.route_counter = *o.moe_fused_route ? counters + kRouteCounter : nullptr;
  p.stream = stream.get();
  return p;
}

void CudaForward::Impl::route_rows(const DeviceLayer& l, int layer, int rows) {
  moe::RouteParams r;
  r.router = moe_setup[layer].router;
  r.T = rows;
  r.D = D;
  r.x = x;
  r.gate_w = l.e.gate_w;
  r.bias = l.e.gate_bias;
  r.logits = route_logits;
  r.topk_ids = topk_ids;
  r.topk_weights = topk_w;
  r.cluster = *o.moe_cluster_route;
  r.route_counter = *o.moe_fused_route ? counters + kRouteCounter : nullptr;
  r.stream = stream.get();
  op(OpCat::kMoe, "moe.route", [&] { moe::moe_route(r); });
}

void CudaForward::Impl::set_pre_norm(moe::MoeParams& p, const DeviceLayer& l) const {
  p.pre_norm_w = l.post_norm;
  p.pre_add = attn_out;
  p.pre_residual = h;
  p.pre_residual_out = h_next;
  p.pre_out = x;
  p.pre_eps = cfg.rms_norm_eps;
  p.residual = h_next;  // the finalize: h = h_next + routed + shared
  p.out = h;
}

bool CudaForward::Impl::moe_pre_norm(const DeviceLayer& l, int layer, int rows) const {
  if (!*o.moe_pre_norm || !h_next || tep || dep || separated || rows != 1) return false;
  moe::MoeParams p = moe_call(l, layer, rows);
  set_pre_norm(p, l);
  return !moe::moe_pre_norm_unsupported(p);
}

bool CudaForward::Impl::moe_layer(const DeviceLayer& l, int layer, const StepMetadata& m, const bf16_t* next_norm,
                                  bool pre) {
  moe::MoeParams p = moe_call(l, layer, m.rows);
  p.residual = h;  // fused finalize: h += routed + shared, in place
  p.out = h;
  if (pre) set_pre_norm(p, l);
  if (*o.moe_fused_norm) {  // where the path allows it (one token), the op also writes the next input norm
    p.norm_w = next_norm;
    p.norm_out = x;
    p.norm_eps = cfg.rms_norm_eps;
  }
  if (separated) {  // DELTASERVE_FORCE_SEPARATED_ROUTING: route in its own kernel, pass ids/weights in
    route_rows(l, layer, m.rows);
    p.topk_ids_in = topk_ids;
    p.topk_weights_in = topk_w;
  }
  bool normed = false;
  op(OpCat::kMoe, "moe", [&] { normed = moe::moe_forward(p).normed; });
  return normed;
}

void CudaForward::Impl::dense_ffn(const DeviceLayer& l, const StepMetadata& m) {
  const int rows = m.rows;
  const int I = static_cast<int>(l.dense.down.K());
  linear("ffn.gate_up", x, rows, D, l.dense.gate_up, gu);
  op(OpCat::kOther, "ffn.silu_mul", [&] { util::silu_mul({gu, 2 * static_cast<int64_t>(I), act, rows, I}, stream.get()); });
  linear("ffn.down", act, rows, I, l.dense.down, ffn_out);
}

void CudaForward::Impl::head(const StepMetadata& m, const DevMeta& d, bool pending_dense, bool x_final) {
  cudaStream_t s = stream.get();
  const int S = m.num_samples, rows = m.rows;
  const float eps = cfg.rms_norm_eps;
  NvtxRange r("head");
  // DELTASERVE_FP8_LM_HEAD: decode-sized steps read the FP8 copy (W8A16 GEMV, fp32 logits).
  const DeviceLinear& head_w = model->lm_head_fp8.w.data && w8a16(S) ? model->lm_head_fp8 : model->lm_head;
  bool fuse_final = false;
  if (x_final) {  // the TEP boundary after the last MoE layer applied the final norm to every row
    op(OpCat::kOther, "gather_sampled", [&] { embed::embed_lookup({d.sample_rows, x, sel_n, S, rows, D}, s); });
  } else if (pending_dense) {  // a last dense FFN: its residual add fused with the final norm over every row
    op(OpCat::kOther, "final_norm", [&] { norm::add_rmsnorm({ffn_out, h, model->final_norm, x, rows, D, eps}, s); });
    op(OpCat::kOther, "gather_sampled", [&] { embed::embed_lookup({d.sample_rows, x, sel_n, S, rows, D}, s); });
  } else {  // only the sampled rows are normed (the gather is the embedding kernel: ids = row indices)
    op(OpCat::kOther, "gather_sampled", [&] { embed::embed_lookup({d.sample_rows, h, sel, S, rows, D}, s); });
    // Decode (DELTASERVE_FUSED_INPUT_NORM): the lm_head GEMV applies the final norm to the gathered rows itself.
    fuse_final = gemv_takes_norm(head_w, S);
    if (!fuse_final)
      op(OpCat::kOther, "final_norm", [&] { norm::rmsnorm({sel, D, model->final_norm, sel_n, S, D, eps}, s); });
  }
  op(OpCat::kGemm, "lm_head", [&] {
    embed::lm_head(gemm,
                   {dev_view(fuse_final ? sel : sel_n, DType::kBF16, S, D, device), head_w.w,
                    dev_view(logits, DType::kF32, S, V, device), fuse_final ? model->final_norm : nullptr, eps,
                    head_w.scale},
                   s);
  });
  op(OpCat::kOther, "sample", [&] {
    sampling::SampleParams p;
    p.logits = logits;
    p.ld = V;
    p.temperature = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    p.seed = d.seed;
    p.step = d.step;
    p.out = tokens_out;
    p.B = S;
    p.V = V;
    p.counters = sample_counters;
    p.partials = sample_partials;
    p.partials_bytes = sample_partials_bytes;
    sampling::sample(p, s);
  });
}

}  // namespace ds

#endif  // DELTASERVE_WITH_CUDA
