// Scheduler: continuous batching with chunked prefill over a fixed pool of KDA state slots and MLA latent pages.
//
// Per step it builds a StepPlan once on the host (decodes first, then prefill chunks up to the token budget),
// so the GPU engine copies the plan's metadata once and every kernel launch only reads device pointers.
//
// Memory admission: a request is admitted only when a state slot is free and the latent pages for its whole
// lifetime (prompt + max_tokens, capped by max_model_len) can be reserved. Reserving up front means a running
// sequence can never run out of pages mid-decode, so the process never runs out of memory and no preemption is
// needed; the cost is that pages for tokens not yet generated sit idle. A request that does not fit waits.
// Finished or cancelled sequences return their slot and pages at once.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "runtime/engine.h"

namespace ds {

// Fixed pool of state-slot indices (each slot = one sequence's KDA recurrent + conv state on the device).
class SlotPool {
 public:
  explicit SlotPool(int capacity);
  std::optional<int> acquire();
  void release(int slot);  // throws on a double release
  int capacity() const { return static_cast<int>(used_.size()); }
  int in_use() const { return in_use_; }

 private:
  std::vector<int> free_;   // LIFO: a freed slot is reused first
  std::vector<bool> used_;
  int in_use_ = 0;
};

// Fixed pool of latent-cache pages (page_size tokens x 576 values per MLA layer each).
class PageAllocator {
 public:
  PageAllocator(int num_pages, int page_size);
  int pages_for(int64_t tokens) const { return static_cast<int>((tokens + page_size_ - 1) / page_size_); }
  bool can_allocate(int n) const { return n <= static_cast<int>(free_.size()); }
  std::vector<int32_t> allocate(int n);  // throws when fewer than n are free (callers check can_allocate)
  void release(const std::vector<int32_t>& pages);
  int free_pages() const { return static_cast<int>(free_.size()); }
  int num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }

 private:
  int num_pages_, page_size_;
  std::vector<int32_t> free_;
  std::vector<bool> used_;
};

// The token budget per step that every engine option and the `--max-batch-tokens` of bench-engine and serve
// default to: a long prompt prefills in few large steps (H100, FP8, one 8192-token prompt:
// TTFT 127 ms against 182 ms in 2048-token steps; docs/perf-engine.md), at the price of a longer step for the
// decodes running beside it.
inline constexpr int kDefaultMaxBatchTokens = 8192;

struct SchedulerConfig {
  int max_seqs = 64;            // state slots
  // Tokens per step over decodes + prefill chunks (>= max_seqs for full decodes).
  int max_batch_tokens = kDefaultMaxBatchTokens;
  int page_size = 64;           // tokens per latent page
  int num_pages = 4096;
  int64_t max_model_len = 0;    // 0: no limit beyond pages
};

// One sequence's share of a step.
struct ScheduledSeq {
  RequestId id = 0;
  int slot = -1;
  int64_t start = 0;       // position of the first token computed this step (= tokens already in its state)
  int num_tokens = 0;      // tokens computed this step (1 for a decode)
  bool prefill = false;    // prompt tokens (possibly a chunk of them)
  bool samples = false;    // this step ends with a sampled token (decode, or the last prefill chunk)
};

// Host-side metadata of one step, flattened for one host-to-device copy.
struct StepPlan {
  std::vector<ScheduledSeq> seqs;    // decodes first (num_decodes of them), then prefill chunks
  int num_decodes = 0;
  int num_tokens = 0;                // sum of num_tokens
  std::vector<int32_t> cu_seqlens;   // [seqs + 1]
  std::vector<int32_t> slot_ids;     // [seqs]
  std::vector<int32_t> context_lens; // [seqs] tokens in the latent cache after this step
  int max_pages_per_seq = 0;
  std::vector<int32_t> page_table;   // [seqs, max_pages_per_seq], -1 padded
  bool empty() const { return seqs.empty(); }
};

// Flattens `seqs` (decodes first, then prefill chunks) and each one's latent pages (pages[i] for seqs[i]) into a
// StepPlan. The Scheduler builds its plans with it; tests build plans by hand with it.
StepPlan make_step_plan(std::vector<ScheduledSeq> seqs, const std::vector<std::vector<int32_t>>& pages);

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);

  // Queues a request (FIFO). Throws ds::Error when it can never be admitted (needs more pages than exist).
  void add(RequestId id, int prompt_len, int max_new_tokens);
  // Latent pages a request of this shape reserves for its lifetime.
  int pages_needed(int prompt_len, int max_new_tokens) const;
  // Frees a waiting or running sequence's resources at once; false if unknown.
  bool cancel(RequestId id);
  // Admits what fits, then plans decodes (all running sequences past their prompt) and prefill chunks in
  // admission order until the token budget is spent.
  StepPlan schedule();
  // After the step ran: `finished` lists sequences that stopped (eos, length); their resources are freed.
  // Every sequence in the plan advances by its num_tokens (+ the sampled token joins its next decode).
  void complete(const StepPlan& plan, const std::vector<RequestId>& finished);

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int slots_in_use() const { return slots_.in_use(); }
  int free_pages() const { return pages_.free_pages(); }
  int num_pages() const { return pages_.num_pages(); }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Seq {
    RequestId id;
    int prompt_len;
    int max_new_tokens;
    int slot = -1;
    int64_t computed = 0;   // tokens whose effect is in the state / cache
    int generated = 0;      // sampled tokens so far
    std::vector<int32_t> pages;
  };
  int64_t lifetime_tokens(const Seq& s) const;
  void release(Seq& s);

  SchedulerConfig cfg_;
  SlotPool slots_;
  PageAllocator pages_;
  std::deque<Seq> waiting_;
  std::map<RequestId, Seq> running_;
  std::vector<RequestId> order_;  // admission order of running sequences
};

}  // namespace ds
