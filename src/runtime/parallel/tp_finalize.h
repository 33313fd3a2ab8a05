// The tensor-parallel layer boundary after a MoE block: the deferred MoE outputs become the next layer's
// normalised input. Fused (one kernel: finalize + one-shot all-reduce + residual add + RMSNorm) where the gate
// allows, otherwise the unfused path: moe_finalize -> all-reduce (NCCL, or the peer one) -> add_rmsnorm. Both
// follow the same rounding contract (kernels/allreduce/allreduce.h). Every reason for the unfused path is
// logged once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "kernels/allreduce/allreduce.h"
#include "kernels/moe/moe.h"
#include "runtime/parallel/all_reduce.h"

namespace ds::parallel {

// The one-shot peer all-reduce as the unfused path's all-reduce (simulated ranks on one GPU, or a single node
// without NCCL). It shares the fused kernel's buffers and epoch: run both on the set's owner stream.
class PeerAllReduce : public AllReduce {
 public:
  explicit PeerAllReduce(const allreduce::RankView& view) : view_(view) {}
  void sum(void* data, size_t count, DType dtype, cudaStream_t stream) override;
  std::string name() const override { return "one-shot peer"; }

 private:
  const allreduce::RankView& view_;
};

struct TpFinalizeNormSetup {
  int rank = 0, world = 1;
  int D = 0, TOPK = 0;
  DType dtype = DType::kBF16;
  float eps = 1e-5f;
  int max_tokens = 0;                    // largest T of any call (sizes the unfused path's scratch)
  int fused_max_tokens = -1;             // -1: DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS
  const allreduce::RankView* peer = nullptr;  // the fused kernel's buffers; nullptr: never fused
  bool peer_access = false;              // agreed by every rank (PeerBuffers::peer_access())
  AllReduce* fallback = nullptr;         // the unfused path's all-reduce (required)
};

// One call: the deferred outputs of moe_forward (do_finalize = false) as MoeResult hands them back.
struct TpFinalizeNormCall {
  int T = 0;
  moe::MoeTensor expert_out;            // [T, TOPK, D] dtype
  moe::MoeTensor expanded_to_permuted;  // i32 [T * TOPK]
  moe::MoeTensor topk_weights;          // f32 [T, TOPK]
  moe::MoeTensor shared_out;            // [T, D] dtype, or empty (see allreduce.h for which ranks pass it)
  void* residual = nullptr;             // [T, D] dtype, in/out: residual + sum over ranks
  const void* norm_w = nullptr;         // [D] the next layer's RMSNorm weight
  void* y = nullptr;                    // [T, D] normalised output
  cudaStream_t stream = nullptr;
};

// The gate as a pure function: nullopt when a call with T tokens (operands aligned or not) runs fused, else the
// reason. Every rank computes the same answer (same set-up, knob, T and allocation pattern).
std::optional<std::string> tp_fused_unsupported(const TpFinalizeNormSetup& s, int fused_max_tokens, int T,
                                                bool aligned);

class TpFinalizeNorm {
 public:
  // Reads the knob (a non-integer throws: start-up stops) and allocates the unfused path's scratch.
  explicit TpFinalizeNorm(const TpFinalizeNormSetup& setup);
  ~TpFinalizeNorm();
  TpFinalizeNorm(const TpFinalizeNorm&) = delete;
  TpFinalizeNorm& operator=(const TpFinalizeNorm&) = delete;

  // Why a call with T tokens would take the unfused path (nullopt: fused).
  std::optional<std::string> fused_unsupported(int T) const;
  // Runs the call on its stream; returns true when it ran fused.
  bool run(const TpFinalizeNormCall& c);
  int fused_max_tokens() const { return fused_max_tokens_; }

 private:
  void run_unfused(const TpFinalizeNormCall& c);
  TpFinalizeNormSetup s_;
  int fused_max_tokens_ = 0;
  void* scratch_ = nullptr;  // [max_tokens, D] bf16: the finalize output the all-reduce sums in place
};

}  // namespace ds::parallel
