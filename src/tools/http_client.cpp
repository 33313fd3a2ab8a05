// cpp-httplib client: streamed completions timed chunk by chunk (see http_client.h).
#include "tools/http_client.h"

#include <httplib.h>

#include <chrono>

#include <fmt/format.h>

namespace ds::tools {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

struct HttpClient::Impl {
  BaseUrl url;
  std::string api_key;
  httplib::Client cli;

  Impl(const std::string& base_url, double timeout_s, std::string key)
      : url(split_base_url(base_url)), api_key(std::move(key)), cli(url.scheme_host_port) {
    const auto us = static_cast<int64_t>(timeout_s * 1e6);
    cli.set_connection_timeout(10, 0);
    // A long generation at high concurrency can take minutes before its first byte: the read timeout is
    // the request timeout, not httplib's 5 s default.
    cli.set_read_timeout(us / 1000000, us % 1000000);
    cli.set_write_timeout(us / 1000000, us % 1000000);
    cli.set_keep_alive(true);
    cli.set_tcp_nodelay(true);
    if (!api_key.empty()) cli.set_bearer_token_auth(api_key);
  }
};

HttpClient::HttpClient(const std::string& base_url, double timeout_s, std::string api_key)
    : impl_(std::make_unique<Impl>(base_url, timeout_s, std::move(api_key))) {}
HttpClient::~HttpClient() = default;

RequestTiming HttpClient::stream(EndpointKind kind, const nlohmann::json& body, std::string* text) {
  RequestTiming t;
  t.requested_output_tokens = body.value("max_tokens", int64_t{-1});
  httplib::Request req;
  req.method = "POST";
  req.path = impl_->url.prefix + endpoint_path(kind);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!impl_->api_key.empty()) req.set_header("Authorization", "Bearer " + impl_->api_key);

  SseParser sse;
  std::string error_body, stream_error;
  int64_t usage_out = -1, usage_in = -1;
  int events = 0;
  int status = 0;
  const auto t0 = Clock::now();
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const double now = ms_since(t0);  // one timestamp per network read: events read together arrive together
    if (status != 200) {
      // An error body is kept for the message, up to 4 KiB.
      if (error_body.size() < 4096) error_body.append(data, std::min(len, 4096 - error_body.size()));
      return true;
    }
    const bool within_limit = sse.feed(std::string_view(data, len), [&](const std::string& payload) {
      ++events;
      const StreamEvent ev = decode_stream_event(payload, kind);
      if (!ev.error.empty() && stream_error.empty()) stream_error = ev.error;
      if (!ev.text.empty()) {
        if (t.chunk_ms.empty()) t.ttft_ms = now;
        t.chunk_ms.push_back(now);
        if (text) *text += ev.text;
      }
      if (ev.has_usage) {
        if (ev.completion_tokens >= 0) usage_out = ev.completion_tokens;
        if (ev.prompt_tokens >= 0) usage_in = ev.prompt_tokens;
      }
    });
    return within_limit;  // false ends the transfer (reported below)
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = impl_->cli.send(req, res, err);
  t.latency_ms = ms_since(t0);
  t.http_status = status ? status : res.status;
  if (sse.overflowed()) {  // the transfer was cancelled by us: say why, not "Canceled"
    t.error = fmt::format("a server-sent event longer than {} bytes: stream abandoned", sse.max_event_bytes());
  } else if (!sent || err != httplib::Error::Success) {
    t.error = fmt::format("transport error: {}", httplib::to_string(err));
  } else if (t.http_status != 200) {
    t.error = fmt::format("HTTP {}: {}", t.http_status, error_body.empty() ? res.body : error_body);
  } else if (!stream_error.empty()) {
    t.error = stream_error;
  } else if (events == 0) {
    t.error = "no server-sent events in the response (does the server stream?)";
  } else if (t.chunk_ms.empty()) {
    t.error = "stream ended without any output text";
  }
  t.ok = t.error.empty();
  t.output_from_usage = usage_out >= 0;
  t.output_tokens = t.output_from_usage ? usage_out : static_cast<int64_t>(t.chunk_ms.size());
  if (usage_in >= 0) t.input_tokens = usage_in;
  return t;
}

namespace {
HttpReply to_reply(const httplib::Result& res) {
  HttpReply r;
  if (!res) {
    r.error = httplib::to_string(res.error());
  } else {
    r.status = res->status;
    r.body = res->body;
  }
  return r;
}
}  // namespace

HttpReply HttpClient::post_json(const std::string& path, const nlohmann::json& body) {
  return to_reply(impl_->cli.Post((impl_->url.prefix + path).c_str(), body.dump(), "application/json"));
}

HttpReply HttpClient::get(const std::string& path) { return to_reply(impl_->cli.Get((impl_->url.prefix + path).c_str())); }

std::string discover_model(const std::string& base_url, const std::string& api_key) {
  HttpClient c(base_url, 10.0, api_key);
  const HttpReply r = c.get("/v1/models");
  if (!r.ok()) return "";
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return "";
  const auto& d0 = j["data"][0];  // any server: a non-object entry or a non-string id means "none"
  const auto id = d0.is_object() ? d0.find("id") : d0.end();
  return id != d0.end() && id->is_string() ? id->get<std::string>() : "";
}

bool health_ok(const std::string& base_url, double timeout_s) {
  const BaseUrl u = split_base_url(base_url);
  httplib::Client cli(u.scheme_host_port);
  const auto us = static_cast<int64_t>(timeout_s * 1e6);
  cli.set_connection_timeout(us / 1000000, us % 1000000);
  cli.set_read_timeout(us / 1000000, us % 1000000);
  auto res = cli.Get((u.prefix + "/health").c_str());
  return res && res->status == 200;
}

}  // namespace ds::tools
