// Markdown, JSON and plot data for bench results (see report.h).
#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/json_fields.h"
#include "tools/stats.h"

namespace ds::tools {

namespace {
std::string f1(double v) { return std::isfinite(v) ? fmt::format("{:.1f}", v) : "-"; }
std::string f2(double v) { return std::isfinite(v) ? fmt::format("{:.2f}", v) : "-"; }
std::string f3(double v) { return std::isfinite(v) ? fmt::format("{:.3f}", v) : "-"; }
std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:+.1f}%", v) : "-"; }

std::string ab_rows(const std::vector<AbPointResult>& points, bool paired) {
  std::string s = paired ? "| c | base tps/user | cand tps/user | delta (median of pairs) | noise band | per-repeat deltas | verdict |\n"
                           "|---|---|---|---|---|---|---|\n"
                         : "| c | stored tps/user | current tps/user | delta | band | verdict |\n|---|---|---|---|---|---|\n";
  for (const auto& p : points) {
    std::string verdict = p.verdict_text();
    if (!p.note.empty()) verdict += " (" + p.note + ")";
    if (paired) {
      std::string per;
      for (const double d : p.paired_delta_pct) per += (per.empty() ? "" : ", ") + pct(d);
      s += fmt::format("| {} | {} | {} | {} | ±{:.1f}% | {} | {} |\n", p.concurrency, f2(p.base_median), f2(p.cand_median),
                       pct(p.delta_pct), p.band_pct, per, verdict);
    } else {
      s += fmt::format("| {} | {} | {} | {} | ±{:.1f}% | {} |\n", p.concurrency, f2(p.base_median), f2(p.cand_median),
                       pct(p.delta_pct), p.band_pct, verdict);
    }
  }
  return s;
}
}  // namespace

std::string sweep_markdown(const std::vector<PointRun>& runs) {
  const bool labelled = std::any_of(runs.begin(), runs.end(), [](const auto& r) { return r.label != "run"; });
  // The engine-step columns only when some server exported its step times (a deltaserve server).
  const bool steps = std::any_of(runs.begin(), runs.end(), [](const auto& r) { return std::isfinite(r.server_step_ms); });
  std::string s = fmt::format("| {}c | repeat | requests ok/total | output tok/s | req/s | TTFT p50 (ms) | TPOT p50 (ms) | "
                              "ITL p50 (ms) | E2E p50 (ms) | **tps/user** |{}\n|{}---|---|---|---|---|---|---|---|---|---|{}\n",
                              labelled ? "server | " : "", steps ? " engine step (ms) | TPOT / step |" : "",
                              labelled ? "---|" : "", steps ? "---|---|" : "");
  for (const auto& r : runs) {
    const auto& m = r.metrics;
    s += fmt::format("| {}{} | {} | {}/{} | {} | {} | {} | {} | {} | {} | **{}** |{}\n", labelled ? r.label + " | " : "",
                     r.concurrency, r.repeat + 1, m.ok, m.requests, f1(m.output_tps), f2(m.request_rate),
                     f1(m.ttft_ms.median), f2(m.tpot_ms.median), f2(m.itl_ms.median), f1(m.e2e_ms.median),
                     f2(m.tps_per_user),
                     steps ? fmt::format(" {} | {} |", f2(r.server_step_ms), f3(r.tpot_token_ms / r.server_step_ms))
                           : "");
  }
  s += fmt::format("\nLatency detail (ms):\n\n| {}c | repeat | metric | mean | p50 | p90 | p99 |\n|{}---|---|---|---|---|---|---|\n",
                   labelled ? "server | " : "", labelled ? "---|" : "");
  for (const auto& r : runs) {
    const auto& m = r.metrics;
    const std::pair<const char*, const Summary*> rows[] = {
        {"TTFT", &m.ttft_ms}, {"TPOT", &m.tpot_ms}, {"ITL", &m.itl_ms}, {"E2E", &m.e2e_ms}};
    for (const auto& [name, sm] : rows) {
      s += fmt::format("| {}{} | {} | {} | {} | {} | {} | {} |\n", labelled ? r.label + " | " : "", r.concurrency,
                       r.repeat + 1, name, f2(sm->mean), f2(sm->median), f2(sm->p90), f2(sm->p99));
    }
  }
  int short_outputs = 0, chunk_counted = 0, failed = 0;
  for (const auto& r : runs) {
    short_outputs += r.metrics.short_outputs;
    chunk_counted += r.metrics.ok - r.metrics.counted_from_usage;
    failed += r.metrics.failed;
  }
  if (failed) s += fmt::format("\n**{} request(s) failed**; they are excluded from the latency metrics (see the JSON).\n", failed);
  if (short_outputs)
    s += fmt::format("\nNote: {} request(s) stopped before max_tokens (EOS); pass --ignore-eos for fixed output lengths.\n",
                     short_outputs);
  if (chunk_counted)
    s += fmt::format("\nNote: {} request(s) had no usage from the server; their output tokens are counted as chunks.\n",
                     chunk_counted);
  return s;
}

std::string ab_markdown(const std::vector<AbPointResult>& points, const AbOptions& opt) {
  std::string s = "Paired A/B (same moment, interleaved ABBA), metric: tps/user\n\n" + ab_rows(points, true);
  s += fmt::format(
      "\nEstimator: per repeat r, delta_r = 100 * (cand_r / base_r - 1); delta = median over repeats; noise band = "
      "max({:.1f}% floor, each side's (max - min) / median of per-repeat tps/user); |delta| <= band is parity. "
      "A point is an ANOMALY (verdict withheld, never a regression) when a repeat failed or a side's repeats spread "
      "more than {:.1f}%: re-run it.\n",
      opt.noise_floor_pct, opt.max_noise_pct);
  return s;
}

std::string cross_run_markdown(const std::vector<AbPointResult>& points, const AbOptions& opt,
                               const std::string& stored_source) {
  std::string s = fmt::format(
      "CROSS-RUN comparison against stored results ({}), metric: tps/user\n\n"
      "> WARNING: these numbers were not measured at the same moment. Drift of the same build between runs "
      "(7-15 % seen in production) can exceed the effect measured; the band's floor is {:.1f}% for that reason. "
      "Use --ab for a decision.\n\n",
      stored_source, opt.noise_floor_pct);
  return s + ab_rows(points, false);
}

std::vector<AbPointResult> compare_runs(const std::vector<PointRun>& stored, const std::vector<PointRun>& current,
                                        const AbOptions& opt) {
  std::set<int> cs;
  for (const auto& r : current) cs.insert(r.concurrency);
  std::vector<AbPointResult> out;
  AbOptions o = opt;
  o.paired = false;
  for (const int c : cs) {
    auto a = tps_per_user_series(stored, c), b = tps_per_user_series(current, c);
    if (a.empty() || b.empty()) continue;
    out.push_back(judge_ab_point({c, a, b}, o));
  }
  return out;
}

nlohmann::json runs_to_json(const std::vector<PointRun>& runs, bool with_requests) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : runs) {
    nlohmann::json j = {{"label", r.label}, {"base_url", r.base_url}, {"concurrency", r.concurrency},
                        {"repeat", r.repeat}, {"metrics", to_json(r.metrics)}};
    if (std::isfinite(r.tpot_token_ms)) j["tpot_token_ms"] = r.tpot_token_ms;
    if (std::isfinite(r.server_step_ms)) {
      j["server_step_ms"] = r.server_step_ms;
      j["server_decode_tokens"] = r.server_decode_tokens;
    }
    if (with_requests) {
      j["requests"] = nlohmann::json::array();
      for (const auto& q : r.requests) j["requests"].push_back(to_json(q));
    }
    arr.push_back(std::move(j));
  }
  return arr;
}

std::vector<PointRun> runs_from_json(const nlohmann::json& doc, const std::string& label, const std::string& source) {
  CHECK(doc.is_object() && doc.contains("runs") && doc["runs"].is_array(), "{}: not a deltaserve bench JSON (no \"runs\")", source);
  std::set<std::string> labels;
  for (const auto& r : doc["runs"]) labels.insert(r.value("label", "run"));
  std::string want = label;
  if (want.empty()) {
    CHECK(labels.size() == 1, "{} holds several runs ({}); pick one with --stored-label", source,
          fmt::format("{}", fmt::join(labels, ", ")));
    want = *labels.begin();
  }
  CHECK(labels.count(want), "{} has no run labelled '{}' (it has: {})", source, want, fmt::format("{}", fmt::join(labels, ", ")));
  std::vector<PointRun> out;
  for (const auto& r : doc["runs"]) {
    if (r.value("label", "run") != want) continue;
    PointRun p;
    p.label = want;
    p.base_url = r.value("base_url", "");
    p.concurrency = r.at("concurrency").get<int>();
    p.repeat = r.value("repeat", 0);
    p.metrics = point_metrics_from_json(r.at("metrics"));
    if (r.contains("tpot_token_ms") && r["tpot_token_ms"].is_number()) p.tpot_token_ms = r["tpot_token_ms"].get<double>();
    if (r.contains("server_step_ms") && r["server_step_ms"].is_number()) {
      p.server_step_ms = r["server_step_ms"].get<double>();
      p.server_decode_tokens = r.value("server_decode_tokens", int64_t{0});
    }
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json bench_config_to_json(const BenchConfig& cfg) {
  nlohmann::json per_user = nlohmann::json::object();
  for (const int c : cfg.concurrencies) per_user[std::to_string(c)] = requests_per_user_for(c, cfg.requests_per_user);
  return {{"endpoint", endpoint_name(cfg.endpoint)},
          {"dataset", describe_dataset(cfg.dataset, cfg.endpoint)},
          {"concurrencies", cfg.concurrencies},
          {"requests_per_user", per_user},
          {"warmup", cfg.warmup},
          {"ignore_eos", cfg.request.ignore_eos},
          {"temperature", cfg.request.temperature},
          {"model", cfg.request.model.empty() ? "(from /v1/models)" : cfg.request.model},
          {"timeout_s", cfg.timeout_s}};
}

nlohmann::json report_header(const std::string& tool, const BenchConfig& cfg) {
  nlohmann::json defs = nlohmann::json::object();
  for (const auto& [k, v] : metric_definitions()) defs[k] = v;
  return {{"tool", tool}, {"schema", 1}, {"created_utc", utc_now_iso()}, {"config", bench_config_to_json(cfg)},
          {"metric_definitions", defs}};
}

std::vector<PlotSeries> plot_series(const std::vector<PointRun>& runs) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int, std::pair<std::vector<double>, std::vector<double>>>> acc;
  for (const auto& r : runs) {
    if (!acc.count(r.label)) order.push_back(r.label);
    auto& [tu, tp] = acc[r.label][r.concurrency];
    tu.push_back(r.metrics.tps_per_user);
    tp.push_back(r.metrics.output_tps);
  }
  std::vector<PlotSeries> out;
  for (const auto& label : order) {
    PlotSeries s{label, {}};
    for (const auto& [c, v] : acc[label]) s.points.push_back({c, median(v.first), median(v.second)});
    out.push_back(std::move(s));
  }
  return out;
}

void add_ab_run(BenchReport& r, AbRun run) {
  r.runs = std::move(run.base);
  r.runs.insert(r.runs.end(), std::make_move_iterator(run.cand.begin()), std::make_move_iterator(run.cand.end()));
  r.ab = std::move(run.verdicts);
}

std::string render_markdown(const BenchReport& r) {
  std::string s = fmt::format("## {}\n\n", r.title);
  if (!r.preamble.empty()) s += r.preamble + "\n";
  s += fmt::format("Endpoint {}; dataset: {}; ignore_eos {}; temperature {}; warm-up {}; {} UTC.\n\n",
                   endpoint_name(r.cfg.endpoint), describe_dataset(r.cfg.dataset, r.cfg.endpoint), r.cfg.request.ignore_eos ? "on" : "off",
                   r.cfg.request.temperature, r.cfg.warmup ? "on" : "off", utc_now_iso());
  if (r.ab) s += ab_markdown(*r.ab, r.ab_opts) + "\n";
  if (r.cross_run) s += cross_run_markdown(*r.cross_run, r.cross_opts, r.cross_source) + "\n";
  s += sweep_markdown(r.runs) + "\n" + metric_definitions_markdown();
  return s;
}

nlohmann::json render_json(const BenchReport& r) {
  nlohmann::json j = report_header("deltaserve bench", r.cfg);
  j["title"] = r.title;
  j["runs"] = runs_to_json(r.runs);
  auto points = [](const std::vector<AbPointResult>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& p : v) a.push_back(to_json(p));
    return a;
  };
  if (r.ab) {
    j["ab"] = {{"estimator", "median of paired per-repeat deltas; band = max(floor, per-side min-max spread / median)"},
               {"noise_floor_pct", r.ab_opts.noise_floor_pct},
               {"max_noise_pct", r.ab_opts.max_noise_pct},
               {"points", points(*r.ab)}};
  }
  if (r.cross_run) {
    j["cross_run"] = {{"label", "CROSS-RUN: not same-moment; drift between runs (7-15 % seen in production) can "
                                "exceed the effect measured"},
                      {"stored", r.cross_source},
                      {"drift_floor_pct", r.cross_opts.noise_floor_pct},
                      {"points", points(*r.cross_run)}};
  }
  j.update(r.extra);
  return j;
}

std::string render_svg(const BenchReport& r) { return render_sweep_svg(plot_series(r.runs), r.title); }

void write_report_files(const BenchReport& r, const std::string& md_path, const std::string& json_path,
                        const std::string& svg_path) {
  if (!md_path.empty()) write_text_file(md_path, render_markdown(r));
  if (!json_path.empty()) write_text_file(json_path, report_json(render_json(r), 1) + "\n");
  if (!svg_path.empty()) write_text_file(svg_path, render_svg(r));
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void write_text_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  CHECK(f.good(), "cannot write {}", path);
  f << content;
  CHECK(f.good(), "error writing {}", path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CHECK(f.good(), "cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace ds::tools
