// CpuEngine on the embedded model: equals the scheduler-free reference loop, continuous batching over more requests
// than slots, chunked prefill, finish reasons, cancel of waiting/running requests, no slot leaks, input errors.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "core/error.h"
#include "model/embedded.h"
#include "runtime/cpu_engine.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds {
namespace {

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int reports = 0;  // finished entries seen (must be exactly 1)
};

// Steps until idle; collects per-request tokens and checks every request finishes exactly once.
std::map<RequestId, Result> drain(Engine& e, int max_steps = 100000) {
  std::map<RequestId, Result> r;
  for (int i = 0; i < max_steps && e.has_work(); ++i)
    for (const auto& o : e.step()) {
      auto& x = r[o.id];
      EXPECT_EQ(x.reports, 0) << "output after finish, request " << o.id;
      x.tokens.insert(x.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      EXPECT_EQ(o.generated_tokens, static_cast<int>(x.tokens.size()));
      if (o.finished) {
        x.reason = o.reason;
        ++x.reports;
      }
    }
  EXPECT_FALSE(e.has_work());
  return r;
}

class CpuEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EmbeddedModel m = embedded_model();
    model_ = new std::shared_ptr<const CpuModel>(std::make_shared<CpuModel>(m.config, m.weights));
  }
  static void TearDownTestSuite() { delete model_; }
  static const CpuModel& model() { return **model_; }
  static CpuEngine make(int max_seqs, int prefill_budget = 4096) {
    CpuEngineOptions o;
    o.max_seqs = max_seqs;
    o.max_prefill_tokens = prefill_budget;
    o.eos_token_ids = ByteTokenizer().stop_token_ids();
    return CpuEngine(*model_, o);
  }
  static std::shared_ptr<const CpuModel>* model_;
};
std::shared_ptr<const CpuModel>* CpuEngineTest::model_ = nullptr;

std::vector<int32_t> prompt(const std::string& text) { return ByteTokenizer().encode(text); }

SamplingParams greedy(int max_tokens, bool ignore_eos = false) {
  SamplingParams p;
  p.max_tokens = max_tokens, p.ignore_eos = ignore_eos, p.seed = 0;
  return p;
}

SamplingParams sampled(uint64_t seed, int max_tokens) {
  SamplingParams p;
  p.temperature = 0.9f, p.top_p = 0.95f, p.top_k = 50, p.seed = seed, p.max_tokens = max_tokens;
  return p;
}

TEST_F(CpuEngineTest, SingleRequestEqualsReferenceAndRepeats) {
  const auto eos = ByteTokenizer().stop_token_ids();
  for (SamplingParams p : {greedy(24), sampled(11, 24)}) {
    p.ignore_eos = true;  // random weights: make the run long enough to mean something
    const auto ref = generate_reference(model(), prompt("Hello, deltaserve"), p, eos, *p.seed);
    for (int run = 0; run < 2; ++run) {
      CpuEngine e = make(2);
      const RequestId id = e.add_request({prompt("Hello, deltaserve"), p});
      auto r = drain(e);
      EXPECT_EQ(r[id].tokens, ref.tokens) << "run " << run << " temperature " << p.temperature;
      EXPECT_EQ(r[id].reason, FinishReason::kLength);
      EXPECT_EQ(r[id].tokens.size(), 24u);
    }
  }
}

TEST_F(CpuEngineTest, ContinuousBatchingMatchesReferencePerRequest) {
  // 7 requests through 3 slots with a prefill budget that splits prompts across steps.
  const auto eos = ByteTokenizer().stop_token_ids();
  const std::vector<std::string> prompts = {"a", "The quick brown fox jumps over the lazy dog", "<|im_user|>hi",
                                            "0123456789abcdef0123456789", "x", "deltaserve", "KDA + MLA + MoE"};
  CpuEngine e = make(3, /*prefill_budget=*/16);
  std::map<RequestId, size_t> which;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p = i % 2 ? sampled(100 + i, 5 + static_cast<int>(i)) : greedy(9);
    p.ignore_eos = true;
    which[e.add_request({prompt(prompts[i]), p})] = i;
  }
  const EngineStats s0 = e.stats();
  EXPECT_EQ(s0.waiting, 7);
  int max_running = 0;
  std::map<RequestId, Result> r;
  while (e.has_work()) {
    for (const auto& o : e.step()) {
      r[o.id].tokens.insert(r[o.id].tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) r[o.id].reason = o.reason, ++r[o.id].reports;
    }
    max_running = std::max(max_running, e.stats().running);
    EXPECT_LE(e.stats().slots_in_use, 3);
  }
  EXPECT_EQ(max_running, 3);
  for (const auto& [id, i] : which) {
    SamplingParams p = i % 2 ? sampled(100 + i, 5 + static_cast<int>(i)) : greedy(9);
    p.ignore_eos = true;
    // Chunked prefill changes fp32 rounding only (~1e-7 of the logits): the tokens are the same.
    const auto ref = generate_reference(model(), prompt(prompts[i]), p, eos, p.seed.value_or(0));
    EXPECT_EQ(r[id].tokens, ref.tokens) << "prompt " << i;
    EXPECT_EQ(r[id].reports, 1);
  }
  const EngineStats s = e.stats();
  EXPECT_EQ(s.slots_in_use, 0);
  EXPECT_EQ(s.free_slots, 3);
}

TEST_F(CpuEngineTest, FinishReasons) {
  // The greedy first token of this prompt, used as a stop id.
  const auto ref = generate_reference(model(), prompt("stop here"), greedy(3), {}, 0);
  CpuEngine e = make(2);
  SamplingParams stop = greedy(10);
  stop.stop_token_ids = {ref.tokens[0]};
  stop.ignore_eos = true;  // stop ids still apply
  const RequestId a = e.add_request({prompt("stop here"), stop});
  const RequestId b = e.add_request({prompt("stop here"), greedy(3, true)});
  auto r = drain(e);
  EXPECT_EQ(r[a].reason, FinishReason::kStop);
  EXPECT_EQ(r[a].tokens, std::vector<int32_t>{ref.tokens[0]});  // the stop token is reported
  EXPECT_EQ(r[b].reason, FinishReason::kLength);
  EXPECT_EQ(r[b].tokens.size(), 3u);

  // The engine's eos list: stopping on the first token unless ignore_eos.
  CpuEngineOptions o;
  o.eos_token_ids = {ref.tokens[0]};
  CpuEngine e2(*model_, o);
  const RequestId c = e2.add_request({prompt("stop here"), greedy(5)});
  const RequestId d = e2.add_request({prompt("stop here"), greedy(5, true)});
  auto r2 = drain(e2);
  EXPECT_EQ(r2[c].reason, FinishReason::kStop);
  EXPECT_EQ(r2[c].tokens.size(), 1u);
  EXPECT_EQ(r2[d].tokens.size(), 5u);

  // max_model_len: prompt 9 tokens + 3 generated = 12.
  CpuEngineOptions lim;
  lim.max_model_len = 12;
  CpuEngine e3(*model_, lim);
  const RequestId f = e3.add_request({prompt("stop here"), greedy(100, true)});
  auto r3 = drain(e3);
  EXPECT_EQ(r3[f].reason, FinishReason::kLength);
  EXPECT_EQ(r3[f].tokens.size(), 3u);
  EXPECT_THROW(e3.add_request({std::vector<int32_t>(12, 'a'), {}}), Error);  // no room to generate
}

TEST_F(CpuEngineTest, CancelWaitingAndRunning) {
  CpuEngine e = make(1);
  const SamplingParams p = greedy(50, true);
  const RequestId running = e.add_request({prompt("first"), p});
  const RequestId waiting = e.add_request({prompt("second"), p});
  e.step();  // admits `running` (one slot), prefills it
  EXPECT_EQ(e.stats().running, 1);
  EXPECT_EQ(e.stats().waiting, 1);

  EXPECT_TRUE(e.cancel(waiting));
  EXPECT_EQ(e.stats().waiting, 0);
  EXPECT_TRUE(e.cancel(running));
  EXPECT_EQ(e.stats().slots_in_use, 0);  // freed at once, before the next step
  EXPECT_EQ(e.stats().running, 0);
  EXPECT_FALSE(e.cancel(running));  // already cancelled
  EXPECT_FALSE(e.cancel(12345));    // unknown
  EXPECT_TRUE(e.has_work());        // the cancellations are still to be reported

  auto outs = e.step();
  ASSERT_EQ(outs.size(), 2u);
  for (const auto& o : outs) {
    EXPECT_TRUE(o.finished);
    EXPECT_EQ(o.reason, FinishReason::kCancelled);
    EXPECT_TRUE(o.new_tokens.empty());
  }
  EXPECT_FALSE(e.has_work());
  EXPECT_TRUE(e.step().empty());
}

TEST_F(CpuEngineTest, NoSlotLeakUnderRandomAddCancelFinish) {
  CpuEngine e = make(4, /*prefill_budget=*/8);
  std::mt19937 rng(5);
  std::vector<RequestId> live;
  std::map<RequestId, int> reports;
  for (int it = 0; it < 300; ++it) {
    const int op = rng() % 4;
    if (op == 0 || live.empty()) {
      const SamplingParams p = greedy(1 + static_cast<int>(rng() % 6), rng() % 2 == 0);
      live.push_back(e.add_request({std::vector<int32_t>(1 + rng() % 20, 'a' + rng() % 26), p}));
    } else if (op == 1) {
      const RequestId id = live[rng() % live.size()];
      e.cancel(id);  // may already be finished: then false, fine
    } else {
      for (const auto& o : e.step())
        if (o.finished) ++reports[o.id];
    }
    const EngineStats s = e.stats();
    EXPECT_EQ(s.slots_in_use + s.free_slots, 4);
    EXPECT_EQ(s.slots_in_use, s.running);
  }
  for (const auto& [id, r] : drain(e)) reports[id] += r.reports;
  for (RequestId id : live) EXPECT_EQ(reports[id], 1) << "request " << id;
  const EngineStats s = e.stats();
  EXPECT_EQ(s.slots_in_use, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.free_slots, 4);
}

TEST_F(CpuEngineTest, RejectsBadRequestsWithoutQueueing) {
  CpuEngine e = make(2);
  EXPECT_THROW(e.add_request({{}, {}}), Error);
  EXPECT_THROW(e.add_request({{1, 320}, {}}), Error);
  EXPECT_THROW(e.add_request({{-5}, {}}), Error);
  SamplingParams cold = greedy(4);
  cold.temperature = -1;
  EXPECT_THROW(e.add_request({{1}, cold}), Error);
  SamplingParams bad = greedy(0);
  EXPECT_THROW(e.add_request({{1}, bad}), Error);
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.stats().waiting, 0);
}

TEST(DeriveSeed, DistinctPerRequest) {
  EXPECT_NE(derive_seed(0, 1), derive_seed(0, 2));
  EXPECT_NE(derive_seed(0, 1), derive_seed(1, 1));
  EXPECT_EQ(derive_seed(7, 3), derive_seed(7, 3));
}

}  // namespace
}  // namespace ds
