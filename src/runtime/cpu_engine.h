// CpuEngine: the Engine on the fp32 CPU reference model — continuous batching in its simplest honest form.
//
// max_seqs state slots (each a SequenceState: KDA recurrent + conv state, MLA latent caches), a FIFO waiting
// queue, and per step: admit waiting requests into free slots, decode one token for every running request that
// finished its prefill in an earlier step, then spend up to max_prefill_tokens prompt tokens on prefills
// (chunked: a long prompt continues next step from its saved state). Sequences run one after another through
// CpuModel::forward; batching here is scheduling, not shared GEMMs.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "model/cpu_model.h"
#include "runtime/engine.h"

namespace ds {

struct CpuEngineOptions {
  int max_seqs = 8;                     // state slots
  int max_prefill_tokens = 512;         // prompt tokens prefilled per step, over all sequences (>= 1)
  int64_t max_model_len = 0;            // prompt + generated limit; 0 = config.model_max_length (0 there: none)
  std::vector<int32_t> eos_token_ids;   // stop ids unless a request sets ignore_eos
  uint64_t seed = 0;                    // requests without a seed get splitmix64(seed + request id)
};

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<const CpuModel> model, CpuEngineOptions options);
  ~CpuEngine() override;

  RequestId add_request(Request request) override;
  bool cancel(RequestId id) override;
  std::vector<RequestOutput> step() override;
  bool has_work() const override;
  EngineStats stats() const override;
  const ModelConfig& config() const override { return model_->config(); }

 private:
  struct Sequence;

  void release_slot(Sequence& s);  // at once when a request finishes or is cancelled
  // Samples from logits, appends the token and decides whether the sequence finished.
  RequestOutput emit_token(Sequence& s, const std::vector<float>& logits);

  std::shared_ptr<const CpuModel> model_;
  CpuEngineOptions options_;
  int64_t max_model_len_ = 0;
  std::vector<SequenceState> slots_;
  std::vector<int> free_slots_;                    // LIFO: a freed slot is reused first (warm caches)
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_; // admission order
  std::vector<RequestOutput> pending_;             // cancellations to report at the next step
  RequestId next_id_ = 1;
  EngineStats counters_;
};

// The same generation as one CpuEngine request, without a scheduler: prefill the prompt in one forward, then
// decode token by token. Engine tests compare against it.
struct ReferenceGeneration {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
};
ReferenceGeneration generate_reference(const CpuModel& model, const std::vector<int32_t>& prompt,
                                       const SamplingParams& params, const std::vector<int32_t>& eos_token_ids,
                                       uint64_t seed, int64_t max_model_len = 0);

// splitmix64: the seed of a request that did not set one.
uint64_t derive_seed(uint64_t engine_seed, RequestId id);

}  // namespace ds
