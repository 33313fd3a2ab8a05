// The engine thread: it alone touches the Engine (which is not thread-safe); HTTP handler threads submit
// requests and receive their tokens through one RequestStream each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"

namespace ds::server {

// Time the engine thread spent inside Engine::step(), the engine's own step time, split by kind: a decode step
// produced at least one decode token (a token that was not its request's first: the tokens a client's TPOT
// measures); a prefill step produced only first tokens or none (prompt chunks). decode_token_seconds adds, per
// decode token, the duration of the step that produced it: / decode_tokens it is the step time a client's
// tokens saw on average, so a client's token-weighted TPOT over it, minus 1, is what serving adds per token.
// Cumulative since start; /metrics exports them.
struct StepTimes {
  int64_t decode_steps = 0, prefill_steps = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  int64_t decode_tokens = 0;
  double decode_token_seconds = 0;
};

// What a handler receives; filled by the engine thread, drained by the handler.
class RequestStream {
 public:
  struct Update {
    std::vector<int32_t> tokens;  // new since the last wait
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    std::string error;  // set when the engine refused or failed the request (finished is true then)
    bool error_is_client = false;  // the engine refused the request (HTTP 400) rather than failed (500/503)
  };

  // Waits until there is something new or the timeout passes; returns what arrived (maybe nothing).
  Update wait(std::chrono::milliseconds timeout);

 private:
  friend class EngineLoop;
  void deliver(const std::vector<int32_t>& tokens, bool finished, FinishReason reason);
  void fail(std::string error, bool client_error);

  std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;
  bool done_ = false;  // finished was delivered (to the stream, maybe not yet to the handler)
  RequestId id_ = 0;   // engine id, 0 until the engine thread added it
  bool cancel_requested_ = false;
  int64_t generated_ = 0;  // tokens delivered so far (engine thread only: classifies steps, see StepTimes)
};

struct EngineLoopOptions {
  int max_in_flight = 64;  // requests accepted at once (running + waiting in the engine); more -> refused
  // Called on the engine thread after every idle_period without work (a parallel group's heartbeat:
  // DriverEngine::heartbeat, runtime/parallel/driver_engine.h); empty or a zero period: the idle thread just
  // sleeps until a request arrives. An exception from it is logged.
  std::function<void()> idle_tick{};
  std::chrono::milliseconds idle_period{0};
};

class EngineLoop {
 public:
  EngineLoop(Engine& engine, EngineLoopOptions options);
  ~EngineLoop();  // stop()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request for the engine thread. Returns nullptr when max_in_flight requests are already
  // accepted or the loop is stopping (the caller answers 429 / 503).
  std::shared_ptr<RequestStream> submit(Request request);
  // Cancels a request (waiting, running, or not yet handed to the engine); its slot is freed by the engine
  // thread at its next iteration. Safe to call more than once and after the request finished.
  void cancel(const std::shared_ptr<RequestStream>& stream);
  void cancel_all();
  // Stops the thread; requests still in flight end with an error "server shutting down".
  void stop();

  int in_flight() const;
  // Snapshot taken by the engine thread after its latest iteration.
  EngineStats stats() const;
  StepTimes step_times() const;
  // Waits until no request is in flight or the timeout passes; true if idle.
  bool wait_idle(std::chrono::milliseconds timeout);

 private:
  void run();
  void finish_stream(RequestId id);
  void publish_stats();

  Engine& engine_;
  EngineLoopOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes wait_idle
  std::vector<std::pair<Request, std::shared_ptr<RequestStream>>> incoming_;
  std::vector<std::shared_ptr<RequestStream>> cancels_;
  bool stopping_ = false;
  bool cancel_all_ = false;
  int in_flight_ = 0;
  EngineStats stats_;
  StepTimes step_times_;
  // Engine-thread only: streams of requests the engine holds.
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> active_;
  std::thread thread_;
};

}  // namespace ds::server
