// The process layer of TEP/DEP groups without GPUs: ranks as threads (ThreadGroup, in-process exchange) and
// CpuEngine replicas standing in for the CUDA engine. The driver (rank 0) and worker_loop must give exactly what
// one engine gives, spread DEP requests, step idle ranks, shut down cleanly, and end every rank with a clear
// error (never a hang) when one fails. Plus the --tp/--ep/--mode parsing and the control messages.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "core/error.h"
#include "model/embedded.h"
#include "runtime/cpu_engine.h"
#include "runtime/parallel/driver_engine.h"
#include "runtime/parallel/group.h"
#include "runtime/parallel/rank_protocol.h"
#include "runtime/parallel/worker_loop.h"
#include "thread_group.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds::parallel {
namespace {

using test::ThreadGroup;
using test::ThreadGroupHub;

// ---- --tp / --ep / --mode (the checks name flags and values, not exact wording: branch tp-engine has its own
// group.cpp with the same rules, and either may be kept at the merge)

std::string parse_error(int tp, int ep, const std::string& mode) {
  try {
    parse_parallel_spec(tp, ep, mode);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelSpec, AcceptsTheRecipes) {
  const ParallelSpec one = parse_parallel_spec(1, 1, "tep");
  EXPECT_EQ(one.world(), 1);
  EXPECT_EQ(one.mode, Mode::kTep);
  const ParallelSpec tep8 = parse_parallel_spec(8, 8, "tep");
  EXPECT_EQ(tep8.world(), 8);
  EXPECT_EQ(tep8.ep, 8);
  const ParallelSpec tep_default = parse_parallel_spec(4, 1, "tep");  // --ep left at 1: experts split over tp
  EXPECT_EQ(tep_default.world(), 4);
  EXPECT_EQ(tep_default.ep, 4);
  const ParallelSpec dep16 = parse_parallel_spec(1, 16, "dep");
  EXPECT_EQ(dep16.world(), 16);
  EXPECT_EQ(dep16.mode, Mode::kDep);
  EXPECT_EQ(to_string(Mode::kTep), "tep");
  EXPECT_EQ(to_string(Mode::kDep), "dep");
}

TEST(ParallelSpec, RejectsSizesBelowOne) {
  EXPECT_NE(parse_error(0, 1, "tep").find("--tp 0"), std::string::npos) << parse_error(0, 1, "tep");
  EXPECT_NE(parse_error(-2, 1, "tep").find("--tp -2"), std::string::npos);
  EXPECT_NE(parse_error(2, 0, "tep").find("--ep 0"), std::string::npos) << parse_error(2, 0, "tep");
  EXPECT_NE(parse_error(1, -1, "dep").find("--ep -1"), std::string::npos);
}

TEST(ParallelSpec, RejectsEpThatDoesNotFitTp) {
  const std::string e = parse_error(4, 2, "tep");
  EXPECT_NE(e.find("--ep 2"), std::string::npos) << e;
  EXPECT_NE(e.find("--tp 4"), std::string::npos) << e;
  EXPECT_NE(e.find("tep"), std::string::npos) << e;
  EXPECT_NE(parse_error(2, 4, "tep"), "");
  EXPECT_NE(parse_error(3, 6, "tep"), "");
}

TEST(ParallelSpec, RejectsTpUnderDep) {
  const std::string e = parse_error(2, 2, "dep");
  EXPECT_NE(e.find("--tp 2"), std::string::npos) << e;
  EXPECT_NE(e.find("dep"), std::string::npos) << e;
}

TEST(ParallelSpec, RejectsUnknownMode) {
  for (const char* m : {"", "TEP", "tp", "dep ", "pp"}) {
    const std::string e = parse_error(2, 2, m);
    EXPECT_NE(e.find("--mode"), std::string::npos) << m << ": " << e;
    EXPECT_NE(e.find("tep"), std::string::npos) << e;
    EXPECT_NE(e.find("dep"), std::string::npos) << e;
  }
}

// ---- control messages

TEST(RankProtocol, RoundTrips) {
  Frame f;
  f.kind = FrameKind::kStep;
  AddCommand a;
  a.rank = 2;
  a.id = 7;
  a.request.prompt = {1, 2, 300000};
  a.request.sampling.max_tokens = 9;
  a.request.sampling.temperature = 0.7f;
  a.request.sampling.top_k = 40;
  a.request.sampling.top_p = 0.9f;
  a.request.sampling.seed = 0xFFFFFFFFFFFFFFFFull;
  a.request.sampling.stop_token_ids = {5, 6};
  a.request.sampling.ignore_eos = true;
  f.adds.push_back(a);
  AddCommand b;  // no seed, defaults
  b.id = 8;
  b.request.prompt = {4};
  f.adds.push_back(b);
  f.cancels.push_back({1, 3});
  f.message = "why";
  const Frame g = decode_frame(encode(f), 0);
  EXPECT_EQ(g.kind, FrameKind::kStep);
  ASSERT_EQ(g.adds.size(), 2u);
  EXPECT_EQ(g.adds[0].rank, 2);
  EXPECT_EQ(g.adds[0].id, 7u);
  EXPECT_EQ(g.adds[0].request.prompt, a.request.prompt);
  const SamplingParams& p = g.adds[0].request.sampling;
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.seed, a.request.sampling.seed);
  EXPECT_EQ(p.stop_token_ids, a.request.sampling.stop_token_ids);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_FALSE(g.adds[1].request.sampling.seed.has_value());
  EXPECT_EQ(g.adds[1].rank, -1);
  ASSERT_EQ(g.cancels.size(), 1u);
  EXPECT_EQ(g.cancels[0].rank, 1);
  EXPECT_EQ(g.cancels[0].id, 3u);
  EXPECT_EQ(g.message, "why");

  Report r;
  r.error = "";
  r.has_work = true;
  RequestOutput o;
  o.id = 12;
  o.new_tokens = {3, 4};
  o.finished = true;
  o.reason = FinishReason::kStop;
  o.prompt_tokens = 5;
  o.generated_tokens = 2;
  r.outputs.push_back(o);
  r.refused.push_back({13, "too long"});
  r.stats.running = 3;
  r.stats.generated_tokens = 1234567890123;
  const Report s = decode_report(encode(r), 1);
  EXPECT_TRUE(s.has_work);
  ASSERT_EQ(s.outputs.size(), 1u);
  EXPECT_EQ(s.outputs[0].id, 12u);
  EXPECT_EQ(s.outputs[0].new_tokens, o.new_tokens);
  EXPECT_TRUE(s.outputs[0].finished);
  EXPECT_EQ(s.outputs[0].reason, FinishReason::kStop);
  EXPECT_EQ(s.outputs[0].prompt_tokens, 5);
  EXPECT_EQ(s.outputs[0].generated_tokens, 2);
  ASSERT_EQ(s.refused.size(), 1u);
  EXPECT_EQ(s.refused[0].message, "too long");
  EXPECT_EQ(s.stats.running, 3);
  EXPECT_EQ(s.stats.generated_tokens, 1234567890123);
}

TEST(RankProtocol, MalformedMessagesAreErrorsNamingTheRank) {
  Frame f;
  f.adds.push_back({1, 2, {{1, 2, 3}, {}}});
  const std::string bytes = encode(f);
  auto msg = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (size_t cut : {size_t(0), size_t(1), size_t(5), bytes.size() - 1}) {
    const std::string e = msg([&] { decode_frame(bytes.substr(0, cut), 0); });
    EXPECT_NE(e.find("malformed control frame from rank 0"), std::string::npos) << cut << ": " << e;
  }
  EXPECT_NE(msg([&] { decode_frame(bytes + "x", 0); }).find("trailing"), std::string::npos);
  EXPECT_NE(msg([&] { decode_report(bytes, 3); }).find("rank report from rank 3"), std::string::npos);
  std::string other_version = bytes;
  other_version[1] = 99;
  EXPECT_NE(msg([&] { decode_frame(other_version, 0); }).find("version"), std::string::npos);
  std::string huge = bytes;  // the add count claims more than the message holds
  huge[3] = '\xff';
  EXPECT_NE(msg([&] { decode_frame(huge, 0); }).find("malformed"), std::string::npos);
}

// ---- driver + workers on CPU engines

// Counts steps, records outputs, and throws at a chosen step (a failing rank).
class ProbeEngine final : public Engine {
 public:
  explicit ProbeEngine(std::unique_ptr<Engine> inner, int throw_at_step = -1)
      : inner_(std::move(inner)), throw_at_(throw_at_step) {}
  RequestId add_request(Request r) override { return inner_->add_request(std::move(r)); }
  bool cancel(RequestId id) override { return inner_->cancel(id); }
  std::vector<RequestOutput> step() override {
    if (steps++ == throw_at_) throw Error("injected engine failure (cuda error 700)");
    auto outs = inner_->step();
    trace.push_back(outs);
    return outs;
  }
  bool has_work() const override { return inner_->has_work(); }
  EngineStats stats() const override { return inner_->stats(); }
  const ModelConfig& config() const override { return inner_->config(); }

  std::atomic<int> steps{0};
  std::vector<std::vector<RequestOutput>> trace;

 private:
  std::unique_ptr<Engine> inner_;
  int throw_at_;
};

class ParallelServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EmbeddedModel m = embedded_model();
    model_ = new std::shared_ptr<const CpuModel>(std::make_shared<CpuModel>(m.config, m.weights));
  }
  static void TearDownTestSuite() { delete model_; }
  static std::unique_ptr<CpuEngine> make_engine(int max_seqs = 16) {
    CpuEngineOptions o;
    o.max_seqs = max_seqs;
    o.max_prefill_tokens = 4096;
    o.eos_token_ids = ByteTokenizer().stop_token_ids();
    o.seed = 42;
    return std::make_unique<CpuEngine>(*model_, o);
  }
  static std::shared_ptr<const CpuModel>* model_;
};
std::shared_ptr<const CpuModel>* ParallelServe::model_ = nullptr;

// A group of ranks as threads: rank 0 is run by the test thread, workers by threads running worker_loop.
struct Cluster {
  Cluster(int world, Mode mode, std::function<std::unique_ptr<ProbeEngine>(int)> make, double timeout_s = 20)
      : hub(std::make_shared<ThreadGroupHub>(world, mode, timeout_s)), errors(world), stats(world) {
    for (int r = 0; r < world; ++r) {
      groups.push_back(std::make_unique<ThreadGroup>(hub, r));
      engines.push_back(make(r));
    }
    for (int r = 1; r < world; ++r)
      threads.emplace_back([this, r] {
        try {
          stats[r] = worker_loop(*engines[r], *groups[r]);
        } catch (const std::exception& e) {
          errors[r] = e.what();
          hub->abort("rank " + std::to_string(r) + " ended: " + e.what());  // the launcher stops the others
        }
      });
  }
  ~Cluster() { join(); }
  void join() {
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
  std::shared_ptr<ThreadGroupHub> hub;
  std::vector<std::unique_ptr<ThreadGroup>> groups;
  std::vector<std::unique_ptr<ProbeEngine>> engines;
  std::vector<std::thread> threads;
  std::vector<std::string> errors;
  std::vector<WorkerStats> stats;
};

DriverOptions seeded(uint64_t seed) {
  DriverOptions o;
  o.engine_seed = seed;
  return o;
}

Request req(const std::string& text, int max_tokens, float temperature = 0, std::optional<uint64_t> seed = {}) {
  Request r;
  r.prompt = ByteTokenizer().encode(text);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
  r.sampling.top_k = temperature > 0 ? 50 : 0;
  r.sampling.seed = seed;
  r.sampling.ignore_eos = true;  // random weights: runs long enough to mean something
  return r;
}

// What happens to the requests, step by step: adds and cancels (by add index) before step `at`.
struct Event {
  int at;
  std::vector<Request> adds;
  std::vector<int> cancels;
};

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int finishes = 0;
  std::string error;
};

struct ScriptRun {
  std::vector<Outcome> outcomes;                    // by add index
  std::vector<std::vector<RequestOutput>> trace;    // every step's outputs
  int steps = 0;
};

ScriptRun run_script(Engine& e, const std::vector<Event>& events) {
  ScriptRun run;
  std::vector<RequestId> ids;
  std::map<RequestId, int> index;
  size_t next = 0;
  for (int step = 0; step < 100000; ++step) {
    for (; next < events.size() && events[next].at == step; ++next) {
      for (const Request& r : events[next].adds) {
        const RequestId id = e.add_request(r);
        EXPECT_EQ(index.count(id), 0u) << "id " << id << " given twice";
        index[id] = static_cast<int>(ids.size());
        ids.push_back(id);
        run.outcomes.emplace_back();
      }
      for (int c : events[next].cancels) e.cancel(ids.at(c));
    }
    if (!e.has_work()) {
      if (next == events.size()) break;
      continue;
    }
    auto outs = e.step();
    ++run.steps;
    for (const RequestOutput& o : outs) {
      Outcome& x = run.outcomes.at(index.at(o.id));
      EXPECT_EQ(x.finishes, 0) << "output after the finish of request " << o.id;
      x.tokens.insert(x.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) ++x.finishes, x.reason = o.reason, x.error = o.error;
    }
    run.trace.push_back(std::move(outs));
  }
  return run;
}

// A batch with greedy, seeded and unseeded sampled requests, later arrivals, and cancellations mid-stream.
std::vector<Event> mixed_script() {
  return {
      {0,
       {req("The quick brown fox", 12), req("deltaserve", 9, 0.8f, 7), req("KDA + MLA + MoE", 14, 0.9f),
        req("a", 5), req("0123456789abcdef", 11, 0.7f, 123)},
       {}},
      {2, {req("later arrival", 8, 0.9f), req("<|im_user|>hi", 10)}, {}},
      {4, {}, {2}},     // cancels a running sampled request
      {5, {req("x", 6, 0.5f)}, {5}},
      {6, {}, {7, 0}},  // request 7 was added at step 5: cancelled right after its prefill
  };
}

TEST_F(ParallelServe, TepDriverAndWorkersEqualOneEngine) {
  ProbeEngine single(make_engine());
  const ScriptRun ref = run_script(single, mixed_script());
  ASSERT_EQ(ref.outcomes.size(), 8u);
  EXPECT_EQ(ref.outcomes[2].reason, FinishReason::kCancelled);
  EXPECT_FALSE(ref.outcomes[2].tokens.empty());  // cancelled mid-stream, not before
  for (int world : {2, 4}) {
    Cluster c(world, Mode::kTep, [&](int) { return std::make_unique<ProbeEngine>(make_engine()); });
    ScriptRun got;
    {
      TepDriverEngine driver(*c.engines[0], *c.groups[0], seeded(42));
      got = run_script(driver, mixed_script());
      // A request rank 0's engine refuses is refused at once and never reaches the workers.
      EXPECT_THROW(driver.add_request(Request{}), Error);
      EXPECT_FALSE(driver.has_work());
      driver.shutdown();
      driver.shutdown();  // idempotent
    }
    c.join();
    ASSERT_EQ(got.outcomes.size(), ref.outcomes.size());
    for (size_t i = 0; i < ref.outcomes.size(); ++i) {
      EXPECT_EQ(got.outcomes[i].tokens, ref.outcomes[i].tokens) << "world " << world << " request " << i;
      EXPECT_EQ(got.outcomes[i].reason, ref.outcomes[i].reason) << "world " << world << " request " << i;
      EXPECT_EQ(got.outcomes[i].finishes, 1);
    }
    EXPECT_EQ(got.steps, ref.steps);
    // Every replica ran the same requests step for step (same ids, same tokens).
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(c.errors[r], "") << "rank " << r;
      EXPECT_EQ(c.stats[r].steps, ref.steps);
      EXPECT_EQ(c.stats[r].requests, 8);
      ASSERT_EQ(c.engines[r]->trace.size(), c.engines[0]->trace.size());
      for (size_t s = 0; s < c.engines[0]->trace.size(); ++s) {
        const auto& a = c.engines[0]->trace[s];
        const auto& b = c.engines[r]->trace[s];
        ASSERT_EQ(a.size(), b.size()) << "rank " << r << " step " << s;
        for (size_t k = 0; k < a.size(); ++k) {
          EXPECT_EQ(a[k].id, b[k].id);
          EXPECT_EQ(a[k].new_tokens, b[k].new_tokens) << "rank " << r << " step " << s;
          EXPECT_EQ(a[k].finished, b[k].finished);
        }
      }
      EXPECT_FALSE(c.engines[r]->has_work());
    }
  }
}

TEST_F(ParallelServe, DepSpreadsRequestsAndEachEqualsItsSingleEngineRun) {
  ProbeEngine single(make_engine());
  const ScriptRun ref = run_script(single, mixed_script());
  for (int world : {2, 3}) {
    Cluster c(world, Mode::kDep, [&](int) { return std::make_unique<ProbeEngine>(make_engine()); });
    ScriptRun got;
    std::vector<int> peak_load(world, 0);
    {
      DepDriverEngine driver(*c.engines[0], *c.groups[0], seeded(42));
      got = run_script(driver, mixed_script());
      EXPECT_EQ(driver.stats().running, 0);
      EXPECT_EQ(driver.stats().max_seqs, 16 * world);  // summed over the ranks
      for (int l : driver.load()) EXPECT_EQ(l, 0);
      driver.shutdown();
    }
    c.join();
    ASSERT_EQ(got.outcomes.size(), ref.outcomes.size());
    for (size_t i = 0; i < ref.outcomes.size(); ++i) {
      const Outcome& g = got.outcomes[i];
      const Outcome& r = ref.outcomes[i];
      EXPECT_EQ(g.finishes, 1) << "world " << world << " request " << i;
      EXPECT_EQ(g.reason, r.reason) << "world " << world << " request " << i;
      EXPECT_EQ(g.tokens, r.tokens) << "world " << world << " request " << i;
    }
    // Spread: every rank ran some of the 8 requests; every rank stepped at every step (idle or not).
    int64_t total = 0;
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(c.errors[r], "") << "rank " << r;
      EXPECT_GT(c.stats[r].requests, 0) << "rank " << r;
      EXPECT_EQ(c.stats[r].steps, c.engines[0]->steps.load()) << "rank " << r;
      total += c.stats[r].requests;
    }
    EXPECT_LT(total, 8);  // rank 0 ran the rest
    EXPECT_EQ(c.engines[0]->steps.load(), got.steps);
  }
}

TEST_F(ParallelServe, DepIdleRanksStepAndIdleGroupWaitsWithoutSteps) {
  Cluster c(3, Mode::kDep, [&](int) { return std::make_unique<ProbeEngine>(make_engine()); });
  {
    DepDriverEngine driver(*c.engines[0], *c.groups[0], seeded(42));
    driver.add_request(req("only one", 6));  // rank 0 (least loaded, lowest rank); ranks 1 and 2 have nothing
    int steps = 0;
    while (driver.has_work()) driver.step(), ++steps;
    EXPECT_EQ(steps, c.engines[0]->steps.load());
    // Idle: heartbeats are exchanges without steps; has_work stays false.
    const int64_t rounds = c.hub->rounds();
    for (int i = 0; i < 3; ++i) driver.heartbeat();
    EXPECT_EQ(c.hub->rounds(), rounds + 3);
    EXPECT_EQ(c.engines[0]->steps.load(), steps);
    // New work after idling (every load is 0 again: rank 0 takes it).
    const RequestId id = driver.add_request(req("second", 4));
    EXPECT_EQ(id, 2u);
    while (driver.has_work()) driver.step(), ++steps;
    driver.shutdown();
    c.join();
    for (int r = 1; r < 3; ++r) {
      EXPECT_EQ(c.errors[r], "");
      EXPECT_EQ(c.stats[r].requests, 0);
      EXPECT_EQ(c.stats[r].steps, steps) << "idle rank " << r << " must step with the others";
    }
  }
}

TEST_F(ParallelServe, DepLeastLoadedAssignment) {
  Cluster c(3, Mode::kDep, [&](int) { return std::make_unique<ProbeEngine>(make_engine()); });
  DepDriverEngine driver(*c.engines[0], *c.groups[0], {});
  for (int i = 0; i < 7; ++i) driver.add_request(req("spread " + std::to_string(i), 3 + i));
  EXPECT_EQ(driver.load(), (std::vector<int>{3, 2, 2}));
  EXPECT_TRUE(driver.cancel(2));   // on rank 1
  EXPECT_FALSE(driver.cancel(99));  // unknown
  while (driver.has_work()) driver.step();
  EXPECT_EQ(driver.load(), (std::vector<int>{0, 0, 0}));
  EXPECT_FALSE(driver.cancel(2));  // finished (cancelled)
  driver.shutdown();
}

void expect_group_failure(Mode mode, int world, int failing_rank) {
  SCOPED_TRACE(to_string(mode) + " failing rank " + std::to_string(failing_rank));
  EmbeddedModel m = embedded_model();
  auto model = std::make_shared<CpuModel>(m.config, m.weights);
  auto make = [&](int r) {
    CpuEngineOptions o;
    o.max_seqs = 8;
    o.max_prefill_tokens = 4096;
    return std::make_unique<ProbeEngine>(std::make_unique<CpuEngine>(model, o), r == failing_rank ? 3 : -1);
  };
  const auto t0 = std::chrono::steady_clock::now();
  Cluster c(world, mode, make, /*timeout_s=*/10);
  std::string fatal;
  std::string thrown;
  {
    DriverOptions opts;
    opts.on_fatal = [&](const std::string& e) { fatal = e; };
    auto driver = make_driver_engine(*c.engines[0], *c.groups[0], opts);
    for (int i = 0; i < 4; ++i) driver->add_request(req("fail " + std::to_string(i), 20));
    try {
      for (int s = 0; s < 100 && driver->has_work(); ++s) driver->step();
    } catch (const Error& e) {
      thrown = e.what();
    }
    EXPECT_TRUE(driver->failed());
    EXPECT_THROW(driver->step(), Error);  // unusable from now on
    EXPECT_THROW(driver->add_request(req("more", 2)), Error);
    EXPECT_FALSE(driver->has_work());   // nothing will progress: no caller may spin on it
    EXPECT_FALSE(driver->cancel(1));    // tearing down does not throw
  }
  c.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 8.0) << "a failure must end every rank promptly, not by a timeout";
  const std::string rank_named = "rank " + std::to_string(failing_rank) + " failed";
  EXPECT_NE(thrown.find(rank_named), std::string::npos) << thrown;
  EXPECT_NE(thrown.find("injected engine failure"), std::string::npos) << thrown;
  EXPECT_EQ(fatal, thrown);
  for (int r = 1; r < world; ++r) {
    EXPECT_NE(c.errors[r].find(failing_rank == 0 ? "rank 0 failed" : rank_named), std::string::npos)
        << "rank " << r << ": " << c.errors[r];
  }
}

TEST_F(ParallelServe, WorkerFailureEndsEveryRankWithItsError) {
  expect_group_failure(Mode::kTep, 2, 1);
  expect_group_failure(Mode::kTep, 4, 2);
  expect_group_failure(Mode::kDep, 2, 1);
  expect_group_failure(Mode::kDep, 3, 2);
}

TEST_F(ParallelServe, DriverFailureEndsTheWorkers) {
  expect_group_failure(Mode::kTep, 3, 0);
  expect_group_failure(Mode::kDep, 3, 0);
}

TEST_F(ParallelServe, DriverDestroyedWithoutShutdownAbortsTheWorkers) {
  for (Mode mode : {Mode::kTep, Mode::kDep}) {
    Cluster c(2, mode, [&](int) { return std::make_unique<ProbeEngine>(make_engine()); }, 10);
    {
      auto driver = make_driver_engine(*c.engines[0], *c.groups[0], {});
      driver->add_request(req("abandoned", 8));
      driver->step();
    }  // e.g. `generate` threw: the workers must not wait for the group timeout
    c.join();
    EXPECT_NE(c.errors[1].find("rank 0 failed"), std::string::npos) << c.errors[1];
    EXPECT_NE(c.errors[1].find("without shutting the group down"), std::string::npos) << c.errors[1];
  }
}

TEST_F(ParallelServe, MissingRankIsABoundedError) {
  // Rank 1 never runs worker_loop (a rank process that died before joining): rank 0's exchange times out.
  auto hub = std::make_shared<ThreadGroupHub>(2, Mode::kTep, /*timeout_s=*/0.5);
  ThreadGroup g0(hub, 0);
  auto e = make_engine();
  TepDriverEngine driver(*e, g0, {});
  driver.add_request(req("alone", 3));
  try {
    driver.step();
    ADD_FAILURE() << "step without the workers returned";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("waiting for rank(s) 1"), std::string::npos) << err.what();
  }
  EXPECT_TRUE(driver.failed());
}

TEST_F(ParallelServe, DriverChecksItsGroup) {
  auto hub = std::make_shared<ThreadGroupHub>(2, Mode::kTep);
  ThreadGroup g1(hub, 1);
  auto e = make_engine();
  EXPECT_THROW((TepDriverEngine{*e, g1, {}}), Error);  // not rank 0
  ThreadGroup g0(hub, 0);
  EXPECT_THROW((DepDriverEngine{*e, g0, {}}), Error);  // TEP group
  EXPECT_THROW(worker_loop(*e, g0), Error);          // rank 0 is the driver
}

}  // namespace
}  // namespace ds::parallel
