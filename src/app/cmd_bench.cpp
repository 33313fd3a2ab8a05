// `deltaserve bench` (load generator, sweeps, paired A/B, cross-run comparison) and the hidden
// `deltaserve fake-server` (a scripted OpenAI-compatible server that tests and sweeps start as a child).
#ifdef DELTASERVE_WITH_SERVER

#include <signal.h>

#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/error.h"
#include "tools/bench.h"
#include "tools/fake_server.h"
#include "tools/report.h"

namespace {

using namespace ds::tools;

struct BenchArgs {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "completions";
  std::string input_len = "128", output_len = "128", prompt_mode = "tokens", token_ids = "100:32000";
  std::string concurrency = "1";
  std::string extra_body;
  std::vector<std::string> ab;
  std::string compare_stored, stored_label;
  std::string out_json, out_plot, out_md;
  double drift_pct = 15;
  int repeats = 3;
  bool no_warmup = false;
  BenchConfig cfg;
  AbOptions ab_opts;
};

void add_bench_options(CLI::App* cmd, BenchArgs& a) {
  auto* base_url = cmd->add_option("--base-url", a.base_url, "Server to load (http://host:port)")->capture_default_str();
  cmd->add_option("--endpoint", a.endpoint, "completions (/v1/completions) or chat (/v1/chat/completions)")->capture_default_str();
  cmd->add_option("--model", a.cfg.request.model, "Model name to send (default: the first of GET /v1/models)");
  cmd->add_option("--api-key", a.cfg.api_key, "Bearer token for servers that want one");
  cmd->add_option("--dataset", a.cfg.dataset.path, "JSONL prompts ({\"prompt\": ...} or {\"messages\": ...}); default: random");
  cmd->add_option("--input-len", a.input_len, "Random prompt length: N or MIN:MAX (tokens; words in text mode)")->capture_default_str();
  cmd->add_option("--output-len", a.output_len, "max_tokens: N or MIN:MAX")->capture_default_str();
  cmd->add_option("--prompt-mode", a.prompt_mode, "tokens (token-id prompts) or text (random words, for servers without token-id prompts)")->capture_default_str();
  cmd->add_option("--token-ids", a.token_ids, "Range MIN:MAX random token ids are drawn from")->capture_default_str();
  cmd->add_option("--seed", a.cfg.dataset.seed, "Dataset seed")->capture_default_str();
  cmd->add_option("--concurrency", a.concurrency, "Concurrency sweep, e.g. 1,2,3,4,8,16 (one in-flight request per user)")->capture_default_str();
  cmd->add_option("--requests-per-user", a.cfg.requests_per_user, "Requests per user per pass (0: 5, or 3 at c >= 256)")->capture_default_str();
  cmd->add_flag("--no-warmup", a.no_warmup, "Skip the warm-up pass before each point");
  cmd->add_flag("--ignore-eos", a.cfg.request.ignore_eos, "Send ignore_eos: true and min_tokens = max_tokens (fixed output lengths)");
  cmd->add_option("--temperature", a.cfg.request.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--timeout", a.cfg.timeout_s, "Per-request timeout (s)")->capture_default_str();
  cmd->add_option("--extra-body", a.extra_body, "JSON object merged into every request body");
  cmd->add_option("--ab", a.ab, "Paired A/B: BASE_URL CAND_URL, measured interleaved at the same moment")
      ->expected(2)
      ->excludes(base_url);
  cmd->add_option("--repeats", a.repeats, "A/B repeats per point")->capture_default_str();
  cmd->add_option("--noise-floor", a.ab_opts.noise_floor_pct, "Smallest noise band (%)")->capture_default_str();
  cmd->add_option("--max-noise", a.ab_opts.max_noise_pct, "A side whose repeats spread more than this (%) makes the point an anomaly")->capture_default_str();
  cmd->add_option("--compare-stored", a.compare_stored, "Compare against a stored bench JSON (labelled CROSS-RUN)");
  cmd->add_option("--stored-label", a.stored_label, "Which run of the stored JSON (run, base, cand)");
  cmd->add_option("--drift-pct", a.drift_pct, "Band floor for cross-run comparisons (%)")->capture_default_str();
  cmd->add_option("--out-json", a.out_json, "Write every request's timings and the metrics as JSON");
  cmd->add_option("--out-plot", a.out_plot, "Write an SVG plot of tps/user and output tok/s against concurrency");
  cmd->add_option("--out-md", a.out_md, "Also write the Markdown report to a file");
}

void run_bench(BenchArgs& a) {
  BenchConfig& cfg = a.cfg;
  cfg.endpoint = parse_endpoint_kind(a.endpoint);
  cfg.dataset.input_len = parse_len_range(a.input_len, "--input-len");
  cfg.dataset.output_len = parse_len_range(a.output_len, "--output-len");
  cfg.dataset.prompt_mode = parse_prompt_mode(a.prompt_mode);
  const auto ids = parse_len_range(a.token_ids, "--token-ids");
  cfg.dataset.token_id_min = ids.min;
  cfg.dataset.token_id_max = ids.max;
  cfg.concurrencies = parse_concurrency_list(a.concurrency);
  cfg.warmup = !a.no_warmup;
  if (!a.extra_body.empty()) {
    cfg.request.extra = nlohmann::json::parse(a.extra_body, nullptr, false);
    CHECK(cfg.request.extra.is_object(), "--extra-body must be a JSON object");
  }
  CHECK(a.repeats >= 1, "--repeats must be >= 1");
  Progress progress(stderr);
  BenchReport rep;
  rep.cfg = cfg;
  rep.ab_opts = a.ab_opts;
  if (!a.ab.empty()) {
    rep.title = "deltaserve bench: paired A/B";
    rep.preamble = fmt::format("- base: {}\n- cand: {}\n- repeats per point: {}\n", a.ab[0], a.ab[1], a.repeats);
    add_ab_run(rep, run_ab(a.ab[0], a.ab[1], cfg, a.repeats, a.ab_opts, progress));
  } else {
    rep.title = "deltaserve bench";
    rep.preamble = fmt::format("- server: {}\n", a.base_url);
    rep.runs = run_sweep(a.base_url, cfg, progress);
  }
  if (!a.compare_stored.empty()) {
    const auto doc = nlohmann::json::parse(read_text_file(a.compare_stored), nullptr, false);
    CHECK(!doc.is_discarded(), "{}: invalid JSON", a.compare_stored);
    const auto stored = runs_from_json(doc, a.stored_label, a.compare_stored);
    std::vector<PointRun> current;
    const std::string mine = a.ab.empty() ? "run" : "cand";
    for (const auto& r : rep.runs) {
      if (r.label == mine) current.push_back(r);
    }
    rep.cross_opts = a.ab_opts;
    rep.cross_opts.noise_floor_pct = std::max(a.drift_pct, a.ab_opts.noise_floor_pct);
    rep.cross_source = fmt::format("{} ({})", a.compare_stored, doc.value("created_utc", "unknown date"));
    rep.cross_run = compare_runs(stored, current, rep.cross_opts);
  }
  const std::string md = render_markdown(rep);
  std::cout << md << std::flush;
  write_report_files(rep, a.out_md, a.out_json, a.out_plot);
  for (const auto& r : rep.runs) {
    if (r.metrics.ok == 0) {
      std::fprintf(stderr, "error: every request at c=%d (%s) failed; first error: %s\n", r.concurrency, r.label.c_str(),
                   r.requests.empty() ? "-" : r.requests.front().error.c_str());
      ds::app::exit_status() = 1;
      return;
    }
  }
}

void setup_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench", "Load generator against any OpenAI-compatible endpoint: concurrency sweeps, TTFT/TPOT/ITL/E2E, tps/user, paired A/B");
  add_bench_options(cmd, *a);
  cmd->callback([a] { run_bench(*a); });
}

// --- fake-server

struct FakeArgs {
  FakeServerOptions opt;
  bool no_usage = false, ignore_sigterm = false;
  double exit_after_ms = 0;
  int exit_code = 3;
  std::string answers;
  int wrong_every = 0;
};

void run_fake(FakeArgs& a) {
  a.opt.report_usage = !a.no_usage;
  if (!a.answers.empty()) a.opt.answer = make_gsm8k_oracle(a.answers, a.wrong_every);
  // Signals are taken synchronously by this thread: block them before the server's threads exist.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  if (a.ignore_sigterm) {
    ::signal(SIGTERM, SIG_IGN);  // for tests of the SIGKILL escalation
  } else {
    sigaddset(&set, SIGTERM);
  }
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  FakeServer server(a.opt);
  server.start();
  std::printf("fake-server listening on %s\n", server.base_url().c_str());
  std::fflush(stdout);
  if (a.exit_after_ms > 0) {
    const auto ns = static_cast<long>(a.exit_after_ms * 1e6);
    timespec ts{ns / 1000000000L, ns % 1000000000L};
    if (sigtimedwait(&set, nullptr, &ts) < 0) {
      std::fprintf(stderr, "fake-server: exiting with %d as asked (--exit-after-ms)\n", a.exit_code);
      std::fflush(stderr);
      std::_Exit(a.exit_code);
    }
  } else {
    int sig = 0;
    sigwait(&set, &sig);
  }
  server.stop();
}

void setup_fake(CLI::App& app) {
  auto a = std::make_shared<FakeArgs>();
  auto* cmd = app.add_subcommand("fake-server", "Scripted OpenAI-compatible server for tests (hidden)");
  cmd->group("");  // hidden from --help: a test double, not a product command
  cmd->add_option("--host", a->opt.host);
  cmd->add_option("--port", a->opt.port);
  cmd->add_option("--ttft-ms", a->opt.ttft_ms);
  cmd->add_option("--itl-ms", a->opt.itl_ms);
  cmd->add_option("--tokens-per-chunk", a->opt.tokens_per_chunk);
  cmd->add_option("--eos-after", a->opt.eos_after);
  cmd->add_option("--max-streams", a->opt.max_streams);
  cmd->add_option("--health-delay-ms", a->opt.health_delay_ms);
  cmd->add_option("--model", a->opt.model);
  cmd->add_flag("--no-usage", a->no_usage);
  cmd->add_flag("--ignore-sigterm", a->ignore_sigterm);
  cmd->add_option("--exit-after-ms", a->exit_after_ms, "Exit with --exit-code after this long (a server that dies)");
  cmd->add_option("--exit-code", a->exit_code);
  cmd->add_option("--answers", a->answers, "GSM8K JSONL: answer its questions with their reference solutions");
  cmd->add_option("--wrong-every", a->wrong_every, "Answer every K-th question of --answers wrongly");
  cmd->callback([a] { run_fake(*a); });
}

}  // namespace

DS_REGISTER_COMMAND(30, setup_bench);
DS_REGISTER_COMMAND(99, setup_fake);

#endif  // DELTASERVE_WITH_SERVER
