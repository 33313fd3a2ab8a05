// `deltaserve bench-engine`: the offline engine benchmark (runtime/engine_bench.h) on the GPU engine, or on the CPU
// reference engine where there is no GPU: full-size random weights generated in GPU memory, so no download.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "app/parallel_cli.h"
#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "model/cpu_model.h"
#include "runtime/cpu_engine.h"
#include "runtime/cuda_model.h"  // quantize_options, set_weights_precision (types only without CUDA)
#include "runtime/engine_bench.h"
#include "runtime/model_files.h"
#include "runtime/op_ablation.h"
#include "runtime/parallel/driver_engine.h"
#include "runtime/parallel/worker_loop.h"
#include "runtime/scheduler.h"
#if defined(DELTASERVE_WITH_CUDA)
#include "runtime/cuda_engine.h"
#endif

namespace {

struct Args {
  std::string model;
  bool random_weights = false;
  std::string preset = "kimi-linear-48b-a3b";
  int layers = 0;
  std::string quantize = "none";
  std::string device = "auto";
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int input_len = 1024, output_len = 256;
  int max_batch_tokens = ds::kDefaultMaxBatchTokens;
  int warmup_steps = 4;
  bool no_graphs = false;
  bool breakdown = false;
  std::vector<std::string> ablate;  // benchmarks of the ops' graph-mode cost (runtime/op_ablation.h)
  uint64_t seed = 1;
  double copy_gbs = 0;  // the bound's bandwidth; 0: measured on the GPU at start
  std::string md, json, label;
  ds::app::ParallelArgs parallel;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) DS_THROW("bench-engine: cannot write {}", path);
  f << text;
}

std::vector<ds::EngineBenchRow> run_cpu(const Args& a, ds::EngineBenchOptions o) {
  ds::ModelConfig cfg;
  ds::WeightSet w;
  if (a.random_weights) {
    cfg = ds::preset_config(a.preset, a.layers);
    w = ds::random_weights(cfg, a.seed);
  } else {
    ds::LoadedModel m = ds::load_model(a.model);
    cfg = m.config;
    w = std::move(m.weights);
  }
  auto model = std::make_shared<const ds::CpuModel>(cfg, w, ds::CpuModelOptions::from_env());
  ds::CpuEngineOptions eo;
  eo.max_seqs = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  eo.max_prefill_tokens = a.max_batch_tokens;
  ds::CpuEngine engine(model, eo);
  std::fprintf(stderr, "bench-engine: cpu reference engine (fp32), %d layers\n", cfg.num_hidden_layers);
  return ds::run_engine_bench(engine, o);
}

#if defined(DELTASERVE_WITH_CUDA)
// Per-op GPU time of the profiled decode-only steps, per number of decoding sequences: which kernels each
// category's time is made of (the table --breakdown appends).
class DecodeOpTable {
 public:
  void add(const ds::StepProfile& f) {
    if (!f.timed || f.prefill_tokens > 0 || f.num_decodes == 0) return;
    Entry& e = by_seqs_[f.num_decodes];
    e.steps += 1;
    for (const auto& op : f.ops) {
      auto [it, fresh] = e.ops.try_emplace(op.name);
      if (fresh) e.order.push_back(op.name);
      it->second.category = op.category;
      it->second.ms += op.ms;
      it->second.calls += op.calls;
    }
  }
  std::string markdown(const std::vector<int>& concurrency) const {
    std::string md;
    for (int c : concurrency) {
      auto it = by_seqs_.find(c);
      if (it == by_seqs_.end()) continue;
      const Entry& e = it->second;
      std::vector<std::string> names = e.order;
      std::stable_sort(names.begin(), names.end(),
                       [&](const std::string& x, const std::string& y) { return e.ops.at(x).ms > e.ops.at(y).ms; });
      double total = 0;
      for (const auto& n : names) total += e.ops.at(n).ms;
      md += fmt::format("\nPer-op GPU time per decode step, concurrency {} (mean of {} profiled steps, eager):\n\n", c,
                        e.steps);
      md += "| op | category | calls/step | us/step | % of step |\n|---|---|---|---|---|\n";
      for (const auto& n : names) {
        const Acc& o = e.ops.at(n);
        md += fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f} % |\n", n, o.category, double(o.calls) / e.steps,
                          1e3 * o.ms / e.steps, total > 0 ? 100.0 * o.ms / total : 0.0);
      }
      md += fmt::format("| total | | | {:.1f} | |\n", 1e3 * total / e.steps);
    }
    return md;
  }

 private:
  struct Acc {
    std::string category;
    double ms = 0;
    long calls = 0;
  };
  struct Entry {
    int steps = 0;
    std::vector<std::string> order;
    std::map<std::string, Acc> ops;
  };
  std::map<int, Entry> by_seqs_;
};

// nullopt on a worker rank (it only followed rank 0's steps).
// o.copy_bandwidth: --copy-gbs, else a copy measured here on this rank's GPU (after the weights, before the engine
// takes its pools), so "% of bound" is against the card at hand, not the H200's constant; *copy_source says which.
std::optional<std::vector<ds::EngineBenchRow>> run_cuda(const Args& a, ds::EngineBenchOptions& o,
                                                        ds::app::ParallelRole& role, std::string* op_md,
                                                        std::string* copy_source) {
  ds::DeviceModelOptions mo = ds::quantize_options(a.quantize == "fp8");
  std::shared_ptr<const ds::DeviceModel> model;
  ds::CudaEngineOptions base;  // a rank: its group; mo: its slice of the model
  auto join = [&](const ds::ModelConfig& cfg) {
    ds::app::join_group("bench-engine", role, cfg);
    if (role.parallel()) ds::app::configure_rank_engine(base, mo, role.group, role.spec);
  };
  if (a.random_weights) {
    const ds::ModelConfig cfg = ds::preset_config(a.preset, a.layers);
    join(cfg);
    model = ds::random_device_model(cfg, a.seed, mo);
  } else {
    ds::LoadedModel m = ds::load_model(a.model);
    join(m.config);
    model = ds::upload_model(m.config, m.weights, mo);
  }
  std::fprintf(stderr, "bench-engine: cuda engine, %d layers, weights %.2f GB (%s)\n",
               model->config.num_hidden_layers, model->bytes / 1e9, ds::weights_precision(o.bytes).c_str());
  if (a.copy_gbs > 0) {
    o.copy_bandwidth = a.copy_gbs * 1e9;
    *copy_source = " (--copy-gbs)";
  } else if (const double bw = ds::cuda_copy_bandwidth(); bw > 0) {
    o.copy_bandwidth = bw;
    *copy_source = " (device copy, measured at start)";
    std::fprintf(stderr, "bench-engine: device-to-device copy %.0f GB/s (the bound's bandwidth)\n", bw / 1e9);
  } else {
    LOG_WARN("bench-engine: the copy bandwidth could not be measured (2 GiB not free?); the bound uses {:.0f} GB/s",
                o.copy_bandwidth / 1e9);
  }
  const int max_c = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  auto make = [&](bool profile) {
    ds::CudaEngineOptions eo = base;
    eo.max_seqs = max_c;
    eo.max_batch_tokens = std::max(a.max_batch_tokens, max_c);
    eo.max_model_len = a.input_len + a.output_len + 64;
    eo.cuda_graphs = !a.no_graphs && !profile;
    eo.profile = profile;
    eo.ablate = a.ablate;
    eo.seed = a.seed;
    return std::make_unique<ds::CudaEngine>(model, eo);
  };
  std::vector<ds::EngineBenchRow> rows;
  {
    auto engine = make(false);
    if (!role.driver()) {
      ds::parallel::worker_loop(*engine, *role.group);
      return std::nullopt;
    }
    if (role.parallel()) {
      ds::parallel::DriverOptions dopt;
      dopt.engine_seed = a.seed;
      auto driver = ds::parallel::make_driver_engine(*engine, *role.group, dopt);
      rows = ds::run_engine_bench(*driver, o);
      driver->shutdown();
    } else {
      rows = ds::run_engine_bench(*engine, o);
    }
  }
  if (a.breakdown) {
    // Per-category GPU times need eager, event-timed steps: a second, shorter pass without graphs.
    auto engine = make(true);
    ds::EngineBenchOptions po = o;
    po.output_len = std::min(o.output_len, 32);
    po.progress = nullptr;
    const ds::CudaEngine* e = engine.get();
    DecodeOpTable table;
    const auto prof = ds::run_engine_bench(*engine, po, [e, &table] {
      table.add(e->last_step().forward);
      return e->last_step_categories();
    });
    for (size_t i = 0; i < rows.size() && i < prof.size(); ++i) rows[i].breakdown_ms = prof[i].breakdown_ms;
    *op_md = table.markdown(o.concurrency);
  }
  return rows;
}
#endif

void run(const Args& a) {
  ds::knobs::validate_all();
  if (a.concurrency.empty()) DS_THROW("bench-engine: --concurrency needs at least one value");
  auto role = ds::app::start_parallel("bench-engine", a.parallel, a.device);
  if (!role) return;  // this process was the launcher
  if (role->parallel() && !a.ablate.empty())
    DS_THROW("bench-engine: --ablate is for one GPU (skipping ops around a group's collectives proves nothing); "
             "run it with --tp 1 --ep 1");
  if (role->parallel() && a.breakdown)
    DS_THROW("bench-engine: --breakdown runs a second, profiled engine, which a parallel group does not have yet; "
             "run it with --tp 1 --ep 1");
  if (auto why = ds::ablation_problem(a.ablate)) DS_THROW("bench-engine: {}", *why);
  ds::EngineBenchOptions o;
  o.concurrency = a.concurrency;
  o.input_len = a.input_len;
  o.output_len = a.output_len;
  o.seed = a.seed;
  o.warmup_steps = a.warmup_steps;
  ds::set_weights_precision(o.bytes, ds::quantize_options(a.quantize == "fp8"));  // the bound, the weights line
  o.progress = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  const bool gpu = ds::cuda_device_available();
  std::string device = a.device == "auto" ? (gpu ? "cuda" : "cpu") : a.device;
  std::vector<ds::EngineBenchRow> rows;
  std::string op_md;  // --breakdown on the GPU: per-op table
  std::string copy_source = " (the H200's, targets.md)";  // the bound's bandwidth, unless run_cuda set another
  if (device == "cuda") {
#if defined(DELTASERVE_WITH_CUDA)
    if (!gpu) DS_THROW("bench-engine: --device cuda but no CUDA device is visible");
    auto r = run_cuda(a, o, *role, &op_md, &copy_source);
    if (!r) return;  // a worker rank: rank 0 reports
    rows = std::move(*r);
#else
    DS_THROW("bench-engine: this build has no CUDA support (--device cpu runs the reference engine)");
#endif
  } else {
    if (a.quantize != "none") DS_THROW("bench-engine: --quantize {} needs --device cuda", a.quantize);
    if (!a.ablate.empty()) DS_THROW("bench-engine: --ablate needs --device cuda");
    rows = run_cpu(a, o);
  }
  std::string md = fmt::format("weights: {}; bound at {:.0f} GB/s{}\n\n", ds::weights_precision(o.bytes),
                               o.copy_bandwidth / 1e9, copy_source) +
                   ds::engine_bench_markdown(rows) + op_md;
  if (!a.ablate.empty())
    md = fmt::format("ABLATED ({} skipped in every step: outputs are wrong; compare step times only)\n\n{}",
                     fmt::join(a.ablate, ","), md);
  std::printf("\n%s", md.c_str());
  std::printf("TTFT: add_request -> end of the step that returned the first token (all requests added at once).\n"
              "TPOT: (last token - first token) / (tokens - 1), median over requests; tps/user = 1000 / TPOT.\n"
              "decode step: median step time while every request decodes; bound: bytes of that step (weights, "
              "experts touched, KDA/MLA state) / %.0f GB/s%s.\n",
              o.copy_bandwidth / 1e9, copy_source.c_str());
  if (!a.md.empty()) write_file(a.md, md);
  if (!a.json.empty()) write_file(a.json, ds::engine_bench_json(rows, a.label.empty() ? device : a.label));
}

void setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "bench-engine",
      "Offline engine benchmark: fixed input/output lengths at each concurrency, straight through the engine\n"
      "(no HTTP). Reports TTFT, TPOT, tps/user, the steady decode step time and its % of the weight-streaming\n"
      "bound; --breakdown adds GPU time per op category (KDA, MLA, MoE, GEMMs, other) from a profiled pass.\n"
      "Example (one H200): deltaserve bench-engine --random-weights --preset kimi-linear-48b-a3b --quantize fp8");
  cmd->add_option("--model", args->model, "Model directory; default: the embedded tiny model");
  cmd->add_flag("--random-weights", args->random_weights,
                "Random weights of --preset, generated in GPU memory (the full 48B shape loads in seconds)");
  cmd->add_option("--preset", args->preset, "Preset for --random-weights")->default_val("kimi-linear-48b-a3b");
  cmd->add_option("--layers", args->layers, "Keep the preset's first N layers (0 = all)")->default_val(0);
  cmd->add_option("--quantize", args->quantize, "none | fp8 (FP8 block-scaled GEMM and expert weights)")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->default_val("none");
  cmd->add_option("--device", args->device, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->default_val("auto");
  cmd->add_option("--concurrency", args->concurrency, "Concurrency levels (comma-separated)")
      ->delimiter(',')
      ->default_str("1,2,4,8,16,32,64,128,256");
  cmd->add_option("--input-len", args->input_len, "Prompt tokens per request")->default_val(1024)->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output-len", args->output_len, "Generated tokens per request")->default_val(256)->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Token budget per step (chunked prefill)")
      ->default_val(ds::kDefaultMaxBatchTokens)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--warmup-steps", args->warmup_steps, "Decode steps of throw-away requests before each level")
      ->default_val(4)
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_flag("--no-graphs", args->no_graphs, "Run decode steps eagerly (no CUDA graphs)");
  cmd->add_flag("--breakdown", args->breakdown, "Add a profiled pass for the per-category step times");
  cmd->add_option("--ablate", args->ablate,
                  "Skip these ops in every step (names or categories, comma-separated, e.g. moe,input_norm): "
                  "outputs are wrong, the step time shows what they cost in the CUDA graph (CUDA only)")
      ->delimiter(',');
  cmd->add_option("--seed", args->seed, "Seed of the prompts and random weights")->default_val(1);
  cmd->add_option("--copy-gbs", args->copy_gbs,
                  "Copy bandwidth (GB/s) the weight-streaming bound divides by; 0 = measure a 1 GiB device-to-device "
                  "copy at start (CUDA; the H200's 4,258 on the CPU engine)")
      ->default_val(0)
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--md", args->md, "Write the Markdown table here");
  cmd->add_option("--json", args->json, "Write the rows as JSON here");
  cmd->add_option("--label", args->label, "Label stored in the JSON");
  ds::app::add_parallel_options(cmd, args->parallel);
  cmd->callback([args] { run(*args); });
}

}  // namespace

DS_REGISTER_COMMAND(45, setup);
