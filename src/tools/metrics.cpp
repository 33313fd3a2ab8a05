// Metric math for streamed requests: TTFT, TPOT, ITL, end-to-end latency, throughput and tps/user.
#include "tools/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace ds::tools {

double tpot_ms(const RequestTiming& r) {
  if (!r.ok || r.output_tokens < 2 || std::isnan(r.ttft_ms) || std::isnan(r.latency_ms)) return kNaN;
  return (r.latency_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1);
}

std::vector<double> itl_ms(const RequestTiming& r) {
  std::vector<double> gaps;
  if (!r.ok) return gaps;
  for (size_t i = 1; i < r.chunk_ms.size(); ++i) gaps.push_back(r.chunk_ms[i] - r.chunk_ms[i - 1]);
  return gaps;
}

PointMetrics compute_point_metrics(const std::vector<RequestTiming>& reqs) {
  PointMetrics m;
  m.requests = static_cast<int>(reqs.size());
  std::vector<double> ttft, tpot, itl, e2e;
  double first_start = 0, last_end = 0;
  bool any = false;
  for (const auto& r : reqs) {
    // Failed requests still occupied the wall clock, so they count in the duration.
    const double end = r.start_s + (std::isnan(r.latency_ms) ? 0.0 : r.latency_ms / 1000.0);
    if (!any) {
      first_start = r.start_s;
      last_end = end;
      any = true;
    }
    first_start = std::min(first_start, r.start_s);
    last_end = std::max(last_end, end);
    if (!r.ok) {
      ++m.failed;
      continue;
    }
    ++m.ok;
    if (r.output_from_usage) ++m.counted_from_usage;
    if (r.requested_output_tokens > 0 && r.output_tokens < r.requested_output_tokens) ++m.short_outputs;
    m.output_tokens += r.output_tokens;
    if (r.input_tokens > 0) m.input_tokens += r.input_tokens;
    if (!std::isnan(r.ttft_ms)) ttft.push_back(r.ttft_ms);
    if (const double t = tpot_ms(r); !std::isnan(t)) tpot.push_back(t);
    const auto gaps = itl_ms(r);
    itl.insert(itl.end(), gaps.begin(), gaps.end());
    e2e.push_back(r.latency_ms);
  }
  m.duration_s = any ? last_end - first_start : 0.0;
  m.ttft_ms = summarize(ttft);
  m.tpot_ms = summarize(tpot);
  m.itl_ms = summarize(itl);
  m.e2e_ms = summarize(e2e);
  if (m.duration_s > 0) {
    m.output_tps = static_cast<double>(m.output_tokens) / m.duration_s;
    m.input_tps = static_cast<double>(m.input_tokens) / m.duration_s;
    m.request_rate = m.ok / m.duration_s;
  }
  if (m.tpot_ms.n > 0 && m.tpot_ms.median > 0) m.tps_per_user = 1000.0 / m.tpot_ms.median;
  return m;
}

const std::vector<std::pair<std::string, std::string>>& metric_definitions() {
  static const std::vector<std::pair<std::string, std::string>> defs = {
      {"TTFT", "time to first token: request sent -> first streamed chunk that carries output text (ms)"},
      {"TPOT", "time per output token: (end-to-end latency - TTFT) / (output tokens - 1), per request (ms); "
               "requests with fewer than 2 output tokens have none"},
      {"ITL", "inter-token latency: every gap between consecutive output chunks, pooled over the point's "
              "requests (ms); a chunk carrying k tokens is one gap, not k"},
      {"E2E", "end-to-end latency: request sent -> end of the stream (ms)"},
      {"output tok/s", "sum of output tokens of the point's successful requests / wall time of the measured "
                       "pass (first send -> last end); input (prompt) tokens are NOT included"},
      {"input tok/s", "sum of prompt tokens / the same wall time; reported apart, never added to output tok/s"},
      {"req/s", "successful requests / the same wall time"},
      {"tps/user", "1000 / median TPOT (ms): decode tokens per second one user sees; the metric of record"},
      {"output tokens", "the server's usage.completion_tokens (requested with stream_options.include_usage); "
                        "when a server does not report usage, the number of output chunks (exact only at one "
                        "token per chunk)"},
      {"engine step", "a deltaserve server's own step time over the pass as its decode tokens saw it (ms): per "
                      "token after its request's first, the time inside the engine step that produced it, averaged; "
                      "from /metrics (deltaserve_engine_decode_token_step_seconds) read before and after the pass; "
                      "absent for other servers"},
      {"TPOT / step", "the clients' TPOT weighted the same way (sum of (E2E - TTFT) / sum of (output tokens - 1)) "
                      "over the engine step: 1.00 means serving adds nothing per token; the excess is the HTTP, "
                      "tokenizer and scheduling time between steps (target: <= 1.05 at concurrency 1-64)"},
      {"percentiles", "p50/p90/p99 use linear interpolation between closest ranks (numpy's default)"},
  };
  return defs;
}

std::string metric_definitions_markdown() {
  std::string s = "Metric definitions:\n\n";
  for (const auto& [k, v] : metric_definitions()) s += fmt::format("- **{}**: {}\n", k, v);
  return s;
}

namespace {
// JSON has no NaN: write null, read null back as NaN.
nlohmann::json num(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }
double get_num(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return kNaN;
  return j[key].get<double>();
}
Summary summary_from_json(const nlohmann::json& j) {
  Summary s;
  if (!j.is_object()) return s;
  s.n = j.value("n", 0);
  s.mean = get_num(j, "mean");
  s.median = get_num(j, "median");
  s.p90 = get_num(j, "p90");
  s.p99 = get_num(j, "p99");
  s.min = get_num(j, "min");
  s.max = get_num(j, "max");
  return s;
}
}  // namespace

nlohmann::json to_json(const RequestTiming& r) {
  nlohmann::json j = {{"user", r.user},
                      {"index", r.index},
                      {"start_s", r.start_s},
                      {"ok", r.ok},
                      {"http_status", r.http_status},
                      {"ttft_ms", num(r.ttft_ms)},
                      {"latency_ms", num(r.latency_ms)},
                      {"tpot_ms", num(tpot_ms(r))},
                      {"output_tokens", r.output_tokens},
                      {"output_from_usage", r.output_from_usage},
                      {"input_tokens", r.input_tokens},
                      {"requested_output_tokens", r.requested_output_tokens},
                      {"chunk_ms", r.chunk_ms}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

nlohmann::json to_json(const Summary& s) {
  return {{"n", s.n},          {"mean", num(s.mean)}, {"median", num(s.median)}, {"p90", num(s.p90)},
          {"p99", num(s.p99)}, {"min", num(s.min)},   {"max", num(s.max)}};
}

nlohmann::json to_json(const PointMetrics& m) {
  return {{"requests", m.requests},
          {"ok", m.ok},
          {"failed", m.failed},
          {"short_outputs", m.short_outputs},
          {"counted_from_usage", m.counted_from_usage},
          {"duration_s", m.duration_s},
          {"ttft_ms", to_json(m.ttft_ms)},
          {"tpot_ms", to_json(m.tpot_ms)},
          {"itl_ms", to_json(m.itl_ms)},
          {"e2e_ms", to_json(m.e2e_ms)},
          {"input_tokens", m.input_tokens},
          {"output_tokens", m.output_tokens},
          {"output_tps", num(m.output_tps)},
          {"input_tps", num(m.input_tps)},
          {"request_rate", num(m.request_rate)},
          {"tps_per_user", num(m.tps_per_user)}};
}

PointMetrics point_metrics_from_json(const nlohmann::json& j) {
  PointMetrics m;
  m.requests = j.value("requests", 0);
  m.ok = j.value("ok", 0);
  m.failed = j.value("failed", 0);
  m.short_outputs = j.value("short_outputs", 0);
  m.counted_from_usage = j.value("counted_from_usage", 0);
  m.duration_s = get_num(j, "duration_s");
  m.ttft_ms = summary_from_json(j.value("ttft_ms", nlohmann::json()));
  m.tpot_ms = summary_from_json(j.value("tpot_ms", nlohmann::json()));
  m.itl_ms = summary_from_json(j.value("itl_ms", nlohmann::json()));
  m.e2e_ms = summary_from_json(j.value("e2e_ms", nlohmann::json()));
  m.input_tokens = j.value("input_tokens", int64_t{0});
  m.output_tokens = j.value("output_tokens", int64_t{0});
  m.output_tps = get_num(j, "output_tps");
  m.input_tps = get_num(j, "input_tps");
  m.request_rate = get_num(j, "request_rate");
  m.tps_per_user = get_num(j, "tps_per_user");
  return m;
}

}  // namespace ds::tools
