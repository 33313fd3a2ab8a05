// CudaForward: set-up (dims, memory plan, latent cache sized from free memory), steps, CUDA graphs, profile.
// The per-layer launches are in cuda_forward_layers.cpp.
#include "runtime/cuda_forward.h"

#include "core/error.h"

#if defined(DELTASERVE_WITH_CUDA)

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "core/env.h"
#include "core/log.h"
#include "kernels/common/pdl_switch.h"
#include "kernels/mla/mla.h"
#include "kernels/norm/norm.h"
#include "kernels/sampling/sampling.h"
#include "runtime/cuda_forward_impl.h"

namespace ds {

namespace {

// Default context when neither the options nor the config bound it: the MLA prefill workspace holds one whole
// context (17.5 KB per row at 32 heads: 2.3 GB at 128k), so an unbounded default would take memory from pages.
constexpr int64_t kDefaultMaxModelLen = 131072;
// Context rows one MLA prefill call expands at least (several sequences' chunks share one call up to this).
constexpr int64_t kMinMlaPrefillCtx = 16384;
// Left free after sizing the cache: CUDA graphs, cuBLASLt internals, context growth.
constexpr size_t kCacheHeadroom = size_t{512} << 20;
constexpr int kMaxEvents = 8192;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }
double mib(size_t b) { return static_cast<double>(b) / (1 << 20); }

moe::ActFormat act_format_for(moe::WeightFormat w) {
  switch (w) {
    case moe::WeightFormat::kFP8Block: return moe::ActFormat::kFP8Block;
    case moe::WeightFormat::kMXFP8: return moe::ActFormat::kMXFP8;
    default: return moe::ActFormat::kBF16;
  }
}

// Every dense linear of a layer, to size the FP8 activation scratch.
template <class F> void for_each_linear(const DeviceLayer& l, F&& f) {
  if (l.kda) {
    f(l.k.proj), f(l.k.f_b), f(l.k.g_b), f(l.k.o_proj);
  } else {
    f(l.m.fused_a), f(l.m.o_proj);
  }
  if (!l.moe) f(l.dense.gate_up), f(l.dense.down);
  if (l.moe && l.e.shared_dense.down.w.data) f(l.e.shared_dense.gate_up), f(l.e.shared_dense.down);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Set-up

CudaForward::Impl::Impl(std::shared_ptr<const DeviceModel> m, CudaForwardOptions opts)
    : model(std::move(m)), cfg(model->config), o(std::move(opts)) {
  CUDA_CHECK(cudaDeviceSynchronize());  // the model upload may still be running on another stream
  resolve_options();
  prepare_layers();
  plan_and_allocate();
  size_latent_cache();
  if (tep) {
    // The peer buffers' protocol runs on this forward's stream only (one call in flight per buffer set).
    group->bind_stream(stream.get());
    group_sum.g = group;
    parallel::TpFinalizeNormSetup ts;
    ts.rank = group->rank();
    ts.world = group->world();
    ts.D = D;
    ts.TOPK = cfg.num_experts_per_token;
    ts.dtype = DType::kBF16;
    ts.eps = cfg.rms_norm_eps;
    ts.max_tokens = R;
    ts.peer = group->peer_view();
    ts.peer_access = group->peer_access();
    ts.fallback = &group_sum;
    tp_final = std::make_unique<parallel::TpFinalizeNorm>(ts);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  // Construction is collective: no rank starts a step before every rank has finished allocating. Ranks
  // simulated on one GPU need it: an allocation step that synchronises the device (cudaFree, the
  // cudaDeviceSynchronize above) would otherwise wait for a peer's all-reduce kernel that spins until this rank
  // joins it (a deadlock until the protocol's timeout).
  if (group) group->exchange("forward ready");
}

CudaForward::Impl::~Impl() {
  for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
}

void CudaForward::Impl::resolve_options() {
  if (o.max_seqs < 1) DS_THROW("max_seqs must be >= 1 (got {})", o.max_seqs);
  if (o.max_batch_tokens < 1) DS_THROW("max_batch_tokens must be >= 1 (got {})", o.max_batch_tokens);
  if (o.page_size < 1) DS_THROW("page_size must be >= 1 (got {})", o.page_size);
  if (!(o.memory_fraction > 0.0 && o.memory_fraction <= 1.0))
    DS_THROW("memory_fraction must be in (0, 1] (got {})", o.memory_fraction);
  if (o.num_pages < 0) DS_THROW("num_pages must be >= 0 (got {})", o.num_pages);
  if (!cuda_device_available()) DS_THROW("CudaForward needs a CUDA GPU");

  // The group and the model's slice must agree (a rank loaded with another rank's slice computes garbage).
  const DeviceShard& sh = model->shard;
  group = o.group.get();
  if (!group) {
    if (sh.tp_size != 1 || sh.ep_size != 1)
      DS_THROW("CudaForward: the model is rank {}/{} (tp) {}/{} (ep) of a split but no parallel group was given",
               sh.tp_rank, sh.tp_size, sh.ep_rank, sh.ep_size);
  } else {
    tep = group->mode() == parallel::Mode::kTep;
    dep = !tep;
    const bool ok = tep ? sh.tp_size == group->world() && sh.tp_rank == group->rank() && sh.ep_size == sh.tp_size
                        : sh.tp_size == 1 && sh.ep_size == group->world() && sh.ep_rank == group->rank();
    if (!ok)
      DS_THROW("CudaForward: group {} rank {} of {} ({}) but the model holds tp {}/{} ep {}/{} "
               "(DeviceModelOptions must name this rank)",
               group->name(), group->rank(), group->world(), parallel::to_string(group->mode()), sh.tp_rank,
               sh.tp_size, sh.ep_rank, sh.ep_size);
  }
  D = cfg.hidden_size;
  V = cfg.vocab_size;
  Hk = sh.kda_heads;  // this rank's heads (all of them on one GPU)
  P = Hk * cfg.linear_attn.head_dim;
  Wc = cfg.linear_attn.short_conv_kernel_size;
  Hm = sh.mla_heads;
  a_cols = Hm * mla::kQk + mla::kRow;
  CHECK_EQ(static_cast<int>(model->layers.size()), cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const bool kda = model->layers[i].kda;
    kda_index.push_back(kda ? num_kda++ : -1);
    mla_index.push_back(kda ? -1 : num_mla++);
    layer_names.push_back(fmt::format("layer {} {} {}", i, kda ? "kda" : "mla", model->layers[i].moe ? "moe" : "dense"));
  }
  if (num_kda > 0 && (cfg.linear_attn.head_dim != kda::kHeadDim || Wc != kda::kConvWidth))
    DS_THROW("KDA kernels need head_dim {} and conv width {} (config: {} and {})", kda::kHeadDim, kda::kConvWidth,
             cfg.linear_attn.head_dim, Wc);
  if (num_mla > 0)
    if (auto why = mla::mla_unsupported({Hm, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim,
                                         cfg.v_head_dim}))
      DS_THROW("MLA layers: {}", *why);
  if (auto why = norm::rmsnorm_unsupported(D)) DS_THROW("{}", *why);

  const int64_t config_len = cfg.model_max_length > 0 ? cfg.model_max_length : kDefaultMaxModelLen;
  if (o.max_model_len <= 0) o.max_model_len = std::min(config_len, kDefaultMaxModelLen);
  const int64_t width = (o.max_model_len + o.page_size - 1) / o.page_size;
  if (width > (int64_t{1} << 24)) DS_THROW("max_model_len {} / page_size {}: too many pages per sequence", o.max_model_len, o.page_size);
  max_width = static_cast<int>(width);
  mla_ctx_cap = std::max(o.mla_prefill_ctx_rows > 0 ? o.mla_prefill_ctx_rows : kMinMlaPrefillCtx, o.max_model_len);
  o.mla_prefill_ctx_rows = mla_ctx_cap;
  R = (std::max(o.max_batch_tokens, o.max_seqs) + gemm::kFp8RowMultiple - 1) / gemm::kFp8RowMultiple *
      gemm::kFp8RowMultiple;

  arch = cuda_device_arch();
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  kda_setup = kda::kda_decode_setup();
  if (!o.separated_routing) o.separated_routing = get_knob(knobs::kForceSeparatedRouting) != 0;
  if (!o.hf_biased_routing) o.hf_biased_routing = get_knob(knobs::kHfBiasedRouting) != 0;
  if (!o.fp8_decode_gemv) o.fp8_decode_gemv = get_knob(knobs::kFp8DecodeGemv) != 0;
  if (!o.moe_gemv_decode) o.moe_gemv_decode = get_knob(knobs::kMoeGemvDecode) != 0;
  if (!o.moe_gemv_tokens) o.moe_gemv_tokens = static_cast<int>(get_knob(knobs::kMoeGemvTokens));
  if (!o.moe_cluster_route) o.moe_cluster_route = get_knob(knobs::kMoeClusterRoute) != 0;
  if (!o.moe_fused_norm) o.moe_fused_norm = get_knob(knobs::kMoeFusedNorm) != 0;
  if (!o.fused_input_norm) o.fused_input_norm = get_knob(knobs::kFusedInputNorm) != 0;
  if (!o.fused_post_norm) o.fused_post_norm = get_knob(knobs::kFusedPostNorm) != 0;
  if (!o.moe_fused_route) o.moe_fused_route = get_knob(knobs::kMoeFusedRoute) != 0;
  if (!o.moe_gemv_up_cols) o.moe_gemv_up_cols = static_cast<int>(get_knob(knobs::kMoeGemvUpCols));
  if (!o.moe_gemv_down_rows) o.moe_gemv_down_rows = static_cast<int>(get_knob(knobs::kMoeGemvDownRows));
  if (!o.moe_down_persistent) o.moe_down_persistent = get_knob(knobs::kMoeDownPersistent) != 0;
  if (!o.moe_down_preload) o.moe_down_preload = get_knob(knobs::kMoeDownPreload) != 0;
  if (!o.moe_fp8_prefill_tile) o.moe_fp8_prefill_tile = static_cast<int>(get_knob(knobs::kMoeFp8PrefillTile));
  if (!o.moe_stream_tiles) o.moe_stream_tiles = static_cast<int>(get_knob(knobs::kMoeStreamTiles));
  if (!o.moe_fp8_decode_wgmma) o.moe_fp8_decode_wgmma = get_knob(knobs::kMoeFp8DecodeWgmma) != 0;
  if (!o.mla_fused_cache_write) o.mla_fused_cache_write = get_knob(knobs::kMlaFusedCacheWrite) != 0;
  if (!o.moe_pre_norm) o.moe_pre_norm = get_knob(knobs::kMoePreNorm) != 0;
  if (!o.pdl) o.pdl = get_knob(knobs::kPdl) != 0;
  if (auto why = ablation_problem(o.ablate)) throw Error(*why);
  separated = *o.separated_routing;
  bucket_list = decode_buckets(o.max_seqs);
}

void CudaForward::Impl::prepare_layers() {
  moe::RouterParams router;
  router.E = cfg.num_experts;
  router.topk = cfg.num_experts_per_token;
  router.num_expert_group = cfg.use_grouped_topk ? cfg.num_expert_group : 1;
  router.topk_group = cfg.use_grouped_topk ? cfg.topk_group : 1;
  router.scoring = cfg.moe_router_activation_func == "softmax" ? moe::ScoringFunc::kSoftmax : moe::ScoringFunc::kSigmoid;
  router.renormalize = cfg.moe_renormalize;
  router.routed_scaling_factor = cfg.routed_scaling_factor;
  router.hf_biased_weights = *o.hf_biased_routing;

  moe_setup.resize(model->layers.size());
  for (size_t i = 0; i < model->layers.size(); ++i) {
    const DeviceLayer& l = model->layers[i];
    if (l.kda) {
      proj_stride = std::max(proj_stride, l.k.proj_cols);
      rank_f = std::max(rank_f, static_cast<int>(l.k.f_b.K()));
      rank_g = std::max(rank_g, static_cast<int>(l.k.g_b.K()));
      CHECK_EQ(l.k.proj.N() + (l.k.split() ? l.k.proj_gates.N() : 0), l.k.proj_cols);
      kda_split = kda_split || l.k.split();
    }
    if (!l.moe) {
      dense_I = std::max(dense_I, static_cast<int>(l.dense.down.K()));
      continue;
    }
    if (l.e.shared_dense.down.w.data)  // DEP: the shared expert runs through the dense FFN buffers
      dense_I = std::max(dense_I, static_cast<int>(l.e.shared_dense.down.K()));
    moe::MoeParams p;
    p.D = D;
    p.I = cfg.moe_intermediate_size;
    p.router = router;
    // DEP: a rank runs its experts on the rows every rank sent it (at most world x R).
    p.max_tokens = dep ? R * group->world() : R;
    p.weight_format = l.e.format;
    p.act_format = act_format_for(l.e.format);
    p.routing = separated ? moe::RoutingMode::kSeparated : moe::RoutingMode::kInKernel;
    p.has_shared = l.e.has_shared;
    p.expert_begin = model->shard.expert_begin;  // routes to other ranks' experts are dropped here
    p.expert_end = model->shard.expert_end;
    p.do_finalize = !tep;  // TEP: the layer boundary finalizes (TpFinalizeNorm)
    if (dep) p.routing = moe::RoutingMode::kSeparated;  // routed on the tokens' own rank, sent with them
    p.arch = arch;
    p.gemv_decode = *o.moe_gemv_decode;
    p.gemv_tokens = *o.moe_gemv_tokens;  // 0..32: moe_unsupported below names a bad value
    p.cluster_route = *o.moe_cluster_route;
    p.gemv_up_cols = *o.moe_gemv_up_cols;  // checked by moe_unsupported below: a bad value fails here
    p.gemv_down_rows = *o.moe_gemv_down_rows;
    p.gemv_down_persistent = *o.moe_down_persistent;
    p.gemv_down_preload = *o.moe_down_preload;
    p.fp8_prefill_tile_m = *o.moe_fp8_prefill_tile;  // 0, 64 or 128: moe_unsupported below names a bad value
    p.stream_token_tiles = *o.moe_stream_tiles;       // 0, 1, 2, 4 or 8: likewise
    p.fp8_decode_wgmma = *o.moe_fp8_decode_wgmma;
    if (auto why = moe::moe_unsupported(p)) DS_THROW("layer {}: MoE: {}", i, *why);
    if (separated || dep)
      if (auto why = moe::moe_route_unsupported(router, D)) DS_THROW("layer {}: MoE router: {}", i, *why);
    moe_ws_bytes = std::max(moe_ws_bytes, moe::moe_workspace_bytes(p));
    moe_setup[i] = p;
  }
  for (const DeviceLayer& l : model->layers)
    for_each_linear(l, [&](const DeviceLinear& w) {
      if (w.fp8()) max_k = std::max(max_k, static_cast<int>(w.K()));
    });
}

void CudaForward::Impl::plan_and_allocate() {
  cudaStream_t s = stream.get();
  const size_t Rz = R, S = o.max_seqs, hkv = static_cast<size_t>(Hk) * kda::kHeadDim * kda::kHeadDim;

  // KDA state: [slot, layer, ...] so one memset zeroes a slot; the kernels see layer l's pool at offset l with
  // slot ids scaled by num_kda (StepMetaOptions::kda_slot_stride).
  if (num_kda > 0) {
    state_pool.reset(S * num_kda * hkv * sizeof(float));
    conv_pool.reset(S * num_kda * (Wc - 1) * 3 * static_cast<size_t>(P) * sizeof(bf16_t));
    CUDA_CHECK(cudaMemsetAsync(state_pool.get(), 0, state_pool.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(conv_pool.get(), 0, conv_pool.bytes(), s));
  }

  // Activations and workspaces: one arena, every buffer 256-byte aligned.
  size_t off = 0;
  std::vector<std::pair<void**, size_t>> carve;
  auto take = [&](auto** ptr, size_t bytes) { carve.push_back({reinterpret_cast<void**>(ptr), bytes}); off += align256(bytes); };
  const size_t b16 = sizeof(bf16_t);
  take(&h, Rz * D * b16);
  take(&x, Rz * D * b16);
  take(&attn_out, Rz * D * b16);
  take(&ffn_out, Rz * D * b16);
  if (num_kda > 0) {
    take(&proj, Rz * proj_stride * b16);
    if (kda_split) take(&proj_parts, Rz * proj_stride * b16);  // the two parts' dense outputs (rows > 1)
    take(&fa, Rz * rank_f * b16);
    take(&ga, Rz * rank_g * b16);
    take(&f, Rz * P * b16);
    take(&gz, Rz * P * b16);
    take(&kda_out, Rz * P * b16);
  }
  if (num_mla > 0) {
    take(&a_out, Rz * a_cols * b16);
    take(&mla_attn, Rz * Hm * mla::kValue * b16);
  }
  if (dense_I > 0) {
    take(&gu, Rz * 2 * dense_I * b16);
    take(&act, Rz * dense_I * b16);
  }
  if (max_k > 0) {
    take(&xq, Rz * max_k);
    take(&xs, Rz * (max_k / gemm::kFp8Block) * sizeof(float));
  }
  const bool any_moe = std::any_of(model->layers.begin(), model->layers.end(), [](const DeviceLayer& l) { return l.moe; });
  const size_t topk = cfg.num_experts_per_token;
  if (separated || (dep && any_moe)) take(&route_logits, Rz * cfg.num_experts * sizeof(float));
  if (separated || ((tep || dep) && any_moe)) {
    take(&topk_ids, Rz * topk * sizeof(int32_t));
    take(&topk_w, Rz * topk * sizeof(float));
  }
  if (tep && any_moe) {
    take(&moe_expert_out, Rz * topk * D * b16);
    take(&moe_shared_out, Rz * D * b16);
    take(&moe_e2p, Rz * topk * sizeof(int32_t));
  }
  if (dep && any_moe) allocate_dep(off, [&](void** p, size_t bytes) { take(p, bytes); });
  take(&counters, kNumCounters * sizeof(int32_t));  // zero with the arena, re-armed by their kernels
  if (any_moe && *o.moe_pre_norm) take(&h_next, Rz * D * b16);
  take(&sel, S * D * b16);
  take(&sel_n, S * D * b16);
  take(&logits, S * V * sizeof(float));
  take(&tokens_out, S * sizeof(int32_t));
  for (size_t b = 1; b <= S; ++b)  // the graph buckets sample any row count up to S
    sample_partials_bytes = std::max(sample_partials_bytes, sampling::sample_partials_bytes(static_cast<int>(b), V));
  if (sample_partials_bytes > 0) {
    take(&sample_counters, S * sizeof(int32_t));
    take(&sample_partials, sample_partials_bytes);
  }
  arena_activation_bytes = off;

  if (num_kda > 0) {
    // A step's prefill chunks: sum over its prefill sequences of ceil(len / 64) <= (T + 63 N) / 64.
    const int64_t n_pf = std::min(o.max_seqs, o.max_batch_tokens);
    max_chunks = static_cast<int>((o.max_batch_tokens + 63 * n_pf) / kda::kChunk);
    kda_ws_bytes = kda::kda_prefill_workspace_bytes(max_chunks, Hk);
    take(&kda_ws, kda_ws_bytes);
  }
  if (num_mla > 0) {
    // Split counts grow with max_ctx, so the capacity context bounds every step's decode workspace.
    const int cap_ctx = static_cast<int>(std::min<int64_t>(int64_t{max_width} * o.page_size, INT32_MAX));
    for (int n = 1; n <= o.max_seqs; ++n) {
      const int splits = mla::decode_num_splits(arch, num_sms, n, Hm, cap_ctx);
      mla_dec_ws_bytes = std::max(mla_dec_ws_bytes, mla::decode_workspace_bytes(n, Hm, splits));
    }
    take(&mla_dec_ws, mla_dec_ws_bytes);
    mla_pf_ws_bytes = mla::prefill_workspace_bytes(static_cast<int>(std::min<int64_t>(mla_ctx_cap, INT32_MAX)), Hm);
    take(&mla_pf_ws, mla_pf_ws_bytes);
  }
  if (moe_ws_bytes > 0) take(&moe_ws, moe_ws_bytes);
  arena_workspace_bytes = off - arena_activation_bytes;

  arena.reset(off);
  // Zeroed once: rows past a step's tokens (FP8 row padding) then always hold finite values.
  CUDA_CHECK(cudaMemsetAsync(arena.get(), 0, off, s));
  size_t at = 0;
  for (auto& [ptr, bytes] : carve) {
    *ptr = static_cast<char*>(arena.get()) + at;
    at += align256(bytes);
  }
  if (dep_ones) {  // the combine's per-rank weights
    const std::vector<float> ones(static_cast<size_t>(R) * group->world(), 1.0f);
    CUDA_CHECK(cudaMemcpyAsync(dep_ones, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }

  meta_capacity = meta_layout(R, o.max_seqs, max_width, o.max_seqs, o.max_seqs, o.max_seqs).bytes;
  meta_dev.reset(meta_capacity);
  meta_host = PinnedBuffer(meta_capacity);
  tokens_host = PinnedBuffer(S * sizeof(int32_t));

  gemm.init();
  if (o.profile) {
    events.resize(kMaxEvents);
    event_cat.resize(kMaxEvents);
    event_name.resize(kMaxEvents);
    for (auto& e : events) CUDA_CHECK(cudaEventCreate(&e));
  }
}

void CudaForward::Impl::size_latent_cache() {
  const size_t page_bytes = static_cast<size_t>(num_mla) * o.page_size * mla::kRow * sizeof(bf16_t);
  const int64_t useful = static_cast<int64_t>(o.max_seqs) * max_width;  // more pages than this are never used
  if (num_mla == 0) {  // pages only bound lengths: no memory behind them
    if (o.num_pages == 0) o.num_pages = static_cast<int>(std::min<int64_t>(useful, INT32_MAX));
    return;
  }
  if (o.num_pages == 0) {
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double allowed =
        o.memory_fraction * static_cast<double>(total_b) - static_cast<double>(total_b - free_b) - kCacheHeadroom;
    if (allowed < static_cast<double>(page_bytes))
      DS_THROW("no device memory left for the MLA latent cache: {:.0f} MiB free of {:.0f} MiB, memory_fraction {} "
               "leaves {:.0f} MiB after {:.0f} MiB headroom; one page ({} tokens x {} MLA layers) needs {:.1f} KiB. "
               "Held: weights {:.0f} MiB, KDA state {:.0f} MiB ({} slots), activations {:.0f} MiB, workspaces "
               "{:.0f} MiB. Lower max_seqs, max_batch_tokens or max_model_len, or raise memory_fraction",
               mib(free_b), mib(total_b), o.memory_fraction, allowed / (1 << 20), mib(kCacheHeadroom), o.page_size,
               num_mla, page_bytes / 1024.0, mib(model->bytes), mib(state_pool.bytes() + conv_pool.bytes()),
               o.max_seqs, mib(arena_activation_bytes), mib(arena_workspace_bytes + gemm::GemmRunner::kDefaultWorkspace));
    o.num_pages = static_cast<int>(
        std::min<int64_t>({static_cast<int64_t>(allowed / static_cast<double>(page_bytes)), useful, INT32_MAX}));
  }
  cache.reset(static_cast<size_t>(o.num_pages) * page_bytes);
  // Zeroed once: attention tiles may read rows past a context end; they must hold finite values.
  CUDA_CHECK(cudaMemsetAsync(cache.get(), 0, cache.bytes(), stream.get()));
  LOG_INFO("CudaForward: {} latent pages of {} tokens ({:.0f} MiB, {} tokens), {} KDA slots ({:.0f} MiB), "
           "activations {:.0f} MiB, workspaces {:.0f} MiB",
           o.num_pages, o.page_size, mib(cache.bytes()), static_cast<int64_t>(o.num_pages) * o.page_size, o.max_seqs,
           mib(state_pool.bytes() + conv_pool.bytes()), mib(arena_activation_bytes), mib(arena_workspace_bytes));
}

// ---------------------------------------------------------------------------------------------------------
// Steps

DevMeta CudaForward::Impl::dev_meta(const MetaLayout& l) const {
  const char* b = meta_dev.get<const char>();
  DevMeta d;
  d.ids = reinterpret_cast<const int32_t*>(b + l.ids);
  d.slot_mapping = reinterpret_cast<const int64_t*>(b + l.slot_mapping);
  d.kda_slots = reinterpret_cast<const int32_t*>(b + l.kda_slots);
  d.ctx_lens = reinterpret_cast<const int32_t*>(b + l.ctx_lens);
  d.page_table = reinterpret_cast<const int32_t*>(b + l.page_table);
  d.pf_cu = reinterpret_cast<const int32_t*>(b + l.pf_cu);
  d.pf_chunks = reinterpret_cast<const int32_t*>(b + l.pf_chunks);
  d.grp_cu = reinterpret_cast<const int32_t*>(b + l.grp_cu);
  d.grp_cu_ctx = reinterpret_cast<const int32_t*>(b + l.grp_cu_ctx);
  d.sample_rows = reinterpret_cast<const int32_t*>(b + l.sample_rows);
  d.temperature = reinterpret_cast<const float*>(b + l.temperature);
  d.top_k = reinterpret_cast<const int32_t*>(b + l.top_k);
  d.top_p = reinterpret_cast<const float*>(b + l.top_p);
  d.seed = reinterpret_cast<const uint64_t*>(b + l.seed);
  d.step = reinterpret_cast<const int64_t*>(b + l.step);
  return d;
}

void CudaForward::Impl::upload(const StepMetadata& m) {
  CHECK(m.layout.bytes <= meta_capacity, "step metadata of {} bytes exceeds the {}-byte buffer", m.layout.bytes,
        meta_capacity);
  // The staging buffer is free: every step ends with a stream synchronisation.
  std::memcpy(meta_host.get(), m.blob.data(), m.layout.bytes);
  op(OpCat::kOther, "h2d_metadata", [&] {
    CUDA_CHECK(cudaMemcpyAsync(meta_dev.get(), meta_host.get(), m.layout.bytes, cudaMemcpyHostToDevice, stream.get()));
  });
}

void CudaForward::Impl::mark(OpCat c, const char* name) {
  if (!timing || num_events >= kMaxEvents) return;
  CUDA_CHECK(cudaEventRecord(events[num_events], stream.get()));
  event_cat[num_events] = c;
  event_name[num_events++] = name;
}

void CudaForward::Impl::capture_graph(const StepMetadata& shape, std::pair<int, int> key) {
  NvtxRange r("capture_graph");
  StepMetaOptions mo;
  mo.page_size = o.page_size;
  mo.bucket = key.first;
  mo.width = key.second;
  // All-padding step of the same shape: touches no KDA state (slot -1) and no cache row (slot_mapping -1).
  const StepMetadata pad = build_step_metadata(make_step_plan({}, {}), {}, {}, mo);
  CHECK(pad.layout.bytes == shape.layout.bytes && pad.rows == shape.rows && pad.width == shape.width &&
            pad.num_samples == shape.num_samples,
        "graph warm-up shape differs from the step's");
  // Warm-up: every kernel's one-time set-up (shared-memory attributes, cuBLASLt plans for these M) happens
  // outside the capture.
  upload(pad);
  run(pad);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));

  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  try {
    run(pad);
  } catch (...) {
    cudaStreamEndCapture(stream.get(), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // the capture's error is reported by the exception
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream.get(), &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  CUDA_CHECK(e);
  graphs[key] = exec;
  LOG_DEBUG("CudaForward: captured the decode graph for {} rows, page width {}", key.first, key.second);
}

std::vector<int32_t> CudaForward::Impl::step(const StepPlan& plan, const std::vector<int32_t>& tokens,
                                             const std::vector<SampleSpec>& samples) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(plan.seqs.size());
  CHECK(n > 0, "CudaForward::step: empty plan");
  // Process-wide, set at every step: forwards with different settings may take turns (tests), never overlap.
  pdl::set_enabled(*o.pdl);
  CHECK(n <= o.max_seqs, "step has {} sequences, max_seqs is {}", n, o.max_seqs);
  CHECK(plan.num_tokens <= o.max_batch_tokens, "step has {} tokens, max_batch_tokens is {}", plan.num_tokens,
        o.max_batch_tokens);
  CHECK(plan.max_pages_per_seq <= max_width, "a sequence holds {} pages, the page table has {}",
        plan.max_pages_per_seq, max_width);
  for (int32_t t : tokens)
    CHECK(t >= 0 && t < V, "token id {} outside the vocabulary [0, {})", t, V);
  for (const auto& q : plan.seqs)
    CHECK(q.slot >= 0 && q.slot < o.max_seqs, "slot {} outside [0, {})", q.slot, o.max_seqs);
  for (int32_t pg : plan.page_table) CHECK(pg < o.num_pages, "page {} outside the cache ({} pages)", pg, o.num_pages);

  StepMetaOptions mo;
  mo.kda_slot_stride = std::max(num_kda, 1);
  mo.page_size = o.page_size;
  mo.mla_prefill_ctx_cap = mla_ctx_cap;
  const bool decode_only = plan.num_decodes == n;
  if (decode_only) {  // padded to a bucket whether or not graphs are on: same shapes, same bits
    mo.bucket = bucket_for(bucket_list, n);
    mo.width = page_width_class(plan.max_pages_per_seq, max_width);
  }
  const StepMetadata m = build_step_metadata(plan, tokens, samples, mo);
  CHECK(m.num_chunks <= max_chunks || num_kda == 0, "{} KDA prefill chunks exceed the workspace ({})", m.num_chunks,
        max_chunks);
  // DEP steps run eagerly: their all-to-all counts are known on the host only at run time.
  const bool use_graph = decode_only && o.cuda_graphs && !o.profile && !dep;
  step_tokens = m.num_tokens;

  StepProfile prof;
  prof.num_tokens = plan.num_tokens;
  prof.num_decodes = plan.num_decodes;
  prof.num_prefills = m.num_prefills;
  prof.prefill_tokens = m.prefill_tokens;
  prof.num_sampled = m.real_samples;
  prof.rows = m.rows;
  prof.graph = use_graph;

  timing = o.profile && !use_graph;
  num_events = 0;
  mark(OpCat::kOther, "step_start");  // the base event
  cudaStream_t s = stream.get();
  if (!m.fresh_slots.empty())
    op(OpCat::kOther, "zero_new_slots", [&] {
      const size_t hkv = static_cast<size_t>(Hk) * kda::kHeadDim * kda::kHeadDim;
      const size_t conv = static_cast<size_t>(Wc - 1) * 3 * P;
      for (int slot : m.fresh_slots) {
        if (num_kda == 0) break;
        CUDA_CHECK(cudaMemsetAsync(state_pool.get<float>() + static_cast<size_t>(slot) * num_kda * hkv, 0,
                                   num_kda * hkv * sizeof(float), s));
        CUDA_CHECK(cudaMemsetAsync(conv_pool.get<bf16_t>() + static_cast<size_t>(slot) * num_kda * conv, 0,
                                   num_kda * conv * sizeof(bf16_t), s));
      }
    });
  if (use_graph) {
    const std::pair<int, int> key{m.bucket, m.width};
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      capture_graph(m, key);
      it = graphs.find(key);
      prof.captured = true;
    }
    upload(m);
    NvtxRange r("graph_replay");
    // The graph holds spinning all-reduces: simulated ranks on one GPU enqueue their replays in step, else one
    // rank's device-wide synchronisation (a capture's warm-up, a lazy module load) waits on the others' spinning
    // kernels while they wait for its replay (docs/parallel.md).
    const auto replay = [&] { CUDA_CHECK(cudaGraphLaunch(it->second, s)); };
    if (group)
      group->run_spinning(s, replay);
    else
      replay();
  } else {
    upload(m);
    run(m);
  }
  std::vector<int32_t> out(m.real_samples);
  // TEP: every rank computed the same logits up to kernels that are not bit-deterministic across GPUs; rank 0's
  // tokens decide, so every rank's scheduler sees the same sequences.
  if (tep && m.real_samples > 0)
    op(OpCat::kOther, "broadcast_tokens",
       [&] { group->broadcast(tokens_out, sizeof(int32_t) * m.real_samples, 0, s); });
  if (m.real_samples > 0)
    CUDA_CHECK(cudaMemcpyAsync(tokens_host.get(), tokens_out, sizeof(int32_t) * m.real_samples,
                               cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (group) group->check();
  std::copy_n(tokens_host.get<int32_t>(), m.real_samples, out.begin());
  last_samples = m.real_samples;

  if (timing) {
    prof.timed = true;
    double cat[static_cast<int>(OpCat::kCount)] = {};
    std::map<std::string, size_t> op_index;  // name -> prof.ops entry
    for (int i = 1; i < num_events; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events[i - 1], events[i]));
      cat[static_cast<int>(event_cat[i])] += ms;
      auto [it, fresh] = op_index.try_emplace(event_name[i], prof.ops.size());
      if (fresh) prof.ops.push_back({event_name[i], kOpCatNames[static_cast<int>(event_cat[i])], 0.0, 0});
      prof.ops[it->second].ms += ms;
      prof.ops[it->second].calls += 1;
    }
    prof.kda_ms = cat[static_cast<int>(OpCat::kKda)];
    prof.mla_ms = cat[static_cast<int>(OpCat::kMla)];
    prof.moe_ms = cat[static_cast<int>(OpCat::kMoe)];
    prof.gemm_ms = cat[static_cast<int>(OpCat::kGemm)];
    prof.other_ms = cat[static_cast<int>(OpCat::kOther)];
    prof.gpu_ms = prof.kda_ms + prof.mla_ms + prof.moe_ms + prof.gemm_ms + prof.other_ms;
  }
  timing = false;
  prof.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  last = prof;
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Public API

CudaForward::CudaForward(std::shared_ptr<const DeviceModel> model, CudaForwardOptions options) {
  CHECK(model != nullptr, "CudaForward needs a device model");
  impl_ = std::make_unique<Impl>(std::move(model), std::move(options));
}

CudaForward::~CudaForward() = default;

std::vector<int32_t> CudaForward::step(const StepPlan& plan, const std::vector<int32_t>& tokens,
                                       const std::vector<SampleSpec>& samples) {
  return impl_->step(plan, tokens, samples);
}

void CudaForward::step_idle() { impl_->step_idle(); }

std::vector<float> CudaForward::last_logits() const {
  std::vector<float> v(static_cast<size_t>(impl_->last_samples) * impl_->V);
  if (!v.empty()) {
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream.get()));
    CUDA_CHECK(cudaMemcpy(v.data(), impl_->logits, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  return v;
}

const StepProfile& CudaForward::last_profile() const { return impl_->last; }
const CudaForwardOptions& CudaForward::options() const { return impl_->o; }
int CudaForward::num_pages() const { return impl_->o.num_pages; }
int CudaForward::max_pages_per_seq() const { return impl_->max_width; }
const std::vector<int>& CudaForward::buckets() const { return impl_->bucket_list; }
int CudaForward::num_graphs() const { return static_cast<int>(impl_->graphs.size()); }
int CudaForward::fused_boundaries() const { return impl_->fused_boundaries; }
const DeviceModel& CudaForward::model() const { return *impl_->model; }

ForwardMemory CudaForward::memory() const {
  ForwardMemory m;
  m.weights = impl_->model->bytes;
  m.kda_state = impl_->state_pool.bytes() + impl_->conv_pool.bytes();
  m.latent_cache = impl_->cache.bytes();
  m.activations = impl_->arena_activation_bytes;
  m.workspaces = impl_->arena_workspace_bytes + gemm::GemmRunner::kDefaultWorkspace;
  m.metadata = impl_->meta_dev.bytes();
  return m;
}

}  // namespace ds

#else  // !DELTASERVE_WITH_CUDA: the class exists so CPU builds link; constructing it says why it cannot run.

namespace ds {

struct CudaForward::Impl {};

CudaForward::CudaForward(std::shared_ptr<const DeviceModel>, CudaForwardOptions) {
  DS_THROW("CudaForward: this build has no CUDA support");
}
CudaForward::~CudaForward() = default;
std::vector<int32_t> CudaForward::step(const StepPlan&, const std::vector<int32_t>&, const std::vector<SampleSpec>&) {
  return {};
}
void CudaForward::step_idle() {}
std::vector<float> CudaForward::last_logits() const { return {}; }
const StepProfile& CudaForward::last_profile() const {
  static const StepProfile p;
  return p;
}
const CudaForwardOptions& CudaForward::options() const {
  static const CudaForwardOptions o;
  return o;
}
int CudaForward::num_pages() const { return 0; }
int CudaForward::max_pages_per_seq() const { return 0; }
const std::vector<int>& CudaForward::buckets() const {
  static const std::vector<int> b;
  return b;
}
int CudaForward::num_graphs() const { return 0; }
int CudaForward::fused_boundaries() const { return 0; }
ForwardMemory CudaForward::memory() const { return {}; }
const DeviceModel& CudaForward::model() const { DS_THROW("CudaForward: this build has no CUDA support"); }

}  // namespace ds

#endif
