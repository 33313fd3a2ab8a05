// Per-request timings of a streamed completion and the per-point metrics derived from them (pure functions).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tools/stats.h"

namespace ds::tools {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// What one streamed request measured. Times are milliseconds after the request was sent (steady clock).
struct RequestTiming {
  int user = 0;                         // virtual user that sent it
  int64_t index = 0;                    // dataset index of the prompt
  double start_s = 0;                   // send time, seconds after the pass started
  bool ok = false;
  std::string error;                    // why it failed (HTTP status + body, transport error)
  int http_status = 0;
  double ttft_ms = kNaN;                // send -> first chunk carrying output text
  double latency_ms = kNaN;             // send -> end of the stream (end-to-end latency)
  std::vector<double> chunk_ms;         // arrival of every chunk carrying output text
  int64_t output_tokens = 0;            // usage.completion_tokens, else the number of output chunks
  bool output_from_usage = false;       // true when the server reported usage
  int64_t input_tokens = -1;            // usage.prompt_tokens, else the dataset's length; -1 unknown
  int64_t requested_output_tokens = -1; // max_tokens sent
};

// (latency - TTFT) / (output tokens - 1): the mean time per output token after the first. NaN for a failed
// request or one with fewer than 2 output tokens (no decode interval exists).
double tpot_ms(const RequestTiming& r);
// Gaps between consecutive output chunks (a chunk may carry several tokens; ITL is per chunk).
std::vector<double> itl_ms(const RequestTiming& r);

struct PointMetrics {
  int requests = 0, ok = 0, failed = 0;
  int short_outputs = 0;       // ok requests with fewer output tokens than requested (stopped at EOS)
  int counted_from_usage = 0;  // ok requests whose output count came from the server's usage
  double duration_s = 0;       // first send -> last end of stream, over the measured requests
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  int64_t input_tokens = 0, output_tokens = 0;  // sums over ok requests; input is never in output_tps
  double output_tps = 0;       // output tokens / duration (input tokens excluded)
  double input_tps = 0;        // input tokens / duration (reported apart, never summed with output)
  double request_rate = 0;     // ok requests / duration
  double tps_per_user = kNaN;  // 1000 / median TPOT (ms): the metric of record
};

PointMetrics compute_point_metrics(const std::vector<RequestTiming>& reqs);

// Name -> definition of every metric reported, printed under each table and stored in the JSON.
const std::vector<std::pair<std::string, std::string>>& metric_definitions();
std::string metric_definitions_markdown();

nlohmann::json to_json(const RequestTiming& r);
nlohmann::json to_json(const Summary& s);
nlohmann::json to_json(const PointMetrics& m);
// Reads back what to_json(PointMetrics) wrote (for --compare-stored); missing numbers read as NaN.
PointMetrics point_metrics_from_json(const nlohmann::json& j);

}  // namespace ds::tools
