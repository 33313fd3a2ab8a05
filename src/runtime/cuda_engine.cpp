// CudaEngine: requests, scheduler steps, the CUDA forward and GPU sampling, with CpuEngine's lifecycle rules.
// No CUDA call here: in a build without CUDA, constructing the CudaForward throws.
#include "runtime/cuda_engine.h"

#include <chrono>

#include "core/error.h"
#include "runtime/cpu_engine.h"  // derive_seed
#include "runtime/parallel/group.h"

namespace ds {

struct CudaEngine::Sequence {
  RequestId id = 0;
  Request req;
  uint64_t seed = 0;
  std::vector<int32_t> generated;
};

CudaEngine::CudaEngine(std::shared_ptr<const DeviceModel> model, CudaEngineOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  CHECK(model_ != nullptr, "CudaEngine needs a device model");
  CudaForwardOptions fo;
  fo.max_seqs = options_.max_seqs;
  fo.max_batch_tokens = options_.max_batch_tokens;
  fo.page_size = options_.page_size;
  fo.max_model_len = options_.max_model_len;
  fo.num_pages = options_.num_pages;
  fo.memory_fraction = options_.memory_fraction;
  fo.cuda_graphs = options_.cuda_graphs;
  fo.profile = options_.profile;
  fo.ablate = options_.ablate;
  fo.group = options_.group;
  forward_ = std::make_unique<CudaForward>(model_, fo);
  max_model_len_ = forward_->options().max_model_len;

  SchedulerConfig sc;
  sc.max_seqs = options_.max_seqs;
  sc.max_batch_tokens = options_.max_batch_tokens;
  sc.page_size = options_.page_size;
  sc.num_pages = forward_->num_pages();
  sc.max_model_len = max_model_len_;
  scheduler_ = std::make_unique<Scheduler>(sc);
  counters_.max_seqs = options_.max_seqs;
}

CudaEngine::~CudaEngine() = default;

const ModelConfig& CudaEngine::config() const { return model_->config; }
int CudaEngine::num_pages() const { return scheduler_->num_pages(); }
int CudaEngine::free_pages() const { return scheduler_->free_pages(); }

RequestId CudaEngine::add_request(Request r) {
  if (r.prompt.empty()) DS_THROW("the prompt is empty (at least one token is needed)");
  const int V = model_->config.vocab_size;
  for (int32_t id : r.prompt)
    if (id < 0 || id >= V) DS_THROW("prompt token id {} is outside the vocabulary [0, {})", id, V);
  r.sampling.validate();
  if (static_cast<int64_t>(r.prompt.size()) >= max_model_len_)
    DS_THROW("the prompt has {} tokens; the model's context is {} tokens (prompt + at least 1 generated)",
             r.prompt.size(), max_model_len_);
  const RequestId id = next_id_;
  // Throws (nothing queued) when the request's lifetime pages exceed the whole cache: it could never run.
  scheduler_->add(id, static_cast<int>(r.prompt.size()), r.sampling.max_tokens);
  ++next_id_;
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->seed = r.sampling.seed.value_or(derive_seed(options_.seed, id));
  s->req = std::move(r);
  seqs_.emplace(id, std::move(s));
  return id;
}

bool CudaEngine::cancel(RequestId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  const Sequence& s = *it->second;
  CHECK(scheduler_->cancel(id), "request {} known to the engine but not to the scheduler", id);  // frees at once
  pending_.push_back({id, {}, true, FinishReason::kCancelled, static_cast<int>(s.req.prompt.size()),
                      static_cast<int>(s.generated.size())});
  seqs_.erase(it);
  return true;
}

std::vector<RequestOutput> CudaEngine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RequestOutput> outs = std::move(pending_);
  pending_.clear();
  ++counters_.steps;
  last_ = {};

  const StepPlan plan = scheduler_->schedule();
  if (!plan.empty()) {
    std::vector<int32_t> tokens;
    tokens.reserve(plan.num_tokens);
    std::vector<SampleSpec> samples(plan.seqs.size());
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& q = plan.seqs[i];
      const Sequence& s = *seqs_.at(q.id);
      if (q.prefill) {
        tokens.insert(tokens.end(), s.req.prompt.begin() + q.start, s.req.prompt.begin() + q.start + q.num_tokens);
        counters_.prompt_tokens += q.num_tokens;
      } else {
        tokens.push_back(s.generated.back());
      }
      if (q.samples) {
        const SamplingParams& p = s.req.sampling;
        samples[i] = {p.temperature, p.top_k, p.top_p, s.seed, static_cast<int64_t>(s.generated.size())};
      }
    }
    const std::vector<int32_t> sampled = forward_->step(plan, tokens, samples);

    std::vector<RequestId> finished;
    size_t k = 0;
    for (const ScheduledSeq& q : plan.seqs) {
      if (!q.samples) continue;
      Sequence& s = *seqs_.at(q.id);
      const int32_t tok = sampled.at(k++);
      s.generated.push_back(tok);
      ++counters_.generated_tokens;
      const int64_t total = static_cast<int64_t>(s.req.prompt.size() + s.generated.size());
      const FinishReason r = finish_after(tok, static_cast<int>(s.generated.size()), total, s.req.sampling,
                                          options_.eos_token_ids, max_model_len_);
      outs.push_back({s.id, {tok}, r != FinishReason::kNone, r, static_cast<int>(s.req.prompt.size()),
                      static_cast<int>(s.generated.size())});
      if (r != FinishReason::kNone) finished.push_back(s.id);
    }
    scheduler_->complete(plan, finished);  // frees the finished sequences' slots and pages
    for (RequestId id : finished) seqs_.erase(id);
    last_.forward = forward_->last_profile();
  } else if (options_.group && options_.group->mode() == parallel::Mode::kDep) {
    forward_->step_idle();  // DEP: the other ranks' MoE layers need this rank's all-to-alls (group_has_work())
  }
  last_.running = scheduler_->running();
  last_.waiting = scheduler_->waiting();
  last_.free_pages = scheduler_->free_pages();
  last_.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return outs;
}

std::map<std::string, double> CudaEngine::last_step_categories() const {
  const StepProfile& p = last_.forward;
  if (!p.timed) return {};
  return {{"kda", p.kda_ms}, {"mla", p.mla_ms}, {"moe", p.moe_ms}, {"gemm", p.gemm_ms}, {"other", p.other_ms}};
}

bool CudaEngine::has_work() const { return !seqs_.empty() || !pending_.empty(); }

bool CudaEngine::group_has_work() {
  const bool mine = has_work();
  if (!options_.group || options_.group->mode() == parallel::Mode::kTep) return mine;
  for (const std::string& r : options_.group->exchange(mine ? "1" : "0"))
    if (r == "1") return true;
  return false;
}

EngineStats CudaEngine::stats() const {
  EngineStats s = counters_;
  s.running = scheduler_->running();
  s.waiting = scheduler_->waiting();
  s.slots_in_use = scheduler_->slots_in_use();
  s.free_slots = options_.max_seqs - s.slots_in_use;
  return s;
}


}  // namespace ds
