// The OpenAI-compatible HTTP server (cpp-httplib): routes, auth, limits, SSE streaming, graceful shutdown.
//
// Threads: httplib's pool runs the handlers (one thread per open request: a stream holds its thread for its
// whole life, so the pool has max_concurrent + max_queue + a few threads); one engine thread (EngineLoop)
// owns the engine. Handlers tokenize, submit, then turn tokens into text and SSE events.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/prompt.h"
#include "server/request_parse.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0: an ephemeral port (start() returns it)
  std::string api_key;      // non-empty: /v1/* needs "Authorization: Bearer <api_key>"
  int max_concurrent = 64;  // requests generating at once (the engine's state slots)
  int max_queue = 256;      // accepted requests waiting for a slot; beyond max_concurrent + max_queue: 429
  size_t max_body_bytes = 8u << 20;
  std::string served_model_name;  // the `model` clients must send (or omit)
  PromptLimits prompt_limits;
  ParseLimits parse_limits;
  // The engine thread's idle callback and its period (EngineLoopOptions): a parallel group's heartbeat.
  std::function<void()> engine_idle_tick{};
  std::chrono::milliseconds engine_idle_period{0};
};

class HttpServer {
 public:
  // engine and tokenizer must outlive the server.
  HttpServer(Engine& engine, const Tokenizer& tokenizer, ServerOptions options);
  ~HttpServer();  // shutdown(0) if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving on a background thread; returns the port. Throws ds::Error if binding fails.
  int start();
  // Graceful stop: new requests get 503, in-flight ones may finish for up to `grace`, then the rest are
  // cancelled (streams end with an error event), the listener closes and the engine thread stops.
  void shutdown(std::chrono::milliseconds grace);

  const Metrics& metrics() const;
  EngineStats engine_stats() const;
  int port() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::server
