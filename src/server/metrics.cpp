// Prometheus text rendering of the server metrics (see metrics.h).
#include "server/metrics.h"

#include <tuple>

#include <fmt/format.h>

namespace ds::server {
namespace {

// Buckets in seconds. TTFT spans a queued prefill on a loaded server (up to a minute); TPOT spans a fast
// GPU decode step (a few ms) to a slow CPU one.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kTpotBuckets = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
                                          0.05,  0.075,  0.1,   0.15,   0.2,  0.3,   0.5,  1.0,   2.5};
const std::vector<double> kE2eBuckets = {0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0};

// Label values are endpoint paths we chose, but escape anyway: the format breaks on \ " and newlines.
std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics() : ttft_(kTtftBuckets), tpot_(kTpotBuckets), e2e_(kE2eBuckets) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generated_tokens_ += static_cast<uint64_t>(generated);
}

void Metrics::observe_ttft(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
}

void Metrics::observe_tpot(double s) {
  std::lock_guard lk(mu_);
  tpot_.observe(s);
}

void Metrics::observe_e2e(double s) {
  std::lock_guard lk(mu_);
  e2e_.observe(s);
}

void Metrics::count_disconnect() {
  std::lock_guard lk(mu_);
  ++disconnects_;
}

std::string Metrics::render(const EngineStats& st, const StepTimes& steps) const {
  std::lock_guard lk(mu_);
  std::string out;
  header(out, "deltaserve_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("deltaserve_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                       escape_label(key.first), key.second, n);
  header(out, "deltaserve_prompt_tokens_total", "counter", "Prompt tokens of accepted generation requests.");
  out += fmt::format("deltaserve_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "deltaserve_generation_tokens_total", "counter", "Tokens generated (stop tokens included).");
  out += fmt::format("deltaserve_generation_tokens_total {}\n", generated_tokens_);
  header(out, "deltaserve_client_disconnects_total", "counter",
         "Requests cancelled because the client went away before the end.");
  out += fmt::format("deltaserve_client_disconnects_total {}\n", disconnects_);
  header(out, "deltaserve_time_to_first_token_seconds", "histogram",
         "Request arrival to its first generated token (queueing and prefill included).");
  ttft_.render("deltaserve_time_to_first_token_seconds", out);
  header(out, "deltaserve_time_per_output_token_seconds", "histogram",
         "Per request: (last token time - first token time) / (generated tokens - 1).");
  tpot_.render("deltaserve_time_per_output_token_seconds", out);
  header(out, "deltaserve_e2e_request_latency_seconds", "histogram", "Request arrival to its last token.");
  e2e_.render("deltaserve_e2e_request_latency_seconds", out);
  header(out, "deltaserve_requests_running", "gauge", "Requests holding a state slot.");
  out += fmt::format("deltaserve_requests_running {}\n", st.running);
  header(out, "deltaserve_requests_waiting", "gauge", "Requests queued in the engine for a state slot.");
  out += fmt::format("deltaserve_requests_waiting {}\n", st.waiting);
  header(out, "deltaserve_state_slots_in_use", "gauge",
         "Sequence state slots (KDA state + MLA cache) in use.");
  out += fmt::format("deltaserve_state_slots_in_use {}\n", st.slots_in_use);
  header(out, "deltaserve_state_slots_total", "gauge", "Sequence state slots of the engine.");
  out += fmt::format("deltaserve_state_slots_total {}\n", st.max_seqs);
  header(out, "deltaserve_engine_step_seconds", "summary",
         "Time inside the engine's step, by kind: decode = a step that produced a token after some request's "
         "first (the tokens TPOT measures), prefill = the other steps.");
  for (const auto& [kind, n, sec] : {std::tuple{"decode", steps.decode_steps, steps.decode_seconds},
                                     std::tuple{"prefill", steps.prefill_steps, steps.prefill_seconds}}) {
    out += fmt::format("deltaserve_engine_step_seconds_sum{{kind=\"{}\"}} {:.9g}\n", kind, sec);
    out += fmt::format("deltaserve_engine_step_seconds_count{{kind=\"{}\"}} {}\n", kind, n);
  }
  header(out, "deltaserve_engine_decode_token_step_seconds", "summary",
         "Per decode token (a token after its request's first), the duration of the engine step that produced it: "
         "sum / count is the step time clients' tokens saw on average.");
  out += fmt::format("deltaserve_engine_decode_token_step_seconds_sum {:.9g}\n", steps.decode_token_seconds);
  out += fmt::format("deltaserve_engine_decode_token_step_seconds_count {}\n", steps.decode_tokens);
  return out;
}

}  // namespace ds::server
