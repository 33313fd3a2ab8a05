// The OpenAI-compatible HTTP server: httplib set-up, auth, error bodies, metrics, shutdown (see
// http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/generation.h"
#include "server/openai_json.h"

namespace ds::server {
namespace {

constexpr const char* kJson = "application/json";

// httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG is compiled into Debian's .so): 64
// clients connecting at once see SYN retransmits of ~1 s each. listen() again on the bound socket raises it.
// (httplib's set_socket_options hook runs before bind, where listen() would auto-bind a random port.)
class BacklogServer : public httplib::Server {
 public:
  bool raise_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.to_json(), kJson);
}

ApiError make_error(int status, std::string message, std::string type, std::string code = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// Compares without an early exit, so the time taken does not tell how much of a guessed key was right.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(Engine& engine, const Tokenizer& tok, ServerOptions o)
      : tok_(tok),
        opt_(std::move(o)),
        loop_(engine, EngineLoopOptions{opt_.max_concurrent + opt_.max_queue, opt_.engine_idle_tick,
                                        opt_.engine_idle_period}) {
    created_ = make_response_ids(Endpoint::kCompletions, "").created;
    setup_routes();
  }

  ~Impl() {
    if (running_) shutdown(std::chrono::milliseconds(0));
    loop_.stop();
  }

  int start();
  void shutdown(std::chrono::milliseconds grace);

  Metrics metrics_;
  EngineLoop& loop() { return loop_; }
  int port_ = 0;

 private:
  void setup_routes();
  bool authorized(const httplib::Request& req) const;
  void handle_generate(Endpoint ep, const httplib::Request& req, httplib::Response& res);
  void run_to_completion(const PreparedRequest& prep, const ParsedRequest& pr,
                         std::shared_ptr<RequestStream> stream, Clock::time_point arrival,
                         httplib::Response& res);
  void start_stream(const PreparedRequest& prep, const ParsedRequest& pr,
                    std::shared_ptr<RequestStream> stream, Clock::time_point arrival, httplib::Response& res);
  void record_finished(const Generation& g, int prompt_tokens, bool completed);
  void handler_done();
  void count(const httplib::Request& req, const httplib::Response& res);

  const Tokenizer& tok_;
  ServerOptions opt_;
  EngineLoop loop_;
  BacklogServer http_;
  std::thread listen_thread_;
  std::atomic<bool> draining_{false};
  bool running_ = false;
  int64_t created_ = 0;
  // Generation handlers still running (a stream counts until its last byte): shutdown waits for them.
  std::mutex handlers_mu_;
  std::condition_variable handlers_cv_;
  int handlers_ = 0;
};

bool HttpServer::Impl::authorized(const httplib::Request& req) const {
  if (opt_.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  return h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 &&
         constant_time_equal(h.substr(prefix.size()), opt_.api_key);
}

void HttpServer::Impl::setup_routes() {
  const int threads = opt_.max_concurrent + opt_.max_queue + 16;  // + health, metrics and 429 answers
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_.set_payload_max_length(opt_.max_body_bytes);
  http_.set_keep_alive_max_count(1000);

  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
      send_error(res, make_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                 "authentication_error", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Called for every response with status >= 400; fills a JSON body where httplib answered by itself
  // (404 no route, 413 body too large, 400 unparsable request line) and leaves ours alone.
  http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    count(req, res);
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, make_error(404, "no route for " + req.method + " " + req.path, "invalid_request_error",
                                 "not_found"));
    else if (res.status == 413)
      send_error(res,
                 make_error(413, "request body larger than " + std::to_string(opt_.max_body_bytes) + " bytes",
                            "invalid_request_error", "payload_too_large"));
    else
      send_error(res, make_error(res.status, "request rejected (HTTP " + std::to_string(res.status) + ")",
                                 res.status < 500 ? "invalid_request_error" : "server_error"));
  });
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG_ERROR("handler exception: {}", what);
    send_error(res, make_error(500, "internal server error: " + what, "server_error"));
  });
  // Requests are counted before their answer is sent (httplib's logger runs after, so a client could see
  // its answer and scrape /metrics before its own request was counted): errors here, the rest in count_ok.
  http_.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (draining_) {
      send_error(res, make_error(503, "server is shutting down", "server_error", "shutting_down"));
      return;
    }
    res.set_content("{\"status\":\"ok\"}", kJson);
    count(req, res);
  });
  http_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 200;
    count(req, res);  // this scrape counts itself
    res.set_content(metrics_.render(loop_.stats(), loop_.step_times()), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(models_json(opt_.served_model_name, created_, opt_.prompt_limits.max_model_len), kJson);
    count(req, res);
  });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(Endpoint::kCompletions, req, res);
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(Endpoint::kChatCompletions, req, res);
  });
}

void HttpServer::Impl::count(const httplib::Request& req, const httplib::Response& res) {
  // Unknown paths share one label so that random URLs cannot grow the metric without bound.
  static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                "/metrics"};
  std::string endpoint = "other";
  for (const char* k : known)
    if (req.path == k) endpoint = k;
  metrics_.count_request(endpoint, res.status < 0 ? 200 : res.status);
}

void HttpServer::Impl::handler_done() {
  std::lock_guard lk(handlers_mu_);
  if (--handlers_ == 0) handlers_cv_.notify_all();
}

void HttpServer::Impl::record_finished(const Generation& g, int prompt_tokens, bool completed) {
  metrics_.add_tokens(prompt_tokens, g.completion_tokens());
  if (!g.has_first_token()) return;
  metrics_.observe_ttft(g.ttft_seconds());
  if (g.completion_tokens() > 1) metrics_.observe_tpot(g.tpot_seconds());
  if (completed) metrics_.observe_e2e(g.e2e_seconds());
}

void HttpServer::Impl::handle_generate(Endpoint ep, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  {
    std::lock_guard lk(handlers_mu_);
    ++handlers_;
  }
  bool streaming = false;
  try {
    if (draining_)
      throw ApiException{make_error(503, "server is shutting down", "server_error", "shutting_down")};
    ParsedRequest pr = parse_request(ep, req.body, opt_.parse_limits);
    if (!pr.model.empty() && pr.model != opt_.served_model_name) {
      ApiError e = make_error(
          404,
          "the model '" + pr.model + "' does not exist; this server serves '" + opt_.served_model_name + "'",
          "invalid_request_error", "model_not_found");
      e.param = "model";
      throw ApiException{e};
    }
    PreparedRequest prep = prepare_request(pr, tok_, opt_.prompt_limits);
    auto stream = loop_.submit(prep.engine_request);
    if (!stream) {
      res.set_header("Retry-After", "1");
      throw ApiException{make_error(429,
                                    "server at capacity (" +
                                        std::to_string(opt_.max_concurrent + opt_.max_queue) +
                                        " requests in flight); retry later",
                                    "rate_limit_error", "too_many_requests")};
    }
    if (pr.stream) {
      streaming = true;  // the stream's releaser calls handler_done()
      start_stream(prep, pr, std::move(stream), arrival, res);
    } else {
      run_to_completion(prep, pr, std::move(stream), arrival, res);
    }
  } catch (const ApiException& e) {
    send_error(res, e.error);
  } catch (const std::exception& e) {
    LOG_ERROR("request failed: {}", e.what());
    send_error(res, make_error(500, std::string("internal server error: ") + e.what(), "server_error"));
  }
  if (res.status < 400) count(req, res);  // errors are counted by the error handler
  if (!streaming) handler_done();
}

void HttpServer::Impl::run_to_completion(const PreparedRequest& prep, const ParsedRequest& pr,
                                         std::shared_ptr<RequestStream> stream, Clock::time_point arrival,
                                         httplib::Response& res) {
  Generation gen(tok_, prep.stop, arrival);
  std::string text;
  Generation::Step st;
  // A client that disconnects is only noticed when the answer is written; the work is bounded by max_tokens.
  while (!st.finished) {
    st = gen.consume(stream->wait(std::chrono::milliseconds(200)));
    text += st.text;
  }
  if (st.stop_string) loop_.cancel(stream);
  record_finished(gen, prep.prompt_tokens, st.error.empty());
  if (!st.error.empty()) {
    throw ApiException{st.error_is_client ? make_error(400, st.error, "invalid_request_error")
                                          : make_error(503, st.error, "server_error", "unavailable")};
  }
  ResponseIds ids = make_response_ids(pr.endpoint, opt_.served_model_name);
  res.set_content(
      response_json(ids, text, st.finish_reason, Usage{prep.prompt_tokens, gen.completion_tokens()}), kJson);
}

void HttpServer::Impl::start_stream(const PreparedRequest& prep, const ParsedRequest& pr,
                                    std::shared_ptr<RequestStream> stream, Clock::time_point arrival,
                                    httplib::Response& res) {
  struct Session {
    std::shared_ptr<RequestStream> stream;
    Generation gen;
    ResponseIds ids;
    bool include_usage;
    int prompt_tokens;
    bool started = false;
    bool done = false;
  };
  auto s = std::make_shared<Session>(Session{std::move(stream), Generation(tok_, prep.stop, arrival),
                                             make_response_ids(pr.endpoint, opt_.served_model_name),
                                             pr.include_usage, prep.prompt_tokens});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, s](size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        if (!s->started && s->ids.endpoint == Endpoint::kChatCompletions)
          out += role_chunk(s->ids, s->include_usage);
        s->started = true;
        Generation::Step st;
        bool internal_error = false;
        try {
          st = s->gen.consume(s->stream->wait(std::chrono::milliseconds(100)));
        } catch (const std::exception& e) {
          // This runs on httplib's writer thread, outside the handler's try: an exception escaping here would
          // terminate the server. End this stream with an error event instead and free its slot.
          LOG_ERROR("stream failed: {}", e.what());
          loop_.cancel(s->stream);
          st = Generation::Step{};
          st.finished = true;
          st.error = std::string("internal server error: ") + e.what();
          internal_error = true;
        }
        if (!st.text.empty()) out += text_chunk(s->ids, st.text, s->include_usage);
        if (st.stop_string) loop_.cancel(s->stream);  // frees the slot now; the engine would go on
        if (st.finished) {
          if (!st.error.empty()) {
            out += error_event(st.error_is_client ? make_error(400, st.error, "invalid_request_error")
                               : internal_error   ? make_error(500, st.error, "server_error")
                                                  : make_error(503, st.error, "server_error", "unavailable"));
          } else {
            out += finish_chunk(s->ids, st.finish_reason, s->include_usage);
            if (s->include_usage)
              out += usage_chunk(s->ids, Usage{s->prompt_tokens, s->gen.completion_tokens()});
          }
          out += kDoneEvent;
        }
        // A failed write is how a disconnected client shows: the releaser below cancels the request.
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (st.finished) {
          s->done = true;
          record_finished(s->gen, s->prompt_tokens, st.error.empty());
          sink.done();
        }
        return true;
      },
      [this, s](bool) {
        if (!s->done) {  // the client went away (or the server stopped) mid-stream: free the slot at once
          loop_.cancel(s->stream);
          metrics_.count_disconnect();
          record_finished(s->gen, s->prompt_tokens, false);
        }
        handler_done();
      });
}

int HttpServer::Impl::start() {
  // A client that disconnects makes the next send() raise SIGPIPE, which would kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  int port = opt_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(opt_.host);
    if (port < 0) DS_THROW("cannot bind {}:<any port>", opt_.host);
  } else if (!http_.bind_to_port(opt_.host, port)) {
    DS_THROW("cannot bind {}:{} (in use, or not an address of this machine?)", opt_.host, port);
  }
  if (!http_.raise_backlog(1024))
    LOG_WARN("could not raise the listen backlog; bursts of connects may stall");
  listen_thread_ = std::thread([this] { http_.listen_after_bind(); });
  port_ = port;
  running_ = true;
  return port;
}

void HttpServer::Impl::shutdown(std::chrono::milliseconds grace) {
  if (!running_) return;
  draining_ = true;
  // 1. Let what is in flight finish, up to the grace period; 2. cancel the rest (streams end with an error
  // event); 3. wait for the handlers to write their last bytes, then close the listener and the pool.
  const auto deadline = Clock::now() + grace;
  std::unique_lock lk(handlers_mu_);
  handlers_cv_.wait_until(lk, deadline, [&] { return handlers_ == 0; });
  if (handlers_ > 0) {
    LOG_WARN("shutdown: cancelling {} request(s) still running after the grace period", handlers_);
    loop_.cancel_all();
    handlers_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return handlers_ == 0; });
  }
  lk.unlock();
  http_.stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  loop_.stop();
  running_ = false;
}

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}
HttpServer::~HttpServer() = default;
int HttpServer::start() { return impl_->start(); }
void HttpServer::shutdown(std::chrono::milliseconds grace) { impl_->shutdown(grace); }
const Metrics& HttpServer::metrics() const { return impl_->metrics_; }
EngineStats HttpServer::engine_stats() const { return impl_->loop().stats(); }
int HttpServer::port() const { return impl_->port_; }

}  // namespace ds::server
