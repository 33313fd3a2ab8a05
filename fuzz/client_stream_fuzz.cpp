// libFuzzer harness: a hostile or broken server's response body, as the bench/eval client reads it. Byte 0:
// bit 0 picks the endpoint kind, the other bits seed how reads cut the stream. No socket: SseParser and the
// decoding are pure; the per-event handling and the record building mirror HttpClient::stream's content
// receiver and run_gsm8k's reply handling. Only ds::Error may escape, and whatever lands in a record must come
// out of report_json (how bench/eval/validate write reports) as valid UTF-8 JSON that reads back.
#include <cstdint>
#include <cstdlib>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tools/gsm8k.h"
#include "tools/json_fields.h"
#include "tools/metrics.h"
#include "tools/openai.h"

namespace {

using namespace ds::tools;

void check(bool ok) {
  if (!ok) std::abort();
}

// Well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 0 : b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : -1;
    if (n < 0 || i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1 && b == 0xE0) lo = 0xA0;
      if (k == 1 && b == 0xED) hi = 0x9F;
      if (k == 1 && b == 0xF0) lo = 0x90;
      if (k == 1 && b == 0xF4) hi = 0x8F;
      if (c < lo || c > hi) return false;
    }
    i += n + 1;
  }
  return true;
}

// A report line as the tools write it: valid UTF-8 JSON however hostile the server (reports are read back by
// later runs, e.g. cross-run comparisons).
void check_report(const nlohmann::json& j) {
  const std::string text = report_json(j);
  check(valid_utf8(text));
  (void)nlohmann::json::parse(text);  // throws (and so fails) if it does not read back
}

void fuzz_stream(EndpointKind kind, std::string_view body, uint32_t seed) {
  // Framing must not depend on where the network cut the bytes (openai.h): one feed vs. reads of 1..16 bytes.
  std::vector<std::string> events, cut_events;
  SseParser whole, cut;
  whole.feed(body, [&](const std::string& d) { events.push_back(d); });
  for (size_t i = 0; i < body.size();) {
    seed = seed * 1103515245u + 12345u;
    const size_t n = 1 + (seed >> 16) % 16;
    cut.feed(body.substr(i, n), [&](const std::string& d) { cut_events.push_back(d); });
    i += n;
  }
  check(events == cut_events);

  RequestTiming t;
  std::string stream_error;
  for (const std::string& payload : events) {
    const StreamEvent ev = decode_stream_event(payload, kind);
    check(ev.done == (payload == "[DONE]"));
    if (!ev.error.empty()) check(ev.text.empty() && !ev.has_usage && ev.finish_reason.empty());
    if (!ev.has_usage) check(ev.prompt_tokens == -1 && ev.completion_tokens == -1);
    check(ev.prompt_tokens >= -1 && ev.completion_tokens >= -1);  // a count, or -1 for "not reported"
    check(valid_utf8(ev.text) && valid_utf8(ev.finish_reason));  // strings out of a parsed JSON document
    if (!ev.error.empty() && stream_error.empty()) stream_error = ev.error;
    if (!ev.text.empty()) t.chunk_ms.push_back(1.0);
    if (ev.has_usage && ev.completion_tokens >= 0) t.output_tokens = ev.completion_tokens;
    if (ev.has_usage && ev.prompt_tokens >= 0) t.input_tokens = ev.prompt_tokens;
  }
  t.error = stream_error;
  t.ok = t.error.empty();
  check_report(to_json(t));  // every request, error included, goes into the bench report JSON
}

void fuzz_response(EndpointKind kind, std::string_view body) {
  EvalRecord r;
  r.reference = "42";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    r.error = fmt::format("bad response: {}", e.what());
  }
  if (r.error.empty()) {
    try {
      r.response = response_text(j, kind);
      check(valid_utf8(r.response));
    } catch (const ds::Error& e) {
      r.error = fmt::format("bad response: {}", e.what());
    }
  }
  score_record(r);
  check_report(record_to_json(r));  // `eval` writes every record this way
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const EndpointKind kind = (data[0] & 1) ? EndpointKind::kChat : EndpointKind::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz_stream(kind, body, data[0] >> 1);
  fuzz_response(kind, body);
  return 0;
}
