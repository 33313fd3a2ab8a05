// The server under concurrency and lifecycle events: 64 streams at once, clients hanging up mid-stream,
// graceful shutdown (in-process and by SIGTERM to the real binary).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server_harness.h"

namespace ds::server::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(ServerLoad, SixtyFourConcurrentStreamsAllComplete) {
  constexpr int kStreams = 64, kTokens = 16;
  ServerOptions o = test_options();
  o.max_concurrent = kStreams;
  o.max_queue = 0;
  Harness h(o);
  std::vector<Harness::Sse> results(kStreams);
  std::vector<double> first_token(kStreams, -1), done_at(kStreams, -1);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      Json body = {{"messages", {{{"role", "user"}, {"content", "Request number " + std::to_string(i)}}}},
                   {"max_tokens", kTokens},
                   {"temperature", 0.8},
                   {"seed", i},
                   {"ignore_eos", true},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      ready++;
      while (!go.load()) std::this_thread::yield();
      results[i] = h.stream("/v1/chat/completions", body.dump(), [&, i](const Json& e) {
        if (first_token[i] < 0 && !e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
            !e["choices"][0]["delta"]["content"].get<std::string>().empty())
          first_token[i] = seconds_since(t0);
        return true;
      });
      done_at[i] = seconds_since(t0);
    });
  }
  while (ready.load() < kStreams) std::this_thread::yield();
  go = true;
  for (auto& t : threads) t.join();
  const double total = seconds_since(t0);

  int complete = 0;
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    EXPECT_EQ(r.status, 200) << i;
    EXPECT_TRUE(r.done) << i << ": " << r.raw.substr(0, 300);
    if (!r.done || r.events.empty()) continue;
    EXPECT_EQ(r.events.back()["usage"]["completion_tokens"], kTokens) << i;
    EXPECT_EQ(r.last_choice()["finish_reason"], "length") << i;
    ++complete;
  }
  EXPECT_EQ(complete, kStreams);
  // Not serialised: streams overlap. With one request at a time, no request would see its first token before
  // another finished; here most see it before the first one finishes.
  const double first_done = *std::min_element(done_at.begin(), done_at.end());
  int overlapped = 0;
  for (int i = 0; i < kStreams; ++i) overlapped += first_token[i] >= 0 && first_token[i] < first_done;
  std::printf(
      "[load] %d streams x %d tokens: %.2f s total, %d/%d had their first token before the first stream "
      "ended\n",
      kStreams, kTokens, total, overlapped, kStreams);
  EXPECT_GE(overlapped, kStreams / 2);
  EXPECT_LT(total, 60.0);
  EXPECT_EQ(h.metric("deltaserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"),
            kStreams);
  EXPECT_EQ(h.metric("deltaserve_generation_tokens_total"), kStreams * kTokens);
  EXPECT_EQ(h.server().engine_stats().slots_in_use, 0);
}

// Waits until the engine reports no slot in use (the engine thread publishes stats after each iteration).
bool slots_drain(Harness& h, double timeout_s) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < timeout_s) {
    if (h.metric("deltaserve_state_slots_in_use") == 0 && h.metric("deltaserve_requests_running") == 0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(ServerLoad, DisconnectMidStreamFreesTheSlot) {
  Harness h;
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    SCOPED_TRACE(path);
    Json body = {{"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}};
    if (std::string(path) == "/v1/completions")
      body["prompt"] = "A long story";
    else
      body["messages"] = {{{"role", "user"}, {"content", "A long story"}}};
    int seen = 0;
    auto s = h.stream(path, body.dump(), [&](const Json&) { return ++seen < 3; });  // hang up at event 3
    EXPECT_EQ(s.status, 200);
    EXPECT_EQ(seen, 3);
    EXPECT_FALSE(s.done);
    EXPECT_TRUE(slots_drain(h, 5.0)) << "slot still in use after the client left";
  }
  EXPECT_EQ(h.metric("deltaserve_client_disconnects_total"), 2);
  // Cancelled early: the engine itself sampled far fewer than the 2 x 200 tokens asked for.
  EXPECT_LT(h.server().engine_stats().generated_tokens, 100);
  // The server keeps serving.
  auto r = h.post("/v1/completions", R"({"prompt": "still there?", "max_tokens": 3})");
  EXPECT_EQ(r.status, 200);
}

TEST(ServerLoad, GracefulShutdownFinishesRunningStreams) {
  Harness h;
  std::atomic<bool> first_event{false};
  Harness::Sse s;
  std::thread client([&] {
    s = h.stream("/v1/completions",
                 R"({"prompt": "drain me", "max_tokens": 60, "ignore_eos": true, "stream": true})",
                 [&](const Json&) {
                   first_event = true;
                   return true;
                 });
  });
  while (!first_event.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::thread stopper([&] { h.server().shutdown(std::chrono::seconds(20)); });
  // While draining: new work and health checks are refused with 503, the running stream goes on.
  Harness::Reply refused;
  for (int i = 0; i < 100; ++i) {
    refused = h.post("/v1/completions", R"({"prompt": "late", "max_tokens": 1})");
    if (refused.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.json["error"]["code"], "shutting_down");
  client.join();
  stopper.join();
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.last_choice()["finish_reason"], "length");
  EXPECT_EQ(s.text().empty(), false);
}

TEST(ServerLoad, ShutdownCancelsWhatOutlivesTheGracePeriod) {
  Harness h;
  std::atomic<bool> first_event{false};
  Harness::Sse s;
  std::thread client([&] {
    s = h.stream("/v1/completions",
                 R"({"prompt": "long", "max_tokens": 240, "ignore_eos": true, "stream": true})",
                 [&](const Json&) {
                   first_event = true;
                   return true;
                 });
  });
  while (!first_event.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = Clock::now();
  h.server().shutdown(std::chrono::milliseconds(50));
  client.join();
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(s.done);  // the stream still ends properly: an error event, then [DONE]
  ASSERT_FALSE(s.events.empty());
  EXPECT_TRUE(s.events.back().contains("error")) << s.raw.substr(s.raw.size() > 400 ? s.raw.size() - 400 : 0);
}

// The deltaserve binary beside this test binary (build/tests/server_tests -> build/src/deltaserve).
std::string deltaserve_binary() {
  namespace fs = std::filesystem;
  fs::path self = fs::read_symlink("/proc/self/exe");
  fs::path bin = self.parent_path().parent_path() / "src" / "deltaserve";
  return fs::exists(bin) ? bin.string() : "";
}

// `deltaserve ARGS...` as a child process with its stderr on a pipe; start() returns once the first stderr line
// names the port ("... at http://127.0.0.1:PORT (...").
struct ServeProcess {
  pid_t pid = -1;
  int err_fd = -1;
  int port = 0;
  std::string log;

  void start(const std::string& bin, std::vector<std::string> args) {
    int err_pipe[2];
    ASSERT_EQ(pipe(err_pipe), 0);
    args.insert(args.begin(), bin);
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(err_pipe[1], 2);
      close(err_pipe[0]);
      std::vector<char*> argv;
      for (auto& x : args) argv.push_back(x.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(err_pipe[1]);
    err_fd = err_pipe[0];
    char buf[512];
    const auto t0 = Clock::now();
    while (port == 0 && seconds_since(t0) < 30) {
      ssize_t n = read(err_fd, buf, sizeof(buf));
      if (n <= 0) break;
      log.append(buf, static_cast<size_t>(n));
      size_t at = log.find("http://127.0.0.1:");
      if (at != std::string::npos && log.find(' ', at) != std::string::npos) port = std::atoi(log.c_str() + at + 17);
    }
    ASSERT_GT(port, 0) << log;
  }
  // SIGTERM, then waits up to 30 s (SIGKILL after); returns the wait status, -1 on the timeout. The rest of
  // stderr lands in `log`.
  int stop() {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int status = 0;
    const auto t1 = Clock::now();
    pid_t w = 0;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && seconds_since(t1) < 30)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (w == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      status = -1;
    }
    pid = -1;
    char buf[512];
    for (ssize_t n; (n = read(err_fd, buf, sizeof(buf))) > 0;) log.append(buf, static_cast<size_t>(n));
    close(err_fd);
    return status;
  }
  ~ServeProcess() {
    if (pid > 0) stop();
  }
};

TEST(ServerLoad, SigtermDrainsAndExitsCleanly) {
  const std::string bin = deltaserve_binary();
  if (bin.empty()) GTEST_SKIP() << "deltaserve binary not built";
  ServeProcess sp;
  ASSERT_NO_FATAL_FAILURE(
      sp.start(bin, {"serve", "--port", "0", "--max-concurrent", "4", "--max-queue", "4", "--shutdown-grace", "20"}));
  const int port = sp.port;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  std::atomic<bool> first_event{false};
  std::string stream_body;
  std::thread client([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt": "bye", "max_tokens": 40, "ignore_eos": true, "stream": true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      stream_body.append(d, n);
      first_event = true;
      return true;
    };
    httplib::Client c2("127.0.0.1", port);
    c2.set_read_timeout(30, 0);
    c2.send(req);
  });
  while (!first_event.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int status = sp.stop();  // SIGTERM while the stream runs: it drains
  client.join();
  ASSERT_NE(status, -1) << "deltaserve did not exit within 30 s of SIGTERM";
  const std::string& log = sp.log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(stream_body.find("\"finish_reason\":\"length\""), std::string::npos)
      << stream_body.substr(0, 300);
  EXPECT_NE(stream_body.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
}

// serve --random-weights: a preset's shape without a checkpoint (here tiny, 2 layers, on the CPU engine), the
// byte tokenizer, token-id prompts; the engine step counters move with the tokens.
TEST(ServerLoad, RandomWeightsPresetServes) {
  const std::string bin = deltaserve_binary();
  if (bin.empty()) GTEST_SKIP() << "deltaserve binary not built";
  ServeProcess sp;
  ASSERT_NO_FATAL_FAILURE(sp.start(bin, {"serve", "--port", "0", "--random-weights", "--preset", "tiny", "--layers",
                                         "2", "--device", "cpu", "--max-concurrent", "2"}));
  EXPECT_NE(sp.log.find("model tiny (byte tokenizer"), std::string::npos) << sp.log;
  httplib::Client c("127.0.0.1", sp.port);
  c.set_read_timeout(30, 0);
  auto r = c.Post("/v1/completions", R"({"prompt": [1, 2, 3, 250], "max_tokens": 5, "ignore_eos": true})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body;
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("deltaserve_engine_step_seconds_count{kind=\"decode\"} 4\n"), std::string::npos) << m->body;
  const int status = sp.stop();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << sp.log;
}

}  // namespace
}  // namespace ds::server::test
