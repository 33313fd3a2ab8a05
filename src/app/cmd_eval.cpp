// `deltaserve eval gsm8k`: accuracy against any OpenAI-compatible endpoint, pass/fail against a band.
#ifdef DELTASERVE_WITH_SERVER

#include <iostream>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/error.h"
#include "tools/bench.h"
#include "tools/gsm8k.h"
#include "tools/json_fields.h"
#include "tools/report.h"

namespace {

using namespace ds::tools;

struct EvalArgs {
  EvalOptions opt;
  std::string endpoint = "completions", band, band_metric = "flexible-extract", out;
};

void run(EvalArgs& a) {
  a.opt.endpoint = parse_endpoint_kind(a.endpoint);
  std::optional<Band> band;
  if (!a.band.empty()) band = parse_band(a.band, a.band_metric);
  Progress progress(stderr);
  const EvalResult r = run_gsm8k(a.opt, &progress);
  if (!a.out.empty()) {
    std::string lines;
    for (const auto& rec : r.records) lines += ds::tools::report_json(record_to_json(rec)) + "\n";
    write_text_file(a.out, lines);
    progress.message("wrote " + a.out);
  }
  std::cout << eval_markdown(r, a.opt, band ? &*band : nullptr) << std::flush;
  if (band && !band_passes(r, *band, nullptr)) ds::app::exit_status() = 1;
}

void setup(CLI::App& app) {
  auto* ev = app.add_subcommand("eval", "Accuracy evaluations against an OpenAI-compatible endpoint");
  ev->require_subcommand(1);
  auto a = std::make_shared<EvalArgs>();
  auto* cmd = ev->add_subcommand("gsm8k", "GSM8K few-shot chain of thought: strict-match and flexible-extract, band check");
  cmd->add_option("--dataset-path", a->opt.dataset_path, "JSONL with question and answer (answer ends in '#### N')")->required();
  cmd->add_option("--base-url", a->opt.base_url, "Server (http://host:port)")->capture_default_str();
  cmd->add_option("--model", a->opt.model, "Model name (default: the first of GET /v1/models)");
  cmd->add_option("--api-key", a->opt.api_key, "Bearer token");
  cmd->add_option("--num-fewshot", a->opt.num_fewshot, "Few-shot examples per prompt")->capture_default_str();
  cmd->add_option("--fewshot-path", a->opt.fewshot_path,
                  "JSONL to draw the few-shot examples from (train split); default: the dataset's first ones, then not scored");
  cmd->add_option("--endpoint", a->endpoint, "completions or chat (few-shot as turns)")->capture_default_str();
  cmd->add_option("--concurrency", a->opt.concurrency, "Requests in flight")->capture_default_str();
  cmd->add_option("--limit", a->opt.limit, "Score only the first N questions (0: all)")->capture_default_str();
  cmd->add_option("--max-tokens", a->opt.max_tokens, "Generation limit per answer")->capture_default_str();
  cmd->add_option("--timeout", a->opt.timeout_s, "Per-request timeout (s)")->capture_default_str();
  cmd->add_option("--band", a->band, "Pass band CENTER:TOLERANCE in percent, e.g. 96.5:0.5 (exit 1 outside it)");
  cmd->add_option("--band-metric", a->band_metric, "flexible-extract or strict-match")->capture_default_str();
  cmd->add_option("--out", a->out, "Write every prompt, response and score as JSONL");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DS_REGISTER_COMMAND(50, setup);

#endif  // DELTASERVE_WITH_SERVER
