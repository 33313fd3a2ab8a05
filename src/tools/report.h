// Bench reports: Markdown tables (sweep, A/B, cross-run), the JSON document with every request's timings,
// the plot series, and reading stored results back for cross-run comparisons.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tools/ab.h"
#include "tools/bench.h"
#include "tools/svg_plot.h"

namespace ds::tools {

// Summary table (one row per pass) and a latency-detail table (mean, p50, p90, p99 of TTFT, TPOT, ITL, E2E).
std::string sweep_markdown(const std::vector<PointRun>& runs);
// One row per concurrency: medians of both sides, delta, band, per-repeat deltas, verdict; plus the estimator.
std::string ab_markdown(const std::vector<AbPointResult>& points, const AbOptions& opt);
// The cross-run table with its drift warning.
std::string cross_run_markdown(const std::vector<AbPointResult>& points, const AbOptions& opt,
                               const std::string& stored_source);

// Compares `current` against `stored` per concurrency (unpaired; the band's floor is opt.noise_floor_pct,
// which callers set to the cross-run drift). Concurrencies present in only one of them are skipped.
std::vector<AbPointResult> compare_runs(const std::vector<PointRun>& stored, const std::vector<PointRun>& current,
                                        const AbOptions& opt);

nlohmann::json runs_to_json(const std::vector<PointRun>& runs, bool with_requests = true);
// Reads "runs" of a stored bench JSON; `label` selects one label ("" = the only one, or an error listing them).
std::vector<PointRun> runs_from_json(const nlohmann::json& doc, const std::string& label, const std::string& source);
nlohmann::json bench_config_to_json(const BenchConfig& cfg);
// The top-level document: tool, time, config, metric definitions; callers add "runs", "ab", "cross_run".
nlohmann::json report_header(const std::string& tool, const BenchConfig& cfg);

// One series per label, median over repeats per concurrency.
std::vector<PlotSeries> plot_series(const std::vector<PointRun>& runs);

// Everything one report holds; rendered as Markdown (stdout), JSON and SVG by the functions below.
struct BenchReport {
  std::string title;
  std::string preamble;                 // Markdown placed under the title (servers, commands, knobs)
  BenchConfig cfg;
  std::vector<PointRun> runs;           // every pass, with every request
  std::optional<std::vector<AbPointResult>> ab;
  AbOptions ab_opts;
  std::optional<std::vector<AbPointResult>> cross_run;
  AbOptions cross_opts;
  std::string cross_source;
  nlohmann::json extra = nlohmann::json::object();  // merged into the JSON (recipe, servers)
};
// Moves an A/B run's passes (base, then cand) and verdicts into the report.
void add_ab_run(BenchReport& r, AbRun run);
std::string render_markdown(const BenchReport& r);
nlohmann::json render_json(const BenchReport& r);
std::string render_svg(const BenchReport& r);
// Writes whichever paths are non-empty.
void write_report_files(const BenchReport& r, const std::string& md_path, const std::string& json_path,
                        const std::string& svg_path);

std::string utc_now_iso();
void write_text_file(const std::string& path, const std::string& content);
std::string read_text_file(const std::string& path);

}  // namespace ds::tools
