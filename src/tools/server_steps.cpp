// Reading the engine step times from a server's /metrics page (see server_steps.h).
#include "tools/server_steps.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "tools/http_client.h"

namespace ds::tools {

std::optional<ServerStepSample> parse_server_step_times(const std::string& page) {
  ServerStepSample s;
  int seen = 0;  // bit per sample below
  size_t pos = 0;
  while (pos < page.size()) {
    size_t end = page.find('\n', pos);
    if (end == std::string::npos) end = page.size();
    std::string_view line(page.data() + pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, sp);
    static constexpr std::string_view kKeys[] = {  // seconds at even indices, counts at odd ones
        R"(deltaserve_engine_step_seconds_sum{kind="decode"})",
        R"(deltaserve_engine_step_seconds_count{kind="decode"})",
        R"(deltaserve_engine_step_seconds_sum{kind="prefill"})",
        R"(deltaserve_engine_step_seconds_count{kind="prefill"})",
        "deltaserve_engine_decode_token_step_seconds_sum",
        "deltaserve_engine_decode_token_step_seconds_count"};
    int which = -1;
    for (int i = 0; i < 6; ++i)
      if (key == kKeys[i]) which = i;
    if (which < 0) continue;
    const std::string text(line.substr(sp + 1));
    char* stop = nullptr;
    const double v = std::strtod(text.c_str(), &stop);
    if (text.empty() || *stop != '\0' || !std::isfinite(v) || v < 0) return std::nullopt;
    // Counts are integers; anything past 2^53 would not be exact in a double anyway.
    if ((which & 1) && (v != std::floor(v) || v > 9007199254740992.0)) return std::nullopt;
    switch (which) {
      case 0: s.decode_seconds = v; break;
      case 1: s.decode_steps = static_cast<int64_t>(v); break;
      case 2: s.prefill_seconds = v; break;
      case 3: s.prefill_steps = static_cast<int64_t>(v); break;
      case 4: s.decode_token_seconds = v; break;
      default: s.decode_tokens = static_cast<int64_t>(v); break;
    }
    seen |= 1 << which;
  }
  if (seen != 0x3F) return std::nullopt;
  return s;
}

std::optional<ServerStepSample> scrape_server_step_times(const std::string& base_url, const std::string& api_key,
                                                         double timeout_s) {
  HttpClient c(base_url, timeout_s, api_key);
  const HttpReply r = c.get("/metrics");
  if (!r.ok()) return std::nullopt;
  return parse_server_step_times(r.body);
}

double token_step_ms(const ServerStepSample& before, const ServerStepSample& after) {
  const int64_t n = after.decode_tokens - before.decode_tokens;
  const double sec = after.decode_token_seconds - before.decode_token_seconds;
  if (n <= 0 || sec < 0) return std::numeric_limits<double>::quiet_NaN();
  return 1e3 * sec / static_cast<double>(n);
}

}  // namespace ds::tools
