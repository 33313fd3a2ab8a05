// Fused-or-unfused choice at the tensor-parallel MoE layer boundary (see tp_finalize.h).
#include "runtime/parallel/tp_finalize.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/norm/norm.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace ds::parallel {

namespace {

void check_view(const moe::MoeTensor& v, const char* name, DType dt, std::initializer_list<int64_t> shape) {
  CHECK(v.data, "tp_finalize_norm: {} is null", name);
  CHECK(v.dtype == dt, "tp_finalize_norm: {} is {}, expected {}", name, dtype_name(v.dtype), dtype_name(dt));
  const std::vector<int64_t> want(shape), got(v.shape, v.shape + v.ndim);
  CHECK(got == want, "tp_finalize_norm: {} has shape [{}], expected [{}]", name, fmt::join(got, ", "),
        fmt::join(want, ", "));
}

}  // namespace

void PeerAllReduce::sum(void* data, size_t count, DType dtype, cudaStream_t stream) {
  allreduce::PeerAllReduceParams p;
  p.dtype = dtype;
  p.count = count;
  p.in = data;
  p.out = data;
  p.comm = view_;
  p.stream = stream;
  allreduce::peer_all_reduce(p);
}

std::optional<std::string> tp_fused_unsupported(const TpFinalizeNormSetup& s, int fused_max_tokens, int T,
                                                bool aligned) {
  if (fused_max_tokens > 0 && !s.peer) return "no peer buffers for the one-shot all-reduce";
  allreduce::FusedArNormConfig c;
  c.world = s.world;
  c.dtype = s.dtype;
  c.peer_access = s.peer_access;
  c.D = s.D;
  c.TOPK = s.TOPK;
  c.max_tokens = fused_max_tokens;
  c.T = T;
  c.aligned = aligned;
  if (s.peer) {
    c.slot_elems = s.peer->slot_elems;
    c.co_resident_ranks = s.peer->co_resident_ranks;
    c.resident_blocks = s.peer->resident_blocks;
  }
  return allreduce::fused_ar_norm_unsupported(c);
}

TpFinalizeNorm::TpFinalizeNorm(const TpFinalizeNormSetup& setup) : s_(setup) {
  CHECK(s_.fallback, "tp_finalize_norm: the unfused path needs an all-reduce");
  CHECK(s_.world >= 1 && s_.rank >= 0 && s_.rank < s_.world, "tp_finalize_norm: rank {} of {}", s_.rank, s_.world);
  CHECK(s_.D > 0 && s_.TOPK > 0 && s_.max_tokens >= 0, "tp_finalize_norm: D = {}, TOPK = {}, max_tokens = {}", s_.D,
        s_.TOPK, s_.max_tokens);
  const IntKnob& knob = knobs::kFusedFinalizeArNormMaxTokens;
  fused_max_tokens_ = s_.fused_max_tokens >= 0
                          ? static_cast<int>(std::clamp<int64_t>(s_.fused_max_tokens, knob.min, knob.max))
                          : static_cast<int>(get_knob(knob));
  if (auto why = tp_fused_unsupported(s_, fused_max_tokens_, 0, true))
    log_once(LogLevel::kWarn, "tp_finalize_norm:setup:" + *why,
             fmt::format("fused MoE finalize + all-reduce + RMSNorm off: {}; using moe_finalize + {} all-reduce + "
                         "add_rmsnorm", *why, s_.fallback->name()));
#ifdef DELTASERVE_WITH_CUDA
  if (s_.max_tokens > 0) CUDA_CHECK(cudaMalloc(&scratch_, static_cast<size_t>(s_.max_tokens) * s_.D * 2));
#endif
}

TpFinalizeNorm::~TpFinalizeNorm() {
#ifdef DELTASERVE_WITH_CUDA
  if (scratch_) cudaFree(scratch_);
#endif
}

std::optional<std::string> TpFinalizeNorm::fused_unsupported(int T) const {
  return tp_fused_unsupported(s_, fused_max_tokens_, T, true);
}

bool TpFinalizeNorm::run(const TpFinalizeNormCall& c) {
  const int64_t T = c.T, K = s_.TOPK, D = s_.D;
  CHECK(T >= 0, "tp_finalize_norm: T = {}", T);
  check_view(c.expert_out, "expert_out", s_.dtype, {T, K, D});
  check_view(c.expanded_to_permuted, "expanded_to_permuted", DType::kI32, {T * K});
  check_view(c.topk_weights, "topk_weights", DType::kF32, {T, K});
  if (c.shared_out.data) check_view(c.shared_out, "shared_out", s_.dtype, {T, D});
  CHECK(c.residual && c.norm_w && c.y, "tp_finalize_norm: null residual, norm weight or output");
  const bool aligned = aligned16(c.expert_out.data) && aligned16(c.residual) && aligned16(c.norm_w) &&
                       aligned16(c.y) && aligned16(c.shared_out.data);
  const auto why = tp_fused_unsupported(s_, fused_max_tokens_, c.T, aligned);
  if (!why) {
    allreduce::FusedArNormParams p;
    p.dtype = s_.dtype;
    p.T = c.T;
    p.D = s_.D;
    p.TOPK = s_.TOPK;
    p.eps = s_.eps;
    p.expert_out = c.expert_out.data;
    p.expanded_to_permuted = c.expanded_to_permuted.ptr<int32_t>();
    p.topk_weights = c.topk_weights.ptr<float>();
    p.shared_out = c.shared_out.data;
    p.residual = c.residual;
    p.residual_out = c.residual;
    p.norm_w = c.norm_w;
    p.y = c.y;
    p.comm = *s_.peer;
    p.stream = c.stream;
    allreduce::fused_finalize_ar_norm(p);
    return true;
  }
  if (fused_max_tokens_ > 0 && c.T > fused_max_tokens_)  // expected (prefill, larger decode batches): not a warning
    log_once(LogLevel::kInfo, "tp_finalize_norm:tokens",
             fmt::format("batches above {} tokens use the unfused finalize + {} all-reduce + add_rmsnorm path "
                         "(DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS)", fused_max_tokens_, s_.fallback->name()));
  else
    log_once(LogLevel::kWarn, "tp_finalize_norm:" + *why,
             fmt::format("fused MoE finalize + all-reduce + RMSNorm not used: {}; using moe_finalize + {} "
                         "all-reduce + add_rmsnorm", *why, s_.fallback->name()));
  run_unfused(c);
  return false;
}

void TpFinalizeNorm::run_unfused(const TpFinalizeNormCall& c) {
  CHECK(s_.dtype == DType::kBF16, "tp_finalize_norm: the unfused path is bf16 only (moe_finalize, add_rmsnorm); "
                                  "dtype {}", dtype_name(s_.dtype));
  CHECK(c.T <= s_.max_tokens, "tp_finalize_norm: T = {} exceeds max_tokens = {}", c.T, s_.max_tokens);
  if (c.T == 0) return;
  const int T = c.T, D = s_.D;
  moe::FinalizeParams f;
  f.expert_out = c.expert_out;
  f.expanded_to_permuted = c.expanded_to_permuted;
  f.topk_weights = c.topk_weights;
  f.shared_out = c.shared_out;
  f.out = moe::MoeTensor(scratch_, DType::kBF16, T, D);
  f.stream = c.stream;
  moe::moe_finalize(f);
  s_.fallback->sum(scratch_, static_cast<size_t>(T) * D, DType::kBF16, c.stream);
#ifdef DELTASERVE_WITH_CUDA
  norm::AddRmsNormParams n;
  n.x = static_cast<const bf16_t*>(scratch_);
  n.residual = static_cast<bf16_t*>(c.residual);
  n.w = static_cast<const bf16_t*>(c.norm_w);
  n.y = static_cast<bf16_t*>(c.y);
  n.T = T;
  n.D = D;
  n.eps = s_.eps;
  norm::add_rmsnorm(n, c.stream);
#else
  DS_THROW("tp_finalize_norm: deltaserve was built without CUDA");
#endif
}

}  // namespace ds::parallel
