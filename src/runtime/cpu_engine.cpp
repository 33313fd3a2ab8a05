// CpuEngine: slots, waiting queue, chunked prefill and one-token decode steps on the CPU reference model.
#include "runtime/cpu_engine.h"

#include <algorithm>

#include "core/error.h"

namespace ds {

uint64_t derive_seed(uint64_t engine_seed, RequestId id) {
  uint64_t z = engine_seed + id * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct CpuEngine::Sequence {
  RequestId id = 0;
  Request req;
  Sampler sampler;
  int slot = -1;
  size_t prefilled = 0;            // prompt tokens consumed
  std::vector<int32_t> generated;  // sampled tokens

  Sequence(RequestId i, Request r, uint64_t seed) : id(i), req(std::move(r)), sampler(req.sampling, seed) {}
  bool decoding() const { return prefilled == req.prompt.size(); }
};

CpuEngine::CpuEngine(std::shared_ptr<const CpuModel> model, CpuEngineOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  CHECK(model_ != nullptr, "CpuEngine needs a model");
  if (options_.max_seqs < 1) DS_THROW("max_seqs must be >= 1 (got {})", options_.max_seqs);
  if (options_.max_prefill_tokens < 1) DS_THROW("max_prefill_tokens must be >= 1 (got {})", options_.max_prefill_tokens);
  max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : model_->config().model_max_length;
  slots_.reserve(options_.max_seqs);
  for (int i = 0; i < options_.max_seqs; ++i) slots_.push_back(model_->new_state());
  for (int i = options_.max_seqs - 1; i >= 0; --i) free_slots_.push_back(i);
  counters_.max_seqs = options_.max_seqs;
}

CpuEngine::~CpuEngine() = default;

RequestId CpuEngine::add_request(Request r) {
  if (r.prompt.empty()) DS_THROW("the prompt is empty (at least one token is needed)");
  const int V = model_->vocab_size();
  for (int32_t id : r.prompt)
    if (id < 0 || id >= V) DS_THROW("prompt token id {} is outside the vocabulary [0, {})", id, V);
  r.sampling.validate();
  if (max_model_len_ > 0 && static_cast<int64_t>(r.prompt.size()) >= max_model_len_)
    DS_THROW("the prompt has {} tokens; the model's context is {} tokens (prompt + at least 1 generated)",
             r.prompt.size(), max_model_len_);
  const RequestId id = next_id_++;
  const uint64_t seed = r.sampling.seed.value_or(derive_seed(options_.seed, id));
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(r), seed));
  return id;
}

void CpuEngine::release_slot(Sequence& s) {
  if (s.slot >= 0) {
    free_slots_.push_back(s.slot);
    s.slot = -1;
  }
}

bool CpuEngine::cancel(RequestId id) {
  auto report = [&](const Sequence& s) {
    pending_.push_back({id, {}, true, FinishReason::kCancelled, static_cast<int>(s.req.prompt.size()),
                        static_cast<int>(s.generated.size())});
  };
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      report(**it);
      waiting_.erase(it);
      return true;
    }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if ((*it)->id == id) {
      report(**it);
      release_slot(**it);  // the slot is free before the next step
      running_.erase(it);
      return true;
    }
  return false;
}

RequestOutput CpuEngine::emit_token(Sequence& s, const std::vector<float>& logits) {
  const int32_t tok = s.sampler.sample(logits.data(), model_->vocab_size());
  s.generated.push_back(tok);
  ++counters_.generated_tokens;
  const int64_t total = static_cast<int64_t>(s.req.prompt.size() + s.generated.size());
  const FinishReason r = finish_after(tok, static_cast<int>(s.generated.size()), total, s.req.sampling,
                                      options_.eos_token_ids, max_model_len_);
  RequestOutput out{s.id, {tok}, r != FinishReason::kNone, r, static_cast<int>(s.req.prompt.size()),
                    static_cast<int>(s.generated.size())};
  if (out.finished) release_slot(s);
  return out;
}

std::vector<RequestOutput> CpuEngine::step() {
  std::vector<RequestOutput> outs = std::move(pending_);
  pending_.clear();
  ++counters_.steps;

  while (!waiting_.empty() && !free_slots_.empty()) {
    auto s = std::move(waiting_.front());
    waiting_.pop_front();
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[s->slot].reset();
    running_.push_back(std::move(s));
  }

  // Decode first: a sequence whose prefill completes below already got its first token from the prefill logits.
  std::vector<Sequence*> decode;
  for (auto& s : running_)
    if (s->decoding()) decode.push_back(s.get());
  for (Sequence* s : decode) {
    const auto logits = model_->forward({s->generated.back()}, slots_[s->slot]);
    outs.push_back(emit_token(*s, logits));
  }

  int budget = options_.max_prefill_tokens;
  for (auto& s : running_) {
    if (s->decoding() || s->slot < 0 || budget == 0) continue;
    const size_t n = std::min<size_t>(budget, s->req.prompt.size() - s->prefilled);
    const std::vector<int32_t> chunk(s->req.prompt.begin() + s->prefilled, s->req.prompt.begin() + s->prefilled + n);
    const auto logits = model_->forward(chunk, slots_[s->slot]);
    s->prefilled += n;
    budget -= static_cast<int>(n);
    counters_.prompt_tokens += static_cast<int64_t>(n);
    if (s->decoding()) outs.push_back(emit_token(*s, logits));
  }

  std::erase_if(running_, [](const auto& s) { return s->slot < 0; });  // finished this step
  return outs;
}

bool CpuEngine::has_work() const { return !waiting_.empty() || !running_.empty() || !pending_.empty(); }

EngineStats CpuEngine::stats() const {
  EngineStats s = counters_;
  s.running = static_cast<int>(running_.size());
  s.waiting = static_cast<int>(waiting_.size());
  s.free_slots = static_cast<int>(free_slots_.size());
  s.slots_in_use = options_.max_seqs - s.free_slots;
  return s;
}

ReferenceGeneration generate_reference(const CpuModel& model, const std::vector<int32_t>& prompt,
                                       const SamplingParams& params, const std::vector<int32_t>& eos_token_ids,
                                       uint64_t seed, int64_t max_model_len) {
  CHECK(!prompt.empty(), "empty prompt");
  params.validate();
  if (max_model_len == 0) max_model_len = model.config().model_max_length;
  SequenceState state = model.new_state();
  Sampler sampler(params, seed);
  ReferenceGeneration g;
  std::vector<float> logits = model.forward(prompt, state);
  while (true) {
    const int32_t tok = sampler.sample(logits.data(), model.vocab_size());
    g.tokens.push_back(tok);
    g.reason = finish_after(tok, static_cast<int>(g.tokens.size()), static_cast<int64_t>(prompt.size() + g.tokens.size()),
                            params, eos_token_ids, max_model_len);
    if (g.reason != FinishReason::kNone) return g;
    logits = model.forward({tok}, state);
  }
}

}  // namespace ds
