// OpenAI-compatible wire format, client side: endpoints, server-sent-event framing, stream chunk decoding.
// Pure functions (no sockets) so the tests can feed them crafted bytes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ds::tools {

enum class EndpointKind { kCompletions, kChat };

EndpointKind parse_endpoint_kind(const std::string& s);  // "completions" | "chat"; throws otherwise
const char* endpoint_path(EndpointKind k);               // "/v1/completions" | "/v1/chat/completions"
const char* endpoint_name(EndpointKind k);

// Splits a byte stream into server-sent events and hands over each event's data (multi-line data joined
// with '\n'). Bytes may arrive cut anywhere, including inside a line or between '\r' and '\n'.
// A line or an event's data longer than max_event_bytes (a server that never ends its line) stops the parser:
// feed() returns false from then on and hands over nothing more, so a client's memory stays bounded.
class SseParser {
 public:
  static constexpr size_t kDefaultMaxEventBytes = size_t{16} << 20;
  explicit SseParser(size_t max_event_bytes = kDefaultMaxEventBytes) : max_event_bytes_(max_event_bytes) {}
  bool feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data);
  bool overflowed() const { return overflowed_; }
  size_t max_event_bytes() const { return max_event_bytes_; }

 private:
  size_t max_event_bytes_;
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool overflowed_ = false;
};

// One decoded stream event.
struct StreamEvent {
  bool done = false;             // the "[DONE]" sentinel
  std::string text;              // output text in this chunk (completion text, or chat content + reasoning)
  bool has_usage = false;
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  std::string finish_reason;
  std::string error;             // malformed JSON or an "error" object sent in the stream
};
StreamEvent decode_stream_event(const std::string& data, EndpointKind kind);

// Output text of a non-streamed response (choices[0].text or choices[0].message.content).
std::string response_text(const nlohmann::json& response, EndpointKind kind);

// Splits "http://host:port/prefix" into the scheme+host+port part httplib wants and the path prefix.
struct BaseUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string prefix;            // "" or "/openai" (no trailing slash); endpoint paths are appended to it
};
BaseUrl split_base_url(const std::string& url);

}  // namespace ds::tools
