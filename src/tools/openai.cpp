// SSE framing and OpenAI stream-chunk decoding (see openai.h).
#include "tools/openai.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace ds::tools {

EndpointKind parse_endpoint_kind(const std::string& s) {
  if (s == "completions" || s == "completion") return EndpointKind::kCompletions;
  if (s == "chat") return EndpointKind::kChat;
  DS_THROW("unknown endpoint '{}' (expected completions or chat)", s);
}

const char* endpoint_path(EndpointKind k) {
  return k == EndpointKind::kChat ? "/v1/chat/completions" : "/v1/completions";
}
const char* endpoint_name(EndpointKind k) { return k == EndpointKind::kChat ? "chat" : "completions"; }

bool SseParser::feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data) {
  for (const char c : bytes) {
    if (overflowed_) break;
    if (c != '\n') {
      line_ += c;
      if (line_.size() > max_event_bytes_) overflowed_ = true;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {  // blank line: the event is complete
      if (has_data_) on_data(data_);
      data_.clear();
      has_data_ = false;
    } else if (line_.rfind("data:", 0) == 0) {
      std::string_view v(line_);
      v.remove_prefix(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);  // the one optional space after the colon
      if (has_data_) data_ += '\n';
      data_.append(v);
      has_data_ = true;
      if (data_.size() > max_event_bytes_) overflowed_ = true;
    }  // comments (":"), "event:", "id:", "retry:" carry nothing a completion stream needs
    line_.clear();
  }
  if (overflowed_) {  // give the memory back at once
    std::string().swap(line_);
    std::string().swap(data_);
    has_data_ = false;
  }
  return !overflowed_;
}

namespace {
std::string string_or_empty(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
// A usage count as sent by any server: a non-negative integer (or an integral float below 2^53), else -1 (the
// "not reported" value). json::value() threw on null and converted 1e300 to int64 (undefined; fuzz findings).
int64_t count_or_missing(const nlohmann::json& u, const char* key) {
  const auto it = u.find(key);
  if (it == u.end()) return -1;
  if (it->is_number_unsigned()) return it->get<uint64_t>() <= INT64_MAX ? static_cast<int64_t>(it->get<uint64_t>()) : -1;
  if (it->is_number_integer()) return std::max<int64_t>(-1, it->get<int64_t>());
  if (it->is_number_float()) {
    const double d = it->get<double>();
    return std::isfinite(d) && d >= 0 && d <= 9007199254740992.0 && d == std::floor(d) ? static_cast<int64_t>(d) : -1;
  }
  return -1;
}
}  // namespace

StreamEvent decode_stream_event(const std::string& data, EndpointKind kind) {
  StreamEvent ev;
  if (data == "[DONE]") {
    ev.done = true;
    return ev;
  }
  const auto j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    ev.error = "malformed stream chunk: " + data.substr(0, 200);
    return ev;
  }
  if (j.contains("error")) {
    ev.error = "server error in stream: " + j["error"].dump().substr(0, 300);
    return ev;
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    ev.has_usage = true;
    ev.prompt_tokens = count_or_missing(*u, "prompt_tokens");
    ev.completion_tokens = count_or_missing(*u, "completion_tokens");
  }
  const auto ch = j.find("choices");
  if (ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& c0 = (*ch)[0];
    ev.finish_reason = string_or_empty(c0, "finish_reason");
    if (kind == EndpointKind::kCompletions) {
      ev.text = string_or_empty(c0, "text");
    } else if (const auto d = c0.find("delta"); d != c0.end()) {
      // Reasoning tokens are output tokens too: a server that streams them first has its TTFT there.
      ev.text = string_or_empty(*d, "reasoning_content") + string_or_empty(*d, "reasoning") +
                string_or_empty(*d, "content");
    }
  }
  return ev;
}

std::string response_text(const nlohmann::json& response, EndpointKind kind) {
  const auto ch = response.find("choices");
  if (ch == response.end() || !ch->is_array() || ch->empty()) DS_THROW("response has no choices: {}", response.dump().substr(0, 300));
  const auto& c0 = (*ch)[0];
  if (kind == EndpointKind::kCompletions) return string_or_empty(c0, "text");
  const auto m = c0.find("message");
  return m == c0.end() ? std::string() : string_or_empty(*m, "content");
}

BaseUrl split_base_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  CHECK(scheme_end != std::string::npos, "base URL '{}' needs a scheme (http://host:port)", url);
  const std::string scheme = url.substr(0, scheme_end);
  CHECK(scheme == "http" || scheme == "https", "base URL '{}': scheme must be http or https", url);
  BaseUrl b;
  const auto path_start = url.find('/', scheme_end + 3);
  b.scheme_host_port = url.substr(0, path_start);
  CHECK(b.scheme_host_port.size() > scheme_end + 3, "base URL '{}' has no host", url);
  if (path_start != std::string::npos) b.prefix = url.substr(path_start);
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  // Accept ".../v1" as people paste it from client configs; the endpoint paths add /v1 themselves.
  if (b.prefix.size() >= 3 && b.prefix.compare(b.prefix.size() - 3, 3, "/v1") == 0) b.prefix.resize(b.prefix.size() - 3);
  return b;
}

}  // namespace ds::tools
