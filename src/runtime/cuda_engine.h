// CudaEngine: the Engine on the GPU — continuous batching with chunked prefill (Scheduler), KDA state slots and
// MLA latent pages admitted by memory, the whole forward in CudaForward (decode steps in CUDA graphs), and GPU
// sampling. Request lifecycle, finish rules, seeds and stats are those of CpuEngine (runtime/cpu_engine.h).
//
// Admission: a request is admitted when a state slot is free AND the latent pages for its whole lifetime
// (prompt + max_tokens, capped by max_model_len) can be reserved; otherwise it waits (FIFO). The number of pages
// comes from the free device memory once weights, state pools, activations and workspaces are allocated, times
// memory_fraction (CudaForwardOptions). A request that could never fit (more pages than the whole cache, or a
// prompt of max_model_len tokens or more) is refused by add_request with an error that gives the numbers.
// A cancelled or finished request frees its slot and pages at once.
//
// Sampling: greedy / temperature / top-k / top-p on the GPU; a request's seed (its own, or derive_seed(engine
// seed, id)) keys a Philox generator whose counter is the index of the token being sampled, so a request draws
// the same tokens whatever it is batched with and whether graphs are on or off.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda_forward.h"
#include "runtime/engine.h"

namespace ds {

struct CudaEngineOptions {
  int max_seqs = 64;               // state slots (sequences in flight; the largest decode graph bucket)
  int max_batch_tokens = kDefaultMaxBatchTokens;  // token budget per step: decodes first, then prefill chunks
  int page_size = 64;              // tokens per latent page
  double memory_fraction = 0.90;   // of total device memory the process may hold after sizing the cache
  int num_pages = 0;               // > 0: exactly this many latent pages (tests); 0: from free memory
  int64_t max_model_len = 0;       // prompt + generated limit; 0: config.model_max_length capped at 131072
  bool cuda_graphs = true;         // decode-only steps replay CUDA graphs per batch bucket
  std::vector<int32_t> eos_token_ids;  // stop ids unless a request sets ignore_eos
  uint64_t seed = 0;               // requests without a seed get derive_seed(seed, request id)
  bool profile = false;            // per-step GPU time per category (runs every step eagerly; see StepProfile)
  std::vector<std::string> ablate;  // benchmarks only: ops skipped in every step (CudaForwardOptions::ablate)
  // This rank's parallel group (docs/parallel.md); nullptr: one GPU. The model must be this rank's slice.
  // TEP: every rank must be given the same requests in the same order (same ids, same plans); the sampled tokens
  // are rank 0's on every rank. DEP: each rank serves its own requests; see group_has_work().
  std::shared_ptr<parallel::Group> group;
};

// What the last step() did, for benchmarks (bench-engine) and logs.
struct EngineStepStats {
  double wall_ms = 0;     // the whole step() call: scheduling, metadata, forward, sampling, bookkeeping
  StepProfile forward;    // the forward's share (counts, graph use, host time, and category times with profile on)
  int running = 0;        // after the step
  int waiting = 0;
  int free_pages = 0;
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(std::shared_ptr<const DeviceModel> model, CudaEngineOptions options);
  ~CudaEngine() override;

  RequestId add_request(Request request) override;
  bool cancel(RequestId id) override;
  std::vector<RequestOutput> step() override;
  bool has_work() const override;
  // The loop condition of a rank in a group: call it on every rank once per loop iteration, then call step() on
  // every rank when it returns true. One GPU and TEP: has_work() (TEP ranks hold the same requests). DEP: a host
  // collective (group->exchange) that is true when any rank has work; step() then runs this rank's batch, or an
  // idle forward that only takes part in the MoE layers' all-to-alls when this rank has nothing to run.
  bool group_has_work();
  EngineStats stats() const override;
  const ModelConfig& config() const override;

  const EngineStepStats& last_step() const { return last_; }
  // The last step's GPU ms per category {"kda", "mla", "moe", "gemm", "other"} (engine_bench's StepProfileFn
  // shape); empty unless options.profile (then every step runs eagerly: time graphs with profile off).
  std::map<std::string, double> last_step_categories() const;
  int num_pages() const;
  int free_pages() const;
  int page_size() const { return options_.page_size; }
  int64_t max_model_len() const { return max_model_len_; }
  const CudaForward& forward() const { return *forward_; }

 private:
  struct Sequence;

  std::shared_ptr<const DeviceModel> model_;
  CudaEngineOptions options_;
  std::unique_ptr<CudaForward> forward_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t max_model_len_ = 0;
  std::map<RequestId, std::unique_ptr<Sequence>> seqs_;  // waiting and running
  std::vector<RequestOutput> pending_;                   // cancellations to report at the next step
  RequestId next_id_ = 1;
  EngineStats counters_;
  EngineStepStats last_;
};

}  // namespace ds
