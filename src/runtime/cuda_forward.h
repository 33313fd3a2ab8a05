// CudaForward: the whole Kimi-Linear forward of one engine step on the GPU, for a DeviceModel, with the
// per-sequence state it needs (KDA state pools, MLA paged latent cache), every activation buffer and workspace
// sized up front, decode steps captured in CUDA graphs per batch bucket, and GPU sampling.
//
// One step (docs/engine.md has the full picture):
//   host   build_step_metadata(plan) -> one host-to-device copy of the blob; fresh slots' KDA state zeroed
//   embed  ids -> h [rows, D] (padding ids -1 give zero rows)
//   layer  x = RMSNorm(h) (fused with the previous dense FFN's residual add)
//          KDA: packed proj GEMM -> copy f_a, g_a -> f_b, g_b GEMMs -> kda_decode (decode rows) / kda_prefill
//               (prefill rows), reading q/k/v/beta as strided column views of the proj output -> o_proj
//          MLA: fused A-GEMM -> cache_write -> mla decode / mla prefill (groups bounded by the workspace) -> o_proj
//          h += attn, x = RMSNorm(h) (add_rmsnorm); FFN: dense gate_up GEMM, silu_mul, down (its residual add
//          fused into the next norm), or moe_forward with the residual add fused into its finalize (h in place)
//   head   sampled rows gathered -> final RMSNorm -> lm_head fp32 logits -> GPU sampler -> tokens to the host
// Decode-only steps always run padded to a bucket (1, 2, 4, ..., max_seqs) with a page-table width class, so
// graphs on and off compute the same shapes and give the same bits; mixed and prefill steps run eagerly.
//
// FP8 models: activations are quantised (quantize_act_fp8, 1x128) before every FP8 GEMM, with the token rows
// padded to a multiple of 8 (the padding rows hold stale finite values; their outputs are never read); steps of
// at most 4 rows (decode buckets 1, 2, 4) instead stream the e4m3 weights against bf16 activations (W8A16, no
// quantiser) unless fp8_decode_gemv is off.
//
// Not thread-safe: one engine thread drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda_model.h"
#include "runtime/step_metadata.h"

namespace ds {

namespace parallel {
class Group;
}

struct CudaForwardOptions {
  int max_seqs = 64;              // KDA state slots (sequences in flight)
  int max_batch_tokens = kDefaultMaxBatchTokens;  // tokens per step (decodes + prefill chunks)
  int page_size = 64;             // tokens per latent page
  int64_t max_model_len = 0;      // tokens per sequence (prompt + generated); 0: the config's, capped at 131072
  int num_pages = 0;              // latent pages per MLA layer; 0: from free memory (memory_fraction)
  double memory_fraction = 0.90;  // of the device's total memory this process may hold once the cache is sized
  int64_t mla_prefill_ctx_rows = 0;  // context rows one MLA prefill call may expand; 0: max(max_model_len, 16384)
  bool cuda_graphs = true;        // capture decode-only steps per (bucket, page width) and replay them
  bool profile = false;           // per-step CUDA-event times per category (eager steps only; adds one sync)
  std::optional<bool> separated_routing;  // unset: DELTASERVE_FORCE_SEPARATED_ROUTING
  std::optional<bool> hf_biased_routing;  // unset: DELTASERVE_HF_BIASED_ROUTING
  std::optional<bool> fp8_decode_gemv;    // unset: DELTASERVE_FP8_DECODE_GEMV (FP8 GEMMs of <= 4 rows: W8A16)
  std::optional<bool> moe_gemv_decode;    // unset: DELTASERVE_MOE_GEMV_DECODE (few-token MoE as TOPK + 1 GEMVs)
  std::optional<int> moe_gemv_tokens;     // unset: DELTASERVE_MOE_GEMV_TOKENS (the gemv decode's token limit)
  std::optional<bool> moe_cluster_route;  // unset: DELTASERVE_MOE_CLUSTER_ROUTE (decode routing in one kernel)
  std::optional<bool> moe_fused_norm;     // unset: DELTASERVE_MOE_FUSED_NORM (next input norm in the MoE op)
  std::optional<bool> fused_input_norm;   // unset: DELTASERVE_FUSED_INPUT_NORM (input norm in the first GEMV)
  std::optional<bool> fused_post_norm;    // unset: DELTASERVE_FUSED_POST_NORM (post-attention norm in o_proj)
  std::optional<bool> moe_fused_route;    // unset: DELTASERVE_MOE_FUSED_ROUTE (router GEMM + top-k, one kernel)
  std::optional<int> moe_gemv_up_cols;    // unset: DELTASERVE_MOE_GEMV_UP_COLS (one-token MoE block shapes)
  std::optional<int> moe_gemv_down_rows;  // unset: DELTASERVE_MOE_GEMV_DOWN_ROWS
  std::optional<bool> moe_down_persistent;  // unset: DELTASERVE_MOE_DOWN_PERSISTENT (one-token down, one wave)
  std::optional<bool> moe_down_preload;   // unset: DELTASERVE_MOE_DOWN_PRELOAD (down's weights before its wait)
  std::optional<int> moe_fp8_prefill_tile;  // unset: DELTASERVE_MOE_FP8_PREFILL_TILE (FP8 prefill GEMM tile rows)
  std::optional<int> moe_stream_tiles;    // unset: DELTASERVE_MOE_STREAM_TILES (decode expert GEMM token tiles)
  std::optional<bool> moe_fp8_decode_wgmma;  // unset: DELTASERVE_MOE_FP8_DECODE_WGMMA (FP8 decode on the wgmma path)
  std::optional<bool> mla_fused_cache_write;  // unset: DELTASERVE_MLA_FUSED_CACHE_WRITE (decode-only steps)
  std::optional<bool> moe_pre_norm;       // unset: DELTASERVE_MOE_PRE_NORM (post-attention norm in the router)
  std::optional<bool> pdl;                // unset: DELTASERVE_PDL (kernels overlap their predecessor's tail)
  // Benchmarks only (bench-engine --ablate, runtime/op_ablation.h): ops whose launches every step skips, by name
  // or category. The outputs are wrong; the step time is the step's without them.
  std::vector<std::string> ablate;
  // This rank's group (TEP or DEP, docs/parallel.md); nullptr: one GPU, exactly the single-GPU forward. The
  // model must be this rank's slice (DeviceModelOptions tp_* / ep_* equal to the group's rank and world).
  std::shared_ptr<parallel::Group> group;
};

// What one step did and, with profiling on, where its GPU time went.
struct StepProfile {
  int num_tokens = 0;       // real tokens computed (decodes + prefill chunk tokens)
  int num_decodes = 0;      // decode sequences (real, without padding)
  int num_prefills = 0;     // prefill chunks
  int prefill_tokens = 0;
  int num_sampled = 0;      // tokens sampled (decodes + last prefill chunks)
  int rows = 0;             // token rows the layers ran on (decode-only steps: the bucket)
  bool graph = false;       // replayed a CUDA graph
  bool captured = false;    // captured that graph in this step (its host time includes warm-up and capture)
  double host_ms = 0;       // wall time of CudaForward::step: metadata, copy, launches or replay, sampling, sync
  // Profile on (eager steps): GPU time between op boundaries, summed per category; gpu_ms = their sum.
  bool timed = false;
  double gpu_ms = 0, kda_ms = 0, mla_ms = 0, moe_ms = 0, gemm_ms = 0, other_ms = 0;
  // The same time per op name (NVTX name, e.g. "kda.proj", "moe"), summed over the step's layers, in first-seen
  // order: which kernels a category's time is made of.
  struct Op {
    std::string name;
    std::string category;  // "kda" | "mla" | "moe" | "gemm" | "other"
    double ms = 0;
    int calls = 0;
  };
  std::vector<Op> ops;
};

// Device memory held by the forward, by purpose (bytes).
struct ForwardMemory {
  size_t weights = 0;      // the DeviceModel (not owned here)
  size_t kda_state = 0;    // recurrent + conv pools
  size_t latent_cache = 0; // MLA pages
  size_t activations = 0;  // per-token buffers, logits, FP8 scratch
  size_t workspaces = 0;   // KDA prefill, MLA decode / prefill, MoE, cuBLASLt
  size_t metadata = 0;     // the device copy of the step blob
};

class CudaForward {
 public:
  // Allocates everything (the latent cache last, sized from free memory unless options.num_pages is set) on the
  // current device. Throws ds::Error with the numbers when something does not fit or the model is unsupported.
  // With a group it is collective: it returns when every rank has constructed its forward (load the model
  // before: a device-synchronising call in one simulated rank while another steps would deadlock).
  CudaForward(std::shared_ptr<const DeviceModel> model, CudaForwardOptions options);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  // Runs one step of `plan` (slots and pages from a Scheduler or built with make_step_plan). tokens: the plan's
  // token ids in row order; samples: one per plan sequence (read where seqs[i].samples). Returns the sampled
  // token of every sampling sequence, in plan order.
  std::vector<int32_t> step(const StepPlan& plan, const std::vector<int32_t>& tokens,
                            const std::vector<SampleSpec>& samples);

  // DEP: a step of a rank with nothing to run while other ranks run theirs: takes part in every MoE layer's
  // exchange and all-to-alls (it may receive tokens for its experts) and computes nothing else. DEP only.
  void step_idle();

  // fp32 logits [num_sampled, vocab] of the last step, in the order step() returned its tokens (copies; tests).
  std::vector<float> last_logits() const;
  const StepProfile& last_profile() const;

  const CudaForwardOptions& options() const;  // with the defaults resolved (max_model_len, num_pages, ...)
  int num_pages() const;
  int max_pages_per_seq() const;              // page-table capacity per sequence
  const std::vector<int>& buckets() const;
  int num_graphs() const;                     // captured so far
  // TEP: MoE layer boundaries launched as the fused finalize + all-reduce + RMSNorm so far (host launches: a
  // captured graph counts once, at capture); 0 without a group.
  int fused_boundaries() const;
  ForwardMemory memory() const;
  const DeviceModel& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
