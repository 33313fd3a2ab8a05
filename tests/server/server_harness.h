// Server tests' harness: the embedded model behind a real HttpServer on an ephemeral loopback port, and a
// small HTTP client with an SSE reader.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/cpu_model.h"
#include "runtime/cpu_engine.h"
#include "runtime/model_files.h"
#include "server/http_server.h"

namespace ds::server::test {

using Json = nlohmann::json;

// The embedded model, built once per test binary (random init takes ~0.5 s).
struct SharedModel {
  LoadedModel loaded;
  std::shared_ptr<const CpuModel> model;
};
inline const SharedModel& shared_model() {
  static const SharedModel* m = [] {
    auto* s = new SharedModel{load_model(""), nullptr};
    s->model = std::make_shared<const CpuModel>(s->loaded.config, s->loaded.weights, CpuModelOptions{});
    return s;
  }();
  return *m;
}

inline ServerOptions test_options() {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.max_concurrent = 8;
  o.max_queue = 8;
  o.served_model_name = "tiny";
  o.prompt_limits.max_model_len = 256;
  o.max_body_bytes = 64 * 1024;
  return o;
}

// A CpuEngine (slots = max_concurrent) and an HttpServer on it, started; shut down at destruction.
class Harness {
 public:
  // tokenizer: the server's tokenizer when not the embedded model's own (it must outlive the harness).
  explicit Harness(ServerOptions o = test_options(), const Tokenizer* tokenizer = nullptr) : options_(o) {
    const auto& m = shared_model();
    CpuEngineOptions eo;
    eo.max_seqs = o.max_concurrent;
    eo.max_model_len = o.prompt_limits.max_model_len;
    eo.eos_token_ids = m.loaded.eos_token_ids();
    eo.seed = 1;
    engine_ = std::make_unique<CpuEngine>(m.model, eo);
    server_ = std::make_unique<HttpServer>(*engine_, tokenizer ? *tokenizer : *m.loaded.tokenizer, o);
    port_ = server_->start();
  }
  ~Harness() {
    server_->shutdown(std::chrono::milliseconds(0));
    server_.reset();
  }

  int port() const { return port_; }
  HttpServer& server() { return *server_; }
  const ServerOptions& options() const { return options_; }

  // DS_TEST_TIMEOUT_SCALE (an integer in [1, 100]) stretches the read timeout for sanitizer builds, whose CPU engine runs
  // several times slower (the 64-stream load test needs ~2 min under TSan).
  static int timeout_scale() {
    static const int scale = [] {
      const char* v = std::getenv("DS_TEST_TIMEOUT_SCALE");
      if (!v || !*v) return 1;
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (*end != '\0' || x < 1 || x > 100) {
        ADD_FAILURE() << "DS_TEST_TIMEOUT_SCALE='" << v << "' is not an integer in [1, 100]; using 1";
        return 1;
      }
      return static_cast<int>(x);
    }();
    return scale;
  }
  httplib::Client client(int read_timeout_s = 60) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(read_timeout_s * timeout_scale(), 0);
    c.set_connection_timeout(5, 0);
    return c;
  }

  struct Reply {
    int status = -1;  // -1: no response (connection error)
    std::string body;
    Json json;  // parsed body (discarded when not JSON)
  };
  Reply post(const std::string& path, const std::string& body, httplib::Headers headers = {}) const {
    auto c = client();
    auto r = c.Post(path.c_str(), headers, body, "application/json");
    return to_reply(r);
  }
  Reply get(const std::string& path, httplib::Headers headers = {}) const {
    auto c = client();
    auto r = c.Get(path.c_str(), headers);
    return to_reply(r);
  }

  struct Sse {
    int status = -1;
    std::vector<Json> events;  // each `data: {...}` event, in order
    bool done = false;         // `data: [DONE]` seen (and it was the last event)
    std::string raw;
    std::string text() const;  // concatenated completion text / chat content deltas
    Json last_choice() const;  // the choice of the last event that had one
  };
  // POSTs and reads server-sent events; on_event returns false to hang up (the client closes the socket).
  Sse stream(const std::string& path, const std::string& body,
             std::function<bool(const Json&)> on_event = nullptr, httplib::Headers headers = {}) const;

  // Scrapes /metrics and returns the value of one sample ("name" or "name{labels}"), -1 if absent.
  double metric(const std::string& sample) const;

 private:
  static Reply to_reply(const httplib::Result& r) {
    Reply out;
    if (!r) return out;
    out.status = r->status;
    out.body = r->body;
    out.json = Json::parse(r->body, nullptr, false);
    return out;
  }

  ServerOptions options_;
  std::unique_ptr<CpuEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

inline std::string Harness::Sse::text() const {
  std::string t;
  for (const auto& e : events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const auto& c = e["choices"][0];
    if (c.contains("text")) t += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content")) t += c["delta"]["content"].get<std::string>();
  }
  return t;
}

inline Json Harness::Sse::last_choice() const {
  for (auto it = events.rbegin(); it != events.rend(); ++it)
    if (it->contains("choices") && !(*it)["choices"].empty()) return (*it)["choices"][0];
  return Json();
}

inline Harness::Sse Harness::stream(const std::string& path, const std::string& body,
                                    std::function<bool(const Json&)> on_event,
                                    httplib::Headers headers) const {
  Sse out;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.raw.append(data, n);
    buf.append(data, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
      std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      std::string data = event.substr(6);
      if (data == "[DONE]") {
        out.done = true;
        continue;
      }
      EXPECT_FALSE(out.done) << "event after [DONE]";
      out.events.push_back(Json::parse(data, nullptr, false));
      if (on_event && !on_event(out.events.back())) return false;
    }
    return true;
  };
  auto c = client();
  auto r = c.send(req);
  if (r && out.status < 0) out.status = r->status;
  return out;
}

inline double Harness::metric(const std::string& sample) const {
  Reply r = get("/metrics");
  size_t pos = 0;
  while ((pos = r.body.find(sample + " ", pos)) != std::string::npos) {
    if (pos == 0 || r.body[pos - 1] == '\n') return std::stod(r.body.substr(pos + sample.size() + 1));
    ++pos;
  }
  return -1;
}

}  // namespace ds::server::test
