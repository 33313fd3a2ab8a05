// A scripted OpenAI-compatible server for tests and for `deltaserve fake-server`: fixed TTFT, then one chunk
// every ITL, exact usage counts, optional answer oracle. It exists so the load generator's numbers can be
// checked against known timings, and so sweeps can start and stop a real child server without a model.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ds::tools {

struct FakeServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                    // 0: an ephemeral port (read it back with port())
  double ttft_ms = 50;             // request parsed -> first output chunk
  double itl_ms = 10;              // between output chunks
  int tokens_per_chunk = 1;        // >1 checks that output counts come from usage, not chunks
  bool report_usage = true;        // honour stream_options.include_usage
  int64_t eos_after = 0;           // > 0: stop after this many tokens unless ignore_eos is sent
  int max_streams = 256;           // worker threads; each open stream or kept-alive connection holds one
  double health_delay_ms = 0;      // /health answers 503 for this long after start
  // > 0: /metrics exports deltaserve's engine step counters (server/engine_loop.h, StepTimes) as if every output
  // chunk after a request's first came from a decode step of this many ms, so the load generator's
  // engine-step column can be checked against a known value. 0: no /metrics page (like another engine).
  double engine_step_ms = 0;
  std::string model = "fake-model";
  // Output text for a request (the eval tests' oracle); one "token" per whitespace-separated word. Empty:
  // "tok" repeated max_tokens times.
  std::function<std::string(const nlohmann::json& body)> answer;
};

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions opt);
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  // Binds and serves on a background thread; returns once it accepts connections. Throws if bind fails.
  void start();
  void stop();
  int port() const;
  std::string base_url() const;

  int requests() const;       // completion requests seen
  int max_in_flight() const;  // most completion requests open at once
  std::vector<nlohmann::json> bodies() const;  // every completion request body, in arrival order

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// An answer oracle for GSM8K-style prompts: finds the last "Question: ..." of the prompt (or of the last user
// message), looks it up in the JSONL dataset and answers with its reference solution; every `wrong_every`-th
// question of the file (1-based, 0 = never) is answered with the final number plus one.
std::function<std::string(const nlohmann::json&)> make_gsm8k_oracle(const std::string& dataset_path,
                                                                    int wrong_every);

}  // namespace ds::tools
