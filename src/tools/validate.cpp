// Qualification matrix runner: scheduling, stage execution, criteria, report (see validate.h).
#include "tools/validate.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/json_fields.h"
#include "tools/report.h"
#include "tools/sweep.h"

namespace ds::tools {

const char* stage_status_name(StageStatus s) {
  switch (s) {
    case StageStatus::kPass: return "PASS";
    case StageStatus::kFail: return "FAIL";
    case StageStatus::kNotRun: return "NOT RUN";
  }
  return "?";
}

namespace {
using Clock = std::chrono::steady_clock;

void run_tests_stage(const Stage& s, const std::string& prefix, StageResult& out) {
  ChildSpec spec;
  for (const auto& a : s.command) spec.argv.push_back(expand_placeholders(a, "127.0.0.1", 0));
  spec.env = s.env;
  spec.log_path = fmt::format("{}.stage{}.log", prefix, s.id);
  const auto t0 = Clock::now();
  ChildProcess child(spec);
  const auto st = child.wait(s.timeout_s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st) {
    child.stop(10);
    out.status = StageStatus::kFail;
    out.result = fmt::format("timed out after {:.0f} s", s.timeout_s);
  } else {
    out.status = *st == s.expect_exit ? StageStatus::kPass : StageStatus::kFail;
    out.result = fmt::format("{} in {:.1f} s", child.describe_status(), secs);
  }
  out.detail = fmt::format("Command: `{}` (log: {})\n", fmt::join(spec.argv, " "), spec.log_path);
  if (out.status == StageStatus::kFail) out.detail += "\nLast lines of the log:\n\n```\n" + child.log_tail(30) + "```\n";
  out.data = {{"command", spec.argv}, {"log", spec.log_path}, {"exit", st ? nlohmann::json(*st) : nlohmann::json(nullptr)},
              {"seconds", secs}};
}

void run_gsm8k_stage(const Stage& s, const std::string& prefix, const std::vector<int>& gpus, Progress& progress,
                     StageResult& out) {
  ManagedServer server(*s.server, s.server_name, fmt::format("{}.stage{}.{}.log", prefix, s.id, s.server_name), gpus);
  EvalOptions eo = s.eval;
  eo.base_url = server.base_url();
  const EvalResult r = run_gsm8k(eo, &progress);
  server.stop();
  std::string why;
  const bool pass = band_passes(r, *s.band, &why);
  out.status = pass ? StageStatus::kPass : StageStatus::kFail;
  out.result = fmt::format("strict {:.2f}%, flexible {:.2f}% (n={}){}", r.accuracy("strict-match"),
                           r.accuracy("flexible-extract"), r.n, r.errors ? fmt::format(", {} errors", r.errors) : "");
  const std::string records = fmt::format("{}.stage{}.gsm8k.jsonl", prefix, s.id);
  std::string lines;
  for (const auto& rec : r.records) lines += report_json(record_to_json(rec)) + "\n";
  write_text_file(records, lines);
  out.detail = eval_markdown(r, eo, &*s.band) + fmt::format("\nServer: `{}`; records: {}\n", server.describe(), records);
  out.data = {{"strict_match", r.accuracy("strict-match")}, {"flexible_extract", r.accuracy("flexible-extract")},
              {"n", r.n}, {"errors", r.errors}, {"band", why}, {"records", records}};
}

void run_perf_stage(const Stage& s, const std::string& prefix, const std::vector<int>& gpus, Progress& progress,
                    StageResult& out) {
  // A perf stage is a recipe run: the same server start/stop, sweep and A/B as `deltaserve sweep`.
  Recipe recipe;
  recipe.name = fmt::format("stage {}", s.id);
  recipe.description = s.name;
  recipe.server = s.server;
  recipe.base = s.base;
  recipe.cand = s.cand;
  recipe.bench = s.bench;
  SweepOptions opt;
  opt.run_ab = s.mode == StageMode::kAb;
  opt.log_prefix = fmt::format("{}.stage{}", prefix, s.id);
  opt.sweep_repeats = s.bench.repeats;
  opt.gpus = gpus;
  const BenchReport rep = run_recipe(recipe, opt, progress);
  StagePoints pts;
  pts.is_ab = rep.ab.has_value();
  if (rep.ab) {
    for (const auto& v : *rep.ab) {
      pts.verdicts[v.concurrency] = v;
      pts.base[v.concurrency] = tps_per_user_series(rep.runs, v.concurrency, "base");
      pts.cand[v.concurrency] = tps_per_user_series(rep.runs, v.concurrency, "cand");
      out.result += fmt::format("{}c{} {:+.1f}% {}", out.result.empty() ? "" : "; ", v.concurrency, v.delta_pct,
                                v.anomaly ? "ANOMALY" : verdict_name(v.verdict));
    }
  } else {
    for (const int c : rep.cfg.concurrencies) {
      pts.tps_user[c] = tps_per_user_series(rep.runs, c);
      out.result += fmt::format("{}c{} {:.2f}", out.result.empty() ? "tps/user " : ", ", c, median(pts.tps_user[c]));
    }
  }
  for (const auto& r : rep.runs) pts.failed_requests += r.metrics.failed;
  const std::string json_path = fmt::format("{}.stage{}.json", prefix, s.id);
  write_report_files(rep, "", json_path, fmt::format("{}.stage{}.svg", prefix, s.id));
  out.detail = render_markdown(rep);
  out.data = {{"report", json_path}, {"runs", runs_to_json(rep.runs, false)}};
  if (rep.ab) {
    out.data["ab"] = nlohmann::json::array();
    for (const auto& v : *rep.ab) out.data["ab"].push_back(to_json(v));
  }
  out.points = std::move(pts);
  out.measured = true;
}

void run_stage(const Stage& s, const std::string& prefix, const std::vector<int>& gpus, bool progress_lines,
               StageResult& out) {
  // Stages run side by side: plain lines only, a redrawn terminal line would be garbled.
  Progress progress(progress_lines ? stderr : nullptr, false);
  try {
    switch (s.mode) {
      case StageMode::kTests: run_tests_stage(s, prefix, out); break;
      case StageMode::kGsm8k: run_gsm8k_stage(s, prefix, gpus, progress, out); break;
      default: run_perf_stage(s, prefix, gpus, progress, out); break;
    }
  } catch (const std::exception& e) {
    out.status = StageStatus::kFail;
    out.measured = false;
    out.result = "error: " + std::string(e.what()).substr(0, 160);
    out.detail += fmt::format("\n**Error:**\n\n```\n{}\n```\n", e.what());
    out.data["error"] = e.what();
  }
}

std::string cell(std::string s) {
  for (auto& c : s) {
    if (c == '|') c = '/';
    if (c == '\n') c = ' ';
  }
  return s;
}
}  // namespace

ValidateReport run_matrix(const Matrix& m, const ValidateOptions& opt) {
  const auto t0 = Clock::now();
  auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::map<int, size_t> index;
  for (size_t i = 0; i < m.stages.size(); ++i) index[m.stages[i].id] = i;
  std::vector<StageResult> results(m.stages.size());
  std::vector<int> state(m.stages.size(), 0);  // 0 pending, 1 running, 2 finished
  std::vector<bool> gpu_busy(static_cast<size_t>(m.gpus), false);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::thread> threads;
  int running = 0;
  bool exclusive_running = false;

  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    bool all_done = true;
    for (size_t i = 0; i < m.stages.size(); ++i) {
      const Stage& s = m.stages[i];
      results[i].id = s.id;
      if (state[i] != 0) {
        all_done = all_done && state[i] == 2;
        continue;
      }
      all_done = false;
      bool blocked = false, ready = true;
      for (const int r : s.requires_ids) {
        const size_t ri = index.at(r);
        if (state[ri] != 2) {
          ready = false;
        } else if (results[ri].status != StageStatus::kPass) {
          blocked = true;
          results[i].result = fmt::format("requires stage {} ({})", r, stage_status_name(results[ri].status));
        }
      }
      if (blocked) {
        state[i] = 2;
        results[i].status = StageStatus::kNotRun;
        continue;
      }
      if (!ready) continue;
      const int free_gpus = static_cast<int>(std::count(gpu_busy.begin(), gpu_busy.end(), false));
      const bool fits = running < m.jobs && !exclusive_running && (!s.exclusive || running == 0) &&
                        (m.gpus == 0 || s.gpus() <= free_gpus);
      if (!fits) {
        if (s.exclusive) break;  // later stages wait too, or an exclusive stage could starve
        continue;
      }
      std::vector<int> ids;
      for (size_t g = 0, need = static_cast<size_t>(m.gpus ? s.gpus() : 0); g < gpu_busy.size() && need; ++g) {
        if (gpu_busy[g]) continue;
        gpu_busy[g] = true;
        ids.push_back(static_cast<int>(g));
        --need;
      }
      state[i] = 1;
      ++running;
      exclusive_running = exclusive_running || s.exclusive;
      results[i].gpus = ids;
      results[i].start_s = now_s();
      if (opt.progress_lines) {
        std::fprintf(stderr, "validate: stage %d (%s) started%s\n", s.id, stage_mode_name(s.mode),
                     ids.empty() ? "" : fmt::format(" on GPUs {}", fmt::join(ids, ",")).c_str());
      }
      threads.emplace_back([&, i, ids, r = results[i]]() mutable {
        run_stage(m.stages[i], opt.out_prefix, ids, opt.progress_lines, r);
        std::lock_guard<std::mutex> g(mu);
        r.end_s = now_s();
        results[i] = std::move(r);
        state[i] = 2;
        --running;
        if (m.stages[i].exclusive) exclusive_running = false;
        for (const int g : ids) gpu_busy[static_cast<size_t>(g)] = false;
        if (opt.progress_lines) {
          std::fprintf(stderr, "validate: stage %d finished (%s) after %.1f s\n", m.stages[i].id,
                       results[i].measured ? "measured" : stage_status_name(results[i].status),
                       results[i].end_s - results[i].start_s);
        }
        cv.notify_all();
      });
    }
    if (all_done) break;
    cv.wait(lk);
  }
  lk.unlock();
  for (auto& t : threads) t.join();

  // Criteria need every stage's measurements, so they are judged last.
  std::map<int, StagePoints> points;
  for (const auto& r : results) {
    if (r.points) points[r.id] = *r.points;
  }
  for (size_t i = 0; i < m.stages.size(); ++i) {
    StageResult& r = results[i];
    const Stage& s = m.stages[i];
    if (!r.measured) continue;
    const CriterionOutcome c = evaluate_criterion(s.criterion, *r.points, points, s.bench.ab);
    r.status = c.pass ? StageStatus::kPass : StageStatus::kFail;
    std::string timing;
    for (const auto& cl : s.criterion.clauses) {
      if (cl.kind != Clause::Kind::kDeltaVsStage && cl.kind != Clause::Kind::kEquals) continue;
      const StageResult& o = results[index.at(cl.stage)];
      const bool overlap = o.start_s >= 0 && o.start_s < r.end_s && r.start_s < o.end_s;
      timing += overlap ? fmt::format("Stage {} ran at the same moment as stage {}.\n", s.id, cl.stage)
                        : fmt::format("Stage {} did NOT overlap stage {} in time: drift between runs (7-15 % seen in "
                                      "production) can exceed the effect compared.\n", s.id, cl.stage);
    }
    r.detail = fmt::format("Criterion `{}`:\n\n```\n{}```\n{}\n", s.criterion.text, c.detail, timing) + r.detail;
    r.data["criterion"] = {{"text", s.criterion.text}, {"pass", c.pass}, {"detail", c.detail}};
  }

  ValidateReport rep;
  int n_pass = 0, n_fail = 0, n_not = 0;
  std::string md = fmt::format("# Qualification: {}\n\n{}{}Matrix: {}; {} UTC.\n\n", m.name, m.description,
                               m.description.empty() ? "" : "\n\n", m.source, utc_now_iso());
  md += "| # | stage | mode | env | concurrencies | criterion | result | status |\n|---|---|---|---|---|---|---|---|\n";
  nlohmann::json stages = nlohmann::json::array();
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const Stage& s = m.stages[i];
    const StageResult& r = results[i];
    n_pass += r.status == StageStatus::kPass;
    n_fail += r.status == StageStatus::kFail;
    n_not += r.status == StageStatus::kNotRun;
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | **{}** |\n", s.id, cell(s.name), stage_mode_name(s.mode),
                      cell(s.env_text()), s.concurrencies_text(), cell(s.criterion_text()), cell(r.result),
                      stage_status_name(r.status));
    stages.push_back({{"id", s.id}, {"name", s.name}, {"mode", stage_mode_name(s.mode)}, {"env", s.env_text()},
                      {"concurrencies", s.concurrencies_text()}, {"criterion", s.criterion_text()}, {"result", r.result},
                      {"status", stage_status_name(r.status)}, {"start_s", r.start_s}, {"end_s", r.end_s},
                      {"gpus", r.gpus}, {"data", r.data}});
  }
  rep.any_fail = n_fail > 0;
  md += fmt::format("\nOverall: **{}** ({} PASS, {} FAIL, {} NOT RUN)\n", rep.any_fail ? "FAIL" : "PASS", n_pass, n_fail, n_not);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const StageResult& r = results[i];
    if (r.detail.empty() && r.status == StageStatus::kNotRun) continue;
    md += fmt::format("\n### Stage {}: {} ({}) — {}\n\n{}", m.stages[i].id, m.stages[i].name,
                      stage_mode_name(m.stages[i].mode), stage_status_name(r.status), r.detail);
  }
  rep.markdown = md;
  rep.json = {{"tool", "deltaserve validate"}, {"created_utc", utc_now_iso()}, {"matrix", m.raw}, {"source", m.source},
              {"overall", rep.any_fail ? "FAIL" : "PASS"}, {"stages", stages}};
  rep.results = std::move(results);
  return rep;
}

}  // namespace ds::tools
