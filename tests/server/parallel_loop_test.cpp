// The server's engine thread on a DEP group's driver (ranks as threads, CpuEngine replicas): streams receive
// exactly a single engine's tokens, a worker's refusal reaches its stream as a client error, and while idle the
// engine thread sends heartbeats instead of steps.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "core/error.h"
#include "model/embedded.h"
#include "runtime/cpu_engine.h"
#include "runtime/parallel/driver_engine.h"
#include "runtime/parallel/worker_loop.h"
#include "server/engine_loop.h"
#include "thread_group.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds::server {
namespace {

using namespace std::chrono_literals;

// Refuses prompts that start with token 7 (a rank whose engine is smaller than rank 0's, say).
class PickyEngine final : public Engine {
 public:
  explicit PickyEngine(std::unique_ptr<Engine> e) : e_(std::move(e)) {}
  RequestId add_request(Request r) override {
    if (!r.prompt.empty() && r.prompt[0] == 7) throw Error("prompt needs more pages than this rank has");
    return e_->add_request(std::move(r));
  }
  bool cancel(RequestId id) override { return e_->cancel(id); }
  std::vector<RequestOutput> step() override {
    ++steps;
    return e_->step();
  }
  bool has_work() const override { return e_->has_work(); }
  EngineStats stats() const override { return e_->stats(); }
  const ModelConfig& config() const override { return e_->config(); }
  int steps = 0;

 private:
  std::unique_ptr<Engine> e_;
};

struct Collected {
  std::vector<int32_t> tokens;
  RequestStream::Update last;
};

Collected collect(const std::shared_ptr<RequestStream>& s) {
  Collected c;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    RequestStream::Update u = s->wait(100ms);
    c.tokens.insert(c.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) {
      c.last = u;
      return c;
    }
  }
  ADD_FAILURE() << "stream did not finish";
  return c;
}

TEST(ParallelEngineLoop, DepStreamsRefusalsAndIdleHeartbeats) {
  EmbeddedModel m = embedded_model();
  auto model = std::make_shared<CpuModel>(m.config, m.weights);
  auto make = [&] {
    CpuEngineOptions o;
    o.max_seqs = 8;
    o.max_prefill_tokens = 4096;
    o.seed = 5;
    return std::make_unique<PickyEngine>(std::make_unique<CpuEngine>(model, o));
  };
  std::vector<Request> reqs;
  for (const char* text : {"alpha", "beta gamma", "delta", "epsilon zeta eta"}) {
    Request r;
    r.prompt = ByteTokenizer().encode(text);
    r.sampling.max_tokens = 6;
    r.sampling.temperature = 0.8f;  // unseeded: the group id must give the single engine's seed
    r.sampling.ignore_eos = true;
    reqs.push_back(r);
  }
  // Reference: one engine, the same requests in the same order.
  std::map<size_t, std::vector<int32_t>> ref;
  {
    auto single = make();
    for (const auto& r : reqs) single->add_request(r);
    while (single->has_work())
      for (const auto& o : single->step()) ref[o.id - 1].insert(ref[o.id - 1].end(), o.new_tokens.begin(), o.new_tokens.end());
  }

  auto hub = std::make_shared<test::ThreadGroupHub>(2, parallel::Mode::kDep);
  test::ThreadGroup g0(hub, 0), g1(hub, 1);
  auto e0 = make(), e1 = make();
  std::string worker_error;
  std::thread worker([&] {
    try {
      parallel::worker_loop(*e1, g1);
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  parallel::DriverOptions dopt;
  dopt.engine_seed = 5;
  parallel::DepDriverEngine driver(*e0, g0, dopt);
  {
    EngineLoopOptions lo;
    lo.idle_tick = [&] { driver.heartbeat(); };
    lo.idle_period = 20ms;
    EngineLoop loop(driver, lo);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : reqs) streams.push_back(loop.submit(r));
    for (size_t i = 0; i < streams.size(); ++i) {
      const Collected c = collect(streams[i]);
      EXPECT_TRUE(c.last.error.empty()) << c.last.error;
      EXPECT_EQ(c.tokens, ref[i]) << "request " << i;
    }
    EXPECT_GT(e1->steps, 0);
    EXPECT_EQ(e1->steps, e0->steps);
    // Both ranks are idle now: the next request goes to rank 0, the one after to rank 1, which refuses it.
    ASSERT_TRUE(loop.wait_idle(10s));
    Request ok = reqs[0], refused = reqs[0];
    refused.prompt[0] = 7;
    auto s_ok = loop.submit(ok);
    auto s_refused = loop.submit(refused);
    const Collected c_ok = collect(s_ok);
    const Collected c_refused = collect(s_refused);
    EXPECT_TRUE(c_ok.last.error.empty());
    EXPECT_EQ(c_ok.tokens.size(), 6u);
    EXPECT_NE(c_refused.last.error.find("more pages than this rank has"), std::string::npos) << c_refused.last.error;
    EXPECT_TRUE(c_refused.last.error_is_client);
    // Idle: heartbeats, no steps.
    ASSERT_TRUE(loop.wait_idle(10s));
    std::this_thread::sleep_for(50ms);
    const int steps = e0->steps;
    const int64_t rounds = hub->rounds();
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(e0->steps, steps);
    EXPECT_EQ(e1->steps, steps);
    EXPECT_GE(hub->rounds() - rounds, 3) << "the idle engine thread must send heartbeats";
    EXPECT_LE(hub->rounds() - rounds, 30) << "heartbeats every 20 ms, not a spin";
    loop.stop();
  }
  driver.shutdown();
  worker.join();
  EXPECT_EQ(worker_error, "");
}

}  // namespace
}  // namespace ds::server
