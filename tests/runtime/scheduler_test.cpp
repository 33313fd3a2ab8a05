// Scheduler: admission by slots and pages, token budget, chunked prefill, and no leak after any sequence.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"
#include "runtime/scheduler.h"

namespace ds {
namespace {

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.max_seqs = 3;
  c.max_batch_tokens = 16;
  c.page_size = 4;
  c.num_pages = 20;
  return c;
}

TEST(Scheduler, DecodesFirstThenPrefillChunksWithinBudget) {
  Scheduler s(small_config());
  s.add(1, 10, 2);  // 12 tokens -> 3 pages
  s.add(2, 30, 2);  // 32 tokens -> 8 pages
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.num_decodes, 0);
  EXPECT_EQ(p.seqs[0].num_tokens, 10);
  EXPECT_TRUE(p.seqs[0].samples);
  EXPECT_EQ(p.seqs[1].num_tokens, 6);  // the rest of the 16-token budget: a chunk
  EXPECT_FALSE(p.seqs[1].samples);
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 10, 16}));
  EXPECT_EQ(p.context_lens, (std::vector<int32_t>{10, 6}));
  EXPECT_EQ(p.max_pages_per_seq, 8);
  EXPECT_EQ(p.page_table.size(), 16u);
  EXPECT_EQ(p.page_table[3], -1);  // seq 1 has 3 pages, padded with -1
  s.complete(p, {});
  p = s.schedule();
  ASSERT_EQ(p.num_decodes, 1);  // seq 1 decodes its sampled token first
  EXPECT_EQ(p.seqs[0].id, 1u);
  EXPECT_EQ(p.seqs[0].start, 10);
  EXPECT_EQ(p.seqs[1].id, 2u);
  EXPECT_EQ(p.seqs[1].start, 6);
  EXPECT_EQ(p.seqs[1].num_tokens, 15);
}

TEST(Scheduler, WaitsForPagesAndSlotsInsteadOfOverallocating) {
  Scheduler s(small_config());
  s.add(1, 40, 20);  // 60 tokens -> 15 pages
  s.add(2, 20, 4);   // 24 tokens -> 6 pages: does not fit beside the first (20 pages)
  StepPlan p = s.schedule();
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(s.free_pages(), 5);
  s.complete(p, {1});  // the first finishes: its pages come back and the second is admitted
  EXPECT_EQ(s.free_pages(), 20);
  p = s.schedule();
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.waiting(), 0);
  EXPECT_EQ(p.seqs[0].id, 2u);
}

TEST(Scheduler, RejectsWhatCanNeverFit) {
  Scheduler s(small_config());
  EXPECT_EQ(s.pages_needed(80, 10), 23);
  try {
    s.add(1, 80, 10);  // 90 tokens > 20 pages x 4
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("can never fit"), std::string::npos) << msg;
    EXPECT_NE(msg.find("23 pages"), std::string::npos) << msg;
    EXPECT_NE(msg.find("20 pages (80 tokens)"), std::string::npos) << msg;
  }
  EXPECT_EQ(s.waiting(), 0);  // nothing queued
  s.add(2, 70, 10);           // exactly 20 pages: fits
  EXPECT_EQ(s.waiting(), 1);
}

TEST(Scheduler, LifetimeIsCappedByMaxModelLen) {
  SchedulerConfig c = small_config();
  c.max_model_len = 40;
  Scheduler s(c);
  EXPECT_EQ(s.pages_needed(30, 1000), 10);  // min(1030, 40) tokens
  s.add(1, 30, 1000);
  s.schedule();
  EXPECT_EQ(s.free_pages(), 10);
}

TEST(Scheduler, MakeStepPlanFlattensByHand) {
  const StepPlan p = make_step_plan({{1, 2, 5, 1, false, true}, {2, 0, 0, 3, true, true}}, {{7, 8}, {1}});
  EXPECT_EQ(p.num_decodes, 1);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(p.slot_ids, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(p.context_lens, (std::vector<int32_t>{6, 3}));
  EXPECT_EQ(p.page_table, (std::vector<int32_t>{7, 8, 1, -1}));
}

TEST(Scheduler, NoLeakAfterRandomAddCancelFinish) {
  SchedulerConfig c = small_config();
  c.num_pages = 40;
  Scheduler s(c);
  std::mt19937 rng(5);
  std::set<RequestId> live;
  RequestId next = 1;
  for (int it = 0; it < 2000; ++it) {
    const int op = rng() % 4;
    if (op == 0 || live.empty()) {
      s.add(next, 1 + rng() % 30, 1 + rng() % 20);
      live.insert(next++);
    } else if (op == 1) {
      auto pick = std::next(live.begin(), rng() % live.size());
      EXPECT_TRUE(s.cancel(*pick));
      live.erase(pick);
    } else {
      StepPlan p = s.schedule();
      std::vector<RequestId> fin;
      for (const auto& q : p.seqs)
        if (q.samples && rng() % 3 == 0) fin.push_back(q.id);
      s.complete(p, fin);
      for (auto id : fin) live.erase(id);
      EXPECT_LE(p.num_tokens, c.max_batch_tokens);
      std::set<int> slots(p.slot_ids.begin(), p.slot_ids.end());
      EXPECT_EQ(slots.size(), p.slot_ids.size()) << "two sequences share a state slot";
    }
    ASSERT_EQ(s.running() + s.waiting(), static_cast<int>(live.size()));
  }
  for (auto id : live) s.cancel(id);
  EXPECT_EQ(s.slots_in_use(), 0);
  EXPECT_EQ(s.free_pages(), c.num_pages);
  EXPECT_FALSE(s.cancel(12345));
}

TEST(Scheduler, PoolsRejectDoubleRelease) {
  SlotPool slots(2);
  const int a = *slots.acquire();
  slots.release(a);
  EXPECT_THROW(slots.release(a), Error);
  PageAllocator pages(4, 16);
  auto p = pages.allocate(2);
  pages.release(p);
  EXPECT_THROW(pages.release(p), Error);
  EXPECT_THROW(pages.allocate(5), Error);
  EXPECT_EQ(pages.pages_for(17), 2);
}

}  // namespace
}  // namespace ds
