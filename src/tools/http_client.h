// HTTP client for OpenAI-compatible servers (cpp-httplib behind a pimpl, so only http_client.cpp compiles
// the heavy header): streamed completions with per-chunk timestamps, plain JSON calls, health checks.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "tools/metrics.h"
#include "tools/openai.h"

namespace ds::tools {

struct HttpReply {
  int status = 0;       // 0 when no HTTP response came back
  std::string body;
  std::string error;    // transport error ("Connection", "Read"...), empty on any HTTP response
  bool ok() const { return error.empty() && status == 200; }
};

// One connection (kept alive between requests) to one server. Not thread-safe: one per virtual user.
class HttpClient {
 public:
  explicit HttpClient(const std::string& base_url, double timeout_s = 600, std::string api_key = "");
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends a streaming request and times it. Fills every field of RequestTiming except user, index and
  // start_s; `text` (optional) receives the output text.
  RequestTiming stream(EndpointKind kind, const nlohmann::json& body, std::string* text = nullptr);
  HttpReply post_json(const std::string& path, const nlohmann::json& body);
  HttpReply get(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// First model id of GET /v1/models, or "" when the server lists none or the call fails.
std::string discover_model(const std::string& base_url, const std::string& api_key = "");
// True when GET /health answers 200 within timeout_s (one attempt).
bool health_ok(const std::string& base_url, double timeout_s = 2.0);

}  // namespace ds::tools
