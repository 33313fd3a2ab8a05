// The load generator: closed-loop virtual users (one request in flight each), warm-up, concurrency sweeps,
// and interleaved paired A/B runs.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "tools/ab.h"
#include "tools/dataset.h"
#include "tools/metrics.h"
#include "tools/openai.h"

namespace ds::tools {

struct BenchConfig {
  std::string api_key;
  EndpointKind endpoint = EndpointKind::kCompletions;
  DatasetOptions dataset;
  RequestOptions request;             // model "" = ask each server's /v1/models
  std::vector<int> concurrencies = {1};
  int requests_per_user = 0;          // 0 = 5 per user, 3 per user at c >= 256
  bool warmup = true;                 // one request per user before each point's first measured pass
  double timeout_s = 600;             // per request
};

// Sum of (latency - TTFT) / sum of (output tokens - 1) over ok requests with 2 or more tokens; NaN if none.
double token_weighted_tpot_ms(const std::vector<RequestTiming>& reqs);

// Requests each virtual user sends in one measured pass.
int requests_per_user_for(int concurrency, int configured);
// Parses "1,2,4,8" (positive, strictly increasing not required, duplicates rejected).
std::vector<int> parse_concurrency_list(const std::string& s);

// One measured pass at one concurrency on one server.
struct PointRun {
  std::string label;   // "run", or "base" / "cand" in A/B
  std::string base_url;
  int concurrency = 0;
  int repeat = 0;      // 0-based
  PointMetrics metrics;
  std::vector<RequestTiming> requests;
  // A deltaserve server's step time during the pass as its decode tokens saw it (server_steps.h: read from
  // /metrics before and after) and the decode tokens counted; NaN / 0 for a server without those metrics.
  double server_step_ms = kNaN;
  int64_t server_decode_tokens = 0;
  // The clients' TPOT weighted the same way: sum of (latency - TTFT) / sum of (output tokens - 1) over the ok
  // requests with 2 or more tokens. tpot_token_ms / server_step_ms - 1 is what serving adds per token.
  double tpot_token_ms = kNaN;
};

// Terminal progress on stderr: a redrawn line on a tty, one line per finished pass otherwise; nothing when
// `out` is null.
class Progress {
 public:
  explicit Progress(FILE* out = stderr);  // detects isatty(fileno(out))
  Progress(FILE* out, bool tty);
  void update(const std::string& what, int done, int failed, int total, double elapsed_s);
  void finished(const PointRun& run);
  void message(const std::string& line);
  bool tty() const { return tty_; }

 private:
  FILE* out_;
  bool tty_;
  bool line_open_ = false;
};

// Runs one pass: `users` threads, each sending `per_user` requests back to back with prompts
// index_base + user * per_user + k. Returns every request's timings (start_s relative to the pass start).
std::vector<RequestTiming> run_pass(const std::string& base_url, const BenchConfig& cfg, const RequestOptions& req,
                                    const Dataset& ds, int users, int per_user, int64_t index_base,
                                    Progress* progress, const std::string& what);

// Single-server sweep: for each concurrency, warm-up then `repeats` measured passes.
std::vector<PointRun> run_sweep(const std::string& base_url, const BenchConfig& cfg, Progress& progress,
                                const std::string& label = "run", int repeats = 1);

struct AbRun {
  std::vector<PointRun> base, cand;        // every repeat of every point
  std::vector<AbPointResult> verdicts;     // one per concurrency
};
// Paired A/B: for each concurrency, R repeats interleaved ABBA (base-cand, cand-base, ...) so neither side
// always runs second; both sides get the same prompts for the same repeat.
AbRun run_ab(const std::string& base_url, const std::string& cand_url, const BenchConfig& cfg, int repeats,
             const AbOptions& ab, Progress& progress);

// Per-repeat tps/user at one concurrency (of one label; "" = any), in repeat order.
std::vector<double> tps_per_user_series(const std::vector<PointRun>& runs, int concurrency,
                                        const std::string& label = "");

}  // namespace ds::tools
