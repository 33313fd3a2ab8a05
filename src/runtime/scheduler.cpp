// Scheduler, slot pool and page allocator (see scheduler.h for the admission policy).
#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace ds {

SlotPool::SlotPool(int capacity) : used_(capacity, false) {
  CHECK_GT(capacity, 0);
  for (int i = capacity - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<int> SlotPool::acquire() {
  if (free_.empty()) return std::nullopt;
  const int s = free_.back();
  free_.pop_back();
  used_[s] = true;
  ++in_use_;
  return s;
}

void SlotPool::release(int slot) {
  CHECK(slot >= 0 && slot < capacity() && used_[slot], "slot {} released twice or never acquired", slot);
  used_[slot] = false;
  free_.push_back(slot);
  --in_use_;
}

PageAllocator::PageAllocator(int num_pages, int page_size)
    : num_pages_(num_pages), page_size_(page_size), used_(num_pages, false) {
  CHECK_GT(num_pages, 0);
  CHECK_GT(page_size, 0);
  for (int i = num_pages - 1; i >= 0; --i) free_.push_back(i);
}

std::vector<int32_t> PageAllocator::allocate(int n) {
  CHECK(can_allocate(n), "{} pages requested, {} free", n, free_.size());
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (int32_t p : out) used_[p] = true;
  return out;
}

void PageAllocator::release(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    CHECK(p >= 0 && p < num_pages_ && used_[p], "page {} released twice or never allocated", p);
    used_[p] = false;
    free_.push_back(p);
  }
}

Scheduler::Scheduler(SchedulerConfig config)
    : cfg_(config), slots_(config.max_seqs), pages_(config.num_pages, config.page_size) {
  CHECK_GT(cfg_.max_batch_tokens, 0);
}

int64_t Scheduler::lifetime_tokens(const Seq& s) const {
  int64_t t = static_cast<int64_t>(s.prompt_len) + s.max_new_tokens;
  if (cfg_.max_model_len > 0) t = std::min(t, cfg_.max_model_len);
  return t;
}

int Scheduler::pages_needed(int prompt_len, int max_new_tokens) const {
  return pages_.pages_for(lifetime_tokens(Seq{0, prompt_len, max_new_tokens, -1, 0, 0, {}}));
}

void Scheduler::add(RequestId id, int prompt_len, int max_new_tokens) {
  CHECK_GT(prompt_len, 0);
  CHECK_GT(max_new_tokens, 0);
  Seq s{id, prompt_len, max_new_tokens, -1, 0, 0, {}};
  const int need = pages_.pages_for(lifetime_tokens(s));
  if (need > pages_.num_pages())
    DS_THROW("the request can never fit: prompt ({} tokens) + max_tokens ({}) needs {} tokens of latent cache = {} "
             "pages of {} tokens, but the whole cache holds {} pages ({} tokens); shorten the prompt or max_tokens",
             prompt_len, max_new_tokens, lifetime_tokens(s), need, pages_.page_size(), pages_.num_pages(),
             static_cast<int64_t>(pages_.num_pages()) * pages_.page_size());
  waiting_.push_back(std::move(s));
}

void Scheduler::release(Seq& s) {
  if (s.slot >= 0) slots_.release(s.slot);
  s.slot = -1;
  pages_.release(s.pages);
  s.pages.clear();
}

bool Scheduler::cancel(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (it->id == id) {
      waiting_.erase(it);
      return true;
    }
  auto it = running_.find(id);
  if (it == running_.end()) return false;
  release(it->second);
  running_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  return true;
}

StepPlan Scheduler::schedule() {
  // Admission: strictly FIFO (a large request at the head is not overtaken, so it cannot starve).
  while (!waiting_.empty()) {
    Seq& s = waiting_.front();
    const int need = pages_.pages_for(lifetime_tokens(s));
    if (!pages_.can_allocate(need)) break;
    auto slot = slots_.acquire();
    if (!slot) break;
    s.slot = *slot;
    s.pages = pages_.allocate(need);
    const RequestId id = s.id;
    running_.emplace(id, std::move(s));
    waiting_.pop_front();
    order_.push_back(id);
  }

  StepPlan plan;
  int budget = cfg_.max_batch_tokens;
  for (RequestId id : order_) {  // decodes: one token each, ahead of any prefill (latency first)
    const Seq& s = running_.at(id);
    if (s.computed < s.prompt_len || budget == 0) continue;
    plan.seqs.push_back({id, s.slot, s.computed, 1, false, true});
    --budget;
  }
  plan.num_decodes = static_cast<int>(plan.seqs.size());
  for (RequestId id : order_) {  // prefill chunks in admission order
    if (budget == 0) break;
    const Seq& s = running_.at(id);
    if (s.computed >= s.prompt_len) continue;
    const int n = static_cast<int>(std::min<int64_t>(budget, s.prompt_len - s.computed));
    plan.seqs.push_back({id, s.slot, s.computed, n, true, s.computed + n == s.prompt_len});
    budget -= n;
  }

  std::vector<std::vector<int32_t>> pages;
  pages.reserve(plan.seqs.size());
  for (const auto& q : plan.seqs) pages.push_back(running_.at(q.id).pages);
  return make_step_plan(std::move(plan.seqs), pages);
}

StepPlan make_step_plan(std::vector<ScheduledSeq> seqs, const std::vector<std::vector<int32_t>>& pages) {
  CHECK_EQ(seqs.size(), pages.size());
  StepPlan plan;
  plan.seqs = std::move(seqs);
  while (plan.num_decodes < static_cast<int>(plan.seqs.size()) && !plan.seqs[plan.num_decodes].prefill)
    ++plan.num_decodes;
  plan.cu_seqlens.push_back(0);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const auto& q = plan.seqs[i];
    CHECK(q.prefill || static_cast<int>(i) < plan.num_decodes, "decodes must come before prefill chunks");
    CHECK(q.num_tokens > 0 && (q.prefill || q.num_tokens == 1), "sequence {}: {} tokens", q.id, q.num_tokens);
    plan.num_tokens += q.num_tokens;
    plan.cu_seqlens.push_back(plan.num_tokens);
    plan.slot_ids.push_back(q.slot);
    plan.context_lens.push_back(static_cast<int32_t>(q.start + q.num_tokens));
    plan.max_pages_per_seq = std::max(plan.max_pages_per_seq, static_cast<int>(pages[i].size()));
  }
  plan.page_table.assign(plan.seqs.size() * plan.max_pages_per_seq, -1);
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    std::copy(pages[i].begin(), pages[i].end(), plan.page_table.begin() + i * plan.max_pages_per_seq);
  return plan;
}

void Scheduler::complete(const StepPlan& plan, const std::vector<RequestId>& finished) {
  for (const auto& q : plan.seqs) {
    auto it = running_.find(q.id);
    if (it == running_.end()) continue;  // cancelled while the step ran
    it->second.computed += q.num_tokens;
    if (q.samples) ++it->second.generated;
  }
  for (RequestId id : finished) cancel(id);
}

}  // namespace ds
