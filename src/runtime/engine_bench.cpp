// Offline engine benchmark (see engine_bench.h).
#include "runtime/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ds {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::vector<int32_t> random_prompt(int len, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = tok(rng);
  return p;
}

// Adds `n` requests and steps until the engine is idle; returns nothing (warm-up: graph capture, plan caches).
void warm_up(Engine& engine, int n, int input_len, int steps, std::mt19937_64& rng) {
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = random_prompt(input_len, engine.config().vocab_size, rng);
    r.sampling.max_tokens = steps;
    r.sampling.ignore_eos = true;
    engine.add_request(std::move(r));
  }
  while (engine.has_work()) engine.step();
}

}  // namespace

std::vector<EngineBenchRow> run_engine_bench(Engine& engine, const EngineBenchOptions& o, const StepProfileFn& profile) {
  if (o.input_len < 1 || o.output_len < 1) DS_THROW("bench-engine: input and output lengths must be >= 1");
  if (engine.has_work()) DS_THROW("bench-engine: the engine must be idle");
  const ModelConfig& cfg = engine.config();
  std::vector<EngineBenchRow> rows;
  for (int C : o.concurrency) {
    if (C < 1) DS_THROW("bench-engine: concurrency {} must be >= 1", C);
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(C));
    if (o.warmup_steps > 0) warm_up(engine, C, std::min(o.input_len, 16), o.warmup_steps, rng);

    struct Track {
      Clock::time_point added, first, last;
      int generated = 0;
    };
    std::unordered_map<RequestId, Track> reqs;
    const auto t_start = Clock::now();
    for (int i = 0; i < C; ++i) {
      Request r;
      r.prompt = random_prompt(o.input_len, cfg.vocab_size, rng);
      r.sampling.max_tokens = o.output_len;
      r.sampling.ignore_eos = true;
      const RequestId id = engine.add_request(std::move(r));
      reqs[id].added = Clock::now();
    }
    int with_first = 0, finished = 0;
    std::vector<double> steady_ms;
    std::map<std::string, std::vector<double>> steady_cat;
    int64_t generated_total = 0;
    while (engine.has_work()) {
      // Steady decode: every request already has its first token and none has finished yet.
      const bool steady = with_first == C && finished == 0;
      const auto t0 = Clock::now();
      const std::vector<RequestOutput> outs = engine.step();
      const auto t1 = Clock::now();
      const CategoryMs cat = profile ? profile() : CategoryMs{};
      if (steady) {
        steady_ms.push_back(ms_between(t0, t1));
        for (const auto& [k, v] : cat) steady_cat[k].push_back(v);
      }
      for (const RequestOutput& out : outs) {
        auto it = reqs.find(out.id);
        if (it == reqs.end()) continue;
        Track& t = it->second;
        if (!out.new_tokens.empty()) {
          if (t.generated == 0) {
            t.first = t1;
            ++with_first;
          }
          t.last = t1;
          t.generated += static_cast<int>(out.new_tokens.size());
          generated_total += static_cast<int64_t>(out.new_tokens.size());
        }
        if (out.finished) ++finished;
      }
    }
    const double wall_ms = ms_between(t_start, Clock::now());

    EngineBenchRow row;
    row.concurrency = C;
    row.requests = C;
    std::vector<double> ttft, tpot;
    for (const auto& [id, t] : reqs) {
      if (t.generated == 0) continue;
      ttft.push_back(ms_between(t.added, t.first));
      if (t.generated > 1) tpot.push_back(ms_between(t.first, t.last) / (t.generated - 1));
    }
    row.ttft_ms_median = median(ttft);
    row.ttft_ms_max = ttft.empty() ? 0.0 : *std::max_element(ttft.begin(), ttft.end());
    row.tpot_ms_median = median(tpot);
    row.tps_user = row.tpot_ms_median > 0 ? 1000.0 / row.tpot_ms_median : 0.0;
    row.tps_total = wall_ms > 0 ? generated_total * 1000.0 / wall_ms : 0.0;
    row.decode_steps = static_cast<int>(steady_ms.size());
    row.decode_step_ms_median = median(steady_ms);
    for (const auto& [k, v] : steady_cat) row.breakdown_ms[k] = median(v);
    DecodeBytesOptions bo = o.bytes;
    bo.concurrency = C;
    bo.context = o.input_len + o.output_len / 2;  // the mean context over the decode phase
    row.bound_ms = decode_step_bytes(cfg, bo).total() / o.copy_bandwidth * 1e3;
    row.pct_of_bound = row.decode_step_ms_median > 0 ? 100.0 * row.bound_ms / row.decode_step_ms_median : 0.0;
    rows.push_back(row);
    if (o.progress)
      o.progress(fmt::format("concurrency {:>3}: TTFT {:.1f} ms, TPOT {:.3f} ms, {:.1f} tps/user, step {:.3f} ms "
                             "({:.0f} % of the {:.3f} ms bound)",
                             C, row.ttft_ms_median, row.tpot_ms_median, row.tps_user, row.decode_step_ms_median,
                             row.pct_of_bound, row.bound_ms));
  }
  return rows;
}

std::string engine_bench_markdown(const std::vector<EngineBenchRow>& rows) {
  std::vector<std::string> cats;
  for (const auto& r : rows)
    for (const auto& [k, v] : r.breakdown_ms)
      if (std::find(cats.begin(), cats.end(), k) == cats.end()) cats.push_back(k);
  std::string s = "| conc | TTFT p50 ms | TTFT max ms | TPOT ms | tps/user | tps total | decode step ms | bound ms | % of bound |";
  for (const auto& c : cats) s += fmt::format(" {} ms |", c);
  s += "\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|";
  for (size_t i = 0; i < cats.size(); ++i) s += "---:|";
  s += "\n";
  for (const auto& r : rows) {
    s += fmt::format("| {} | {:.1f} | {:.1f} | {:.3f} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.0f} |", r.concurrency,
                     r.ttft_ms_median, r.ttft_ms_max, r.tpot_ms_median, r.tps_user, r.tps_total,
                     r.decode_step_ms_median, r.bound_ms, r.pct_of_bound);
    for (const auto& c : cats) {
      auto it = r.breakdown_ms.find(c);
      s += it == r.breakdown_ms.end() ? " - |" : fmt::format(" {:.3f} |", it->second);
    }
    s += "\n";
  }
  return s;
}

std::string engine_bench_json(const std::vector<EngineBenchRow>& rows, const std::string& label) {
  nlohmann::json j;
  j["label"] = label;
  j["rows"] = nlohmann::json::array();
  for (const auto& r : rows) {
    j["rows"].push_back({{"concurrency", r.concurrency},
                         {"ttft_ms_median", r.ttft_ms_median},
                         {"ttft_ms_max", r.ttft_ms_max},
                         {"tpot_ms_median", r.tpot_ms_median},
                         {"tps_user", r.tps_user},
                         {"tps_total", r.tps_total},
                         {"decode_step_ms_median", r.decode_step_ms_median},
                         {"decode_steps", r.decode_steps},
                         {"bound_ms", r.bound_ms},
                         {"pct_of_bound", r.pct_of_bound},
                         {"breakdown_ms", r.breakdown_ms}});
  }
  return j.dump(2);
}

}  // namespace ds
