// Closed-loop load generation, sweeps and interleaved A/B (see bench.h).
#include "tools/bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/http_client.h"
#include "tools/server_steps.h"

namespace ds::tools {

namespace {
using Clock = std::chrono::steady_clock;

// Prompt indices: disjoint per (concurrency, repeat) so repeats do not replay a prompt (prefix caches would
// flatter later repeats), identical across the two sides of an A/B.
int64_t index_base(int concurrency, int repeat) {
  return (static_cast<int64_t>(concurrency) << 32) + (static_cast<int64_t>(repeat + 1) << 20);
}
constexpr int kWarmupRepeat = 4000;  // a repeat number no measured pass reaches: warm-up prompts are unseen ones

RequestOptions resolve_model(const std::string& base_url, const BenchConfig& cfg) {
  RequestOptions r = cfg.request;
  if (r.model.empty()) {
    r.model = discover_model(base_url, cfg.api_key);
    if (r.model.empty()) r.model = "default";
  }
  return r;
}

void warm_up(const std::string& base_url, const BenchConfig& cfg, const RequestOptions& req, const Dataset& ds,
             int c, Progress& progress, const std::string& label) {
  const auto reqs = run_pass(base_url, cfg, req, ds, c, 1, index_base(c, kWarmupRepeat), &progress,
                             fmt::format("[{}] c={} warm-up", label, c));
  const auto failed = std::count_if(reqs.begin(), reqs.end(), [](const auto& r) { return !r.ok; });
  if (failed == static_cast<long>(reqs.size())) {
    DS_THROW("every warm-up request to {} failed; first error: {}", base_url, reqs.front().error);
  }
  if (failed) progress.message(fmt::format("warning: {}/{} warm-up requests to {} failed: {}", failed, reqs.size(), base_url,
                                           std::find_if(reqs.begin(), reqs.end(), [](const auto& r) { return !r.ok; })->error));
}

PointRun measure(const std::string& base_url, const std::string& label, const BenchConfig& cfg,
                 const RequestOptions& req, const Dataset& ds, int c, int repeat, Progress& progress) {
  PointRun run;
  run.label = label;
  run.base_url = base_url;
  run.concurrency = c;
  run.repeat = repeat;
  const int per_user = requests_per_user_for(c, cfg.requests_per_user);
  const auto steps0 = scrape_server_step_times(base_url, cfg.api_key);
  run.requests = run_pass(base_url, cfg, req, ds, c, per_user, index_base(c, repeat), &progress,
                          fmt::format("[{}] c={} repeat {}", label, c, repeat + 1));
  if (const auto steps1 = steps0 ? scrape_server_step_times(base_url, cfg.api_key) : std::nullopt) {
    run.server_step_ms = token_step_ms(*steps0, *steps1);
    run.server_decode_tokens = std::max<int64_t>(0, steps1->decode_tokens - steps0->decode_tokens);
  }
  run.metrics = compute_point_metrics(run.requests);
  run.tpot_token_ms = token_weighted_tpot_ms(run.requests);
  progress.finished(run);
  return run;
}
}  // namespace

double token_weighted_tpot_ms(const std::vector<RequestTiming>& reqs) {
  double ms = 0;
  int64_t tokens = 0;
  for (const auto& r : reqs) {
    if (!r.ok || r.output_tokens < 2 || !std::isfinite(r.latency_ms) || !std::isfinite(r.ttft_ms)) continue;
    ms += r.latency_ms - r.ttft_ms;
    tokens += r.output_tokens - 1;
  }
  return tokens > 0 ? ms / static_cast<double>(tokens) : kNaN;
}

int requests_per_user_for(int concurrency, int configured) {
  if (configured > 0) return configured;
  // 5 requests per user make the median stable; at c >= 256 a pass is long enough with 3.
  return concurrency >= 256 ? 3 : 5;
}

std::vector<int> parse_concurrency_list(const std::string& s) {
  std::vector<int> out;
  std::set<int> seen;
  size_t pos = 0;
  while (pos <= s.size()) {
    const auto comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CHECK(used == item.size() && !item.empty() && v >= 1, "concurrency list '{}': '{}' is not a positive integer", s, item);
    CHECK(seen.insert(v).second, "concurrency list '{}' repeats {}", s, v);
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Progress::Progress(FILE* out) : Progress(out, out && isatty(fileno(out)) != 0) {}
Progress::Progress(FILE* out, bool tty) : out_(out), tty_(tty && out) {}

void Progress::update(const std::string& what, int done, int failed, int total, double elapsed_s) {
  if (!tty_) return;  // logs and CI get one line per pass, not a stream of carriage returns
  std::fprintf(out_, "\r\033[K%s: %d/%d requests%s, %.1f s", what.c_str(), done, total,
               failed ? fmt::format(" ({} failed)", failed).c_str() : "", elapsed_s);
  std::fflush(out_);
  line_open_ = true;
}

void Progress::finished(const PointRun& run) {
  const auto& m = run.metrics;
  message(fmt::format("[{}] c={} repeat {}: {}/{} ok, tps/user {:.2f}, output {:.1f} tok/s, TTFT p50 {:.1f} ms, {:.1f} s",
                      run.label, run.concurrency, run.repeat + 1, m.ok, m.requests, m.tps_per_user, m.output_tps,
                      m.ttft_ms.median, m.duration_s));
}

void Progress::message(const std::string& line) {
  if (!out_) return;
  if (line_open_) std::fprintf(out_, "\r\033[K");
  line_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

std::vector<RequestTiming> run_pass(const std::string& base_url, const BenchConfig& cfg, const RequestOptions& req,
                                    const Dataset& ds, int users, int per_user, int64_t index_base,
                                    Progress* progress, const std::string& what) {
  CHECK_GE(users, 1);
  CHECK_GE(per_user, 1);
  std::vector<RequestTiming> out(static_cast<size_t>(users) * per_user);
  std::atomic<int> done{0}, failed{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(users);
  for (int u = 0; u < users; ++u) {
    threads.emplace_back([&, u] {
      HttpClient client(base_url, cfg.timeout_s, cfg.api_key);
      for (int k = 0; k < per_user; ++k) {
        const int64_t idx = index_base + static_cast<int64_t>(u) * per_user + k;
        const Prompt p = ds.get(idx);
        const auto body = build_request_body(p, cfg.endpoint, req);
        const double start_s = std::chrono::duration<double>(Clock::now() - t0).count();
        RequestTiming t = client.stream(cfg.endpoint, body);
        t.user = u;
        t.index = idx;
        t.start_s = start_s;
        if (t.input_tokens < 0) t.input_tokens = p.input_len;
        if (!t.ok) ++failed;
        out[static_cast<size_t>(u) * per_user + k] = std::move(t);
        ++done;
      }
    });
  }
  const int total = static_cast<int>(out.size());
  while (done.load() < total) {
    if (progress) progress->update(what, done.load(), failed.load(), total,
                                   std::chrono::duration<double>(Clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<PointRun> run_sweep(const std::string& base_url, const BenchConfig& cfg, Progress& progress,
                                const std::string& label, int repeats) {
  CHECK_GE(repeats, 1);
  const Dataset ds(cfg.dataset, cfg.endpoint);
  const RequestOptions req = resolve_model(base_url, cfg);
  std::vector<PointRun> runs;
  for (const int c : cfg.concurrencies) {
    if (cfg.warmup) warm_up(base_url, cfg, req, ds, c, progress, label);
    for (int r = 0; r < repeats; ++r) runs.push_back(measure(base_url, label, cfg, req, ds, c, r, progress));
  }
  return runs;
}

AbRun run_ab(const std::string& base_url, const std::string& cand_url, const BenchConfig& cfg, int repeats,
             const AbOptions& ab, Progress& progress) {
  CHECK_GE(repeats, 1);
  const Dataset ds(cfg.dataset, cfg.endpoint);
  const RequestOptions base_req = resolve_model(base_url, cfg);
  const RequestOptions cand_req = resolve_model(cand_url, cfg);
  AbRun out;
  for (const int c : cfg.concurrencies) {
    if (cfg.warmup) {
      warm_up(base_url, cfg, base_req, ds, c, progress, "base");
      warm_up(cand_url, cfg, cand_req, ds, c, progress, "cand");
    }
    for (int r = 0; r < repeats; ++r) {
      // ABBA order: whoever runs second in a pair may see a warmer (or more throttled) machine.
      const bool base_first = r % 2 == 0;
      for (int side = 0; side < 2; ++side) {
        const bool is_base = (side == 0) == base_first;
        if (is_base) {
          out.base.push_back(measure(base_url, "base", cfg, base_req, ds, c, r, progress));
        } else {
          out.cand.push_back(measure(cand_url, "cand", cfg, cand_req, ds, c, r, progress));
        }
      }
    }
    out.verdicts.push_back(judge_ab_point({c, tps_per_user_series(out.base, c), tps_per_user_series(out.cand, c)}, ab));
  }
  return out;
}

std::vector<double> tps_per_user_series(const std::vector<PointRun>& runs, int concurrency, const std::string& label) {
  std::vector<const PointRun*> sel;
  for (const auto& r : runs) {
    if (r.concurrency == concurrency && (label.empty() || r.label == label)) sel.push_back(&r);
  }
  std::sort(sel.begin(), sel.end(), [](const auto* a, const auto* b) { return a->repeat < b->repeat; });
  std::vector<double> v;
  for (const auto* r : sel) v.push_back(r->metrics.tps_per_user);
  return v;
}

}  // namespace ds::tools
