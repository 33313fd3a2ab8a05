// Scripted OpenAI-compatible server on cpp-httplib (see fake_server.h).
#include "tools/fake_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/gsm8k.h"

namespace ds::tools {

namespace {
using Clock = std::chrono::steady_clock;

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

int64_t count_prompt_tokens(const nlohmann::json& body) {
  if (body.contains("prompt")) {
    const auto& p = body["prompt"];
    if (p.is_array()) return static_cast<int64_t>(p.size());
    if (p.is_string()) return static_cast<int64_t>(split_words(p.get<std::string>()).size());
  }
  int64_t n = 0;
  if (body.contains("messages") && body["messages"].is_array()) {
    for (const auto& m : body["messages"]) {
      if (m.contains("content") && m["content"].is_string()) n += split_words(m["content"].get<std::string>()).size();
    }
  }
  return n;
}

std::string error_json(const std::string& msg) {
  return nlohmann::json{{"error", {{"message", msg}, {"type", "invalid_request_error"}, {"code", 400}}}}.dump();
}

// Everything one completion needs to know, computed when the request arrives.
struct Plan {
  bool chat = false;
  std::vector<std::string> pieces;  // one per output token
  int64_t prompt_tokens = 0;
  bool usage = false;
  std::string finish_reason;
};
}  // namespace

struct FakeServer::Impl {
  FakeServerOptions opt;
  httplib::Server svr;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;
  Clock::time_point started;
  std::atomic<int> requests{0}, in_flight{0}, max_in_flight{0};
  std::atomic<int64_t> decode_steps{0};  // chunks after a request's first (opt.engine_step_ms > 0)
  mutable std::mutex mu;
  std::vector<nlohmann::json> bodies;

  Plan plan(const nlohmann::json& body, bool chat) const {
    Plan p;
    p.chat = chat;
    const int64_t max_tokens = body.value("max_tokens", int64_t{16});
    const bool ignore_eos = body.value("ignore_eos", false);
    if (opt.answer) {
      auto words = split_words(opt.answer(body));
      for (size_t i = 0; i < words.size() && static_cast<int64_t>(i) < max_tokens; ++i)
        p.pieces.push_back((i ? " " : "") + words[i]);
      p.finish_reason = static_cast<int64_t>(words.size()) > max_tokens ? "length" : "stop";
    } else {
      int64_t n = max_tokens;
      if (opt.eos_after > 0 && !ignore_eos && opt.eos_after < n) n = opt.eos_after;
      p.pieces.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), "tok ");
      p.finish_reason = n < max_tokens ? "stop" : "length";
    }
    p.prompt_tokens = count_prompt_tokens(body);
    p.usage = opt.report_usage && body.contains("stream_options") && body["stream_options"].is_object() &&
              body["stream_options"].value("include_usage", false);
    return p;
  }

  nlohmann::json usage_json(const Plan& p) const {
    const auto n = static_cast<int64_t>(p.pieces.size());
    return {{"prompt_tokens", p.prompt_tokens}, {"completion_tokens", n}, {"total_tokens", p.prompt_tokens + n}};
  }

  nlohmann::json chunk(const Plan& p, const std::string& text, const nlohmann::json& finish) const {
    nlohmann::json c0 = {{"index", 0}, {"finish_reason", finish}};
    if (p.chat) {
      c0["delta"] = {{"content", text}};
    } else {
      c0["text"] = text;
    }
    return {{"id", "fake"}, {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
            {"model", opt.model}, {"choices", nlohmann::json::array({c0})}};
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto t0 = Clock::now();
    const auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      res.status = 400;
      res.set_content(error_json("body is not a JSON object"), "application/json");
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      bodies.push_back(body);
    }
    ++requests;
    const Plan p = plan(body, chat);
    if (!body.value("stream", false)) {
      std::this_thread::sleep_until(t0 + std::chrono::duration<double, std::milli>(
                                             opt.ttft_ms + opt.itl_ms * std::max<double>(0, p.pieces.size() - 1.0)));
      std::string text;
      for (const auto& s : p.pieces) text += s;
      nlohmann::json c0 = {{"index", 0}, {"finish_reason", p.finish_reason}};
      if (chat) {
        c0["message"] = {{"role", "assistant"}, {"content", text}};
      } else {
        c0["text"] = text;
      }
      res.set_content(nlohmann::json{{"id", "fake"}, {"model", opt.model}, {"choices", nlohmann::json::array({c0})},
                                     {"usage", usage_json(p)}}.dump(),
                      "application/json");
      return;
    }
    const int now_in = ++in_flight;
    for (int m = max_in_flight.load(); now_in > m && !max_in_flight.compare_exchange_weak(m, now_in);) {
    }
    // Chunk i leaves at t0 + ttft + i * itl (absolute deadlines: sleep jitter does not accumulate).
    auto next = std::make_shared<size_t>(0);
    const size_t per = static_cast<size_t>(std::max(1, opt.tokens_per_chunk));
    const size_t nchunks = (p.pieces.size() + per - 1) / per;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, p, t0, next, per, nchunks](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            const std::string ev = "data: " + data + "\n\n";
            return sink.write(ev.data(), ev.size());
          };
          const size_t i = (*next)++;
          if (i < nchunks) {
            std::this_thread::sleep_until(t0 + std::chrono::duration<double, std::milli>(opt.ttft_ms + opt.itl_ms * i));
            std::string text;
            for (size_t k = i * per; k < std::min(p.pieces.size(), (i + 1) * per); ++k) text += p.pieces[k];
            const bool last = i + 1 == nchunks;
            if (i > 0) ++decode_steps;
            return send(chunk(p, text, last ? nlohmann::json(p.finish_reason) : nlohmann::json(nullptr)).dump());
          }
          if (p.usage) {
            nlohmann::json u = {{"id", "fake"}, {"model", opt.model}, {"choices", nlohmann::json::array()},
                                {"usage", usage_json(p)}};
            if (!send(u.dump())) return false;
          }
          if (!send("[DONE]")) return false;
          sink.done();
          return true;
        },
        [this](bool) { --in_flight; });
  }
};

FakeServer::FakeServer(FakeServerOptions opt) : impl_(std::make_unique<Impl>()) { impl_->opt = std::move(opt); }

FakeServer::~FakeServer() { stop(); }

void FakeServer::start() {
  Impl& s = *impl_;
  const int threads = std::max(4, s.opt.max_streams);
  s.svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.svr.set_keep_alive_max_count(100000);
  s.svr.set_tcp_nodelay(true);  // one small write per token: Nagle would hold them back
  // httplib listens with a backlog of 5, which stalls bursts of connects; remember the socket and raise it
  // after bind (replacing the default options means setting SO_REUSEADDR here too).
  s.svr.set_socket_options([&s](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    s.listen_fd = fd;
  });
  s.svr.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    const double up_ms = std::chrono::duration<double, std::milli>(Clock::now() - s.started).count();
    if (up_ms < s.opt.health_delay_ms) {
      res.status = 503;
      res.set_content("starting", "text/plain");
      return;
    }
    res.set_content("ok", "text/plain");
  });
  s.svr.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& res) {
    nlohmann::json j = {{"object", "list"}, {"data", {{{"id", s.opt.model}, {"object", "model"}}}}};
    res.set_content(j.dump(), "application/json");
  });
  if (s.opt.engine_step_ms > 0)
    s.svr.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
      const int64_t n = s.decode_steps.load();  // one decode token per step
      const double sec = 1e-3 * s.opt.engine_step_ms * static_cast<double>(n);
      res.set_content(fmt::format("deltaserve_engine_step_seconds_sum{{kind=\"decode\"}} {:.9g}\n"
                                  "deltaserve_engine_step_seconds_count{{kind=\"decode\"}} {}\n"
                                  "deltaserve_engine_step_seconds_sum{{kind=\"prefill\"}} 0\n"
                                  "deltaserve_engine_step_seconds_count{{kind=\"prefill\"}} 0\n"
                                  "deltaserve_engine_decode_token_step_seconds_sum {:.9g}\n"
                                  "deltaserve_engine_decode_token_step_seconds_count {}\n",
                                  sec, n, sec, n),
                      "text/plain; version=0.0.4");
    });
  s.svr.Post("/v1/completions", [&s](const httplib::Request& q, httplib::Response& r) { s.complete(q, r, false); });
  s.svr.Post("/v1/chat/completions", [&s](const httplib::Request& q, httplib::Response& r) { s.complete(q, r, true); });

  s.started = Clock::now();
  if (s.opt.port == 0) {
    s.port = s.svr.bind_to_any_port(s.opt.host);
  } else {
    s.port = s.svr.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1;
  }
  CHECK(s.port > 0, "fake server: cannot bind {}:{}", s.opt.host, s.opt.port);
  if (s.listen_fd >= 0) ::listen(s.listen_fd, 1024);
  s.thread = std::thread([&s] { s.svr.listen_after_bind(); });
  while (!s.svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void FakeServer::stop() {
  if (impl_->thread.joinable()) {
    impl_->svr.stop();
    impl_->thread.join();
  }
}

int FakeServer::port() const { return impl_->port; }
std::string FakeServer::base_url() const { return fmt::format("http://{}:{}", impl_->opt.host, impl_->port); }
int FakeServer::requests() const { return impl_->requests.load(); }
int FakeServer::max_in_flight() const { return impl_->max_in_flight.load(); }
std::vector<nlohmann::json> FakeServer::bodies() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->bodies;
}

std::function<std::string(const nlohmann::json&)> make_gsm8k_oracle(const std::string& dataset_path, int wrong_every) {
  auto answers = std::make_shared<std::map<std::string, std::string>>();
  int n = 0;
  for (const auto& ex : load_gsm8k(dataset_path)) {
    ++n;
    std::string a = ex.answer;
    if (wrong_every > 0 && n % wrong_every == 0) {
      const auto pos = a.rfind("#### ");
      a = a.substr(0, pos) + "#### " + std::to_string(std::stoll(a.substr(pos + 5)) + 1);
    }
    (*answers)[ex.question] = a;
  }
  return [answers](const nlohmann::json& body) -> std::string {
    std::string text;
    if (body.contains("prompt") && body["prompt"].is_string()) {
      text = body["prompt"].get<std::string>();
    } else if (body.contains("messages") && body["messages"].is_array() && !body["messages"].empty()) {
      text = body["messages"].back().value("content", "");
    }
    const auto q = text.rfind("Question: ");
    if (q == std::string::npos) return "I do not know.";
    std::string question = text.substr(q + 10);
    question = question.substr(0, question.find("\nAnswer:"));
    const auto it = answers->find(question);
    return it == answers->end() ? "I do not know." : it->second;
  };
}

}  // namespace ds::tools
