// `deltaserve serve`: the OpenAI-compatible HTTP server on the CUDA engine (a GPU) or the CPU reference engine
// (embedded model or --model DIR).
// Built only with cpp-httplib and PCRE2 (DELTASERVE_SERVER); other builds have no `serve` subcommand.
#ifdef DELTASERVE_WITH_SERVER
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "app/commands.h"
#include "app/parallel_cli.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "model/cpu_model.h"
#include "runtime/cpu_engine.h"
#include "runtime/engine_factory.h"
#include "runtime/parallel/driver_engine.h"
#include "runtime/parallel/worker_loop.h"
#include "runtime/perf_model.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"
#include "server/model_loader.h"

namespace {

struct Args {
  std::string model;
  bool random_weights = false;
  std::string preset = "kimi-linear-48b-a3b";
  int layers = 0;
  std::string served_model_name;
  ds::server::ServerOptions server;
  int64_t max_model_len = 0;
  int max_batch_tokens = ds::kDefaultMaxBatchTokens;
  double shutdown_grace_s = 30;
  uint64_t seed = 0;
  std::string device = "auto";
  std::string quantize = "none";
  ds::app::ParallelArgs parallel;
};

void run(Args a) {
  ds::knobs::validate_all();
  // The ranks get SIGTERM forwarded by the launcher; rank 0 drains for up to --shutdown-grace: give it that.
  auto role = ds::app::start_parallel("serve", a.parallel, a.device, {a.shutdown_grace_s + 15});
  if (!role) return;  // this process was the launcher
  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts, so every thread
  // inherits the mask and the signal reaches only this one.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ds::LoadedModel m = a.random_weights ? ds::server::random_serving_model(a.preset, a.layers)
                                       : ds::server::load_serving_model(a.model);
  ds::app::join_group("serve", *role, m.config);  // a rank: its group (NCCL starts threads: after the mask)
  int64_t max_model_len = a.max_model_len > 0 ? a.max_model_len : m.config.model_max_length;
  if (max_model_len <= 0) max_model_len = 1 << 17;  // the config sets no limit: a finite default for the API

  ds::EngineFactoryOptions eo;
  eo.device = ds::parse_engine_device(a.device);
  eo.max_seqs = a.server.max_concurrent;
  eo.max_batch_tokens = a.max_batch_tokens;
  eo.max_model_len = max_model_len;
  eo.eos_token_ids = m.eos_token_ids();
  eo.seed = a.seed;
  eo.device_model = ds::quantize_options(a.quantize == "fp8");
  if (eo.device_model.fp8 && eo.device == ds::EngineDevice::kCpu)
    DS_THROW("serve: --quantize fp8 needs the CUDA engine (--device cuda or auto on a GPU)");
  if (role->parallel()) {
    eo.device = ds::EngineDevice::kCuda;
    ds::app::configure_rank_engine(eo.cuda, eo.device_model, role->group, role->spec);
  }
  // Random weights: seed 1, bench-engine's default, so both measure the same model.
  ds::MadeEngine made = a.random_weights ? ds::make_random_engine(m.config, 1, eo)
                                         : ds::make_engine(m.config, m.weights, eo);
  if (!role->driver()) {
    // A worker rank: SIGINT/SIGTERM stay blocked (rank 0 drains, then its shutdown frame ends this loop).
    ds::parallel::worker_loop(*made.engine, *role->group);
    return;
  }
  ds::Engine* engine = made.engine.get();
  const char* device_name = made.device == ds::EngineDevice::kCuda ? "cuda" : "cpu";

  ds::server::ServerOptions so = a.server;
  std::unique_ptr<ds::parallel::DriverEngine> driver;
  if (role->parallel()) {
    ds::parallel::DriverOptions dopt;
    dopt.engine_seed = a.seed;
    // The group failed (a rank died, a collective timed out): stop serving; run() then exits non-zero and the
    // launcher stops the other ranks.
    dopt.on_fatal = [](const std::string&) { kill(getpid(), SIGTERM); };
    driver = ds::parallel::make_driver_engine(*made.engine, *role->group, dopt);
    engine = driver.get();
    so.engine_idle_tick = [d = driver.get()] { d->heartbeat(); };
    so.engine_idle_period = std::chrono::seconds(1);  // far below any collective timeout; not a spin
    // DEP: each rank has --max-concurrent state slots.
    if (role->spec.mode == ds::parallel::Mode::kDep) so.max_concurrent *= role->spec.world();
  }
  so.served_model_name = !a.served_model_name.empty() ? a.served_model_name
                         : a.model.empty()            ? m.name  // embedded model, or the preset
                                                      : std::filesystem::path(a.model).filename().string();
  if (so.served_model_name.empty()) so.served_model_name = m.name;  // a path ending in '/'
  so.prompt_limits.max_model_len = max_model_len;
  ds::server::HttpServer server(*engine, *m.tokenizer, so);
  const int port = server.start();
  std::fprintf(stderr,
               "deltaserve serve: model %s (%s tokenizer, vocab %d, context %lld) on %s; serving '%s' at "
               "http://%s:%d (max %d concurrent, %d queued)%s\n",
               m.name.c_str(), m.tokenizer->kind().c_str(), m.tokenizer->vocab_size(),
               static_cast<long long>(max_model_len), device_name, so.served_model_name.c_str(), so.host.c_str(), port,
               so.max_concurrent, so.max_queue,
               role->parallel() ? (" over " + std::to_string(role->spec.world()) + " ranks (--mode " +
                                   ds::parallel::to_string(role->spec.mode) + ")")
                                      .c_str()
                                : "");
  if (m.tokenizer->vocab_size() < m.config.vocab_size)  // e.g. --random-weights of the full-size preset
    std::fprintf(stderr, "deltaserve serve: the model samples from %d ids, the tokenizer knows %d: the others stream "
                 "as U+FFFD\n", m.config.vocab_size, m.tokenizer->vocab_size());
  if (made.device == ds::EngineDevice::kCuda) {  // which GEMMs read FP8 (the KDA projection has its own knob)
    ds::DecodeBytesOptions w;
    ds::set_weights_precision(w, eo.device_model);
    std::fprintf(stderr, "deltaserve serve: weights %s\n", ds::weights_precision(w).c_str());
  }
  std::fflush(stderr);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "deltaserve serve: %s: draining (up to %.0f s), then exiting\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", a.shutdown_grace_s);
  server.shutdown(std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_grace_s * 1000)));
  if (driver) {
    if (driver->failed()) DS_THROW("serve: the parallel group failed: {}", driver->failure());
    driver->shutdown();  // the workers return from their loops
  }
  std::fprintf(stderr, "deltaserve serve: stopped\n");
}

void setup(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (streaming or not), /v1/models,\n"
      "/health, /metrics. SIGINT/SIGTERM drain running requests, then exit. See docs/server.md.\n"
      "Several GPUs: --tp N (tensor-parallel, --mode tep) or --ep N --mode dep (data-parallel attention) starts one\n"
      "process per GPU; rank 0 serves HTTP, every rank steps together (docs/parallel.md).\n"
      "Example (8 GPUs): deltaserve serve --model DIR --tp 8 --ep 8 --mode tep");
  auto* model_opt =
      cmd->add_option("--model", a->model, "Model directory; default: the embedded tiny random-weight model");
  auto* random_flag = cmd->add_flag("--random-weights", a->random_weights,
                "Serve random weights of --preset (generated in GPU memory on the CUDA engine: a full-size server "
                "without a checkpoint) with the byte tokenizer; for load tests (send token ids in [0, 256))")
      ->excludes(model_opt);
  cmd->add_option("--preset", a->preset, "Preset for --random-weights")
      ->default_val("kimi-linear-48b-a3b")
      ->needs(random_flag);
  cmd->add_option("--layers", a->layers, "Keep the preset's first N layers (0 = all)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber)
      ->needs(random_flag);
  cmd->add_option("--served-model-name", a->served_model_name,
                  "Name clients send as `model` and /v1/models lists; default: the model's name");
  cmd->add_option("--host", a->server.host, "Address to bind")->default_val("127.0.0.1");
  cmd->add_option("--port", a->server.port, "Port to bind; 0 = any free port (printed)")
      ->default_val(8000)
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--max-concurrent", a->server.max_concurrent,
                  "Requests generating at once (engine state slots, per rank under --mode dep; each open stream holds "
                  "a thread)")
      ->default_val(64)
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queue", a->server.max_queue,
                  "Accepted requests waiting for a slot; beyond that new requests get HTTP 429")
      ->default_val(256)
      ->check(CLI::Range(0, 65536));
  cmd->add_option("--max-model-len", a->max_model_len,
                  "Prompt + generated tokens per request; default: the model config's model_max_length")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-batch-tokens,--max-prefill-tokens", a->max_batch_tokens,
                  "Token budget per engine step (decodes first, then prompt chunks; the same as bench-engine's "
                  "--max-batch-tokens, --max-prefill-tokens is its old name); lower it to shorten the steps "
                  "that running decodes wait through while a long prompt prefills")
      ->default_val(ds::kDefaultMaxBatchTokens)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-body-bytes", a->server.max_body_bytes,
                  "Largest request body; larger ones get HTTP 413")
      ->default_val(8u << 20);
  cmd->add_option("--shutdown-grace", a->shutdown_grace_s,
                  "Seconds running requests may take to finish after SIGTERM before they are cancelled")
      ->default_val(30)
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--seed", a->seed, "Engine seed for requests that set none")->default_val(0);
  cmd->add_option("--device", a->device, "auto (CUDA engine on a GPU, else CPU) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->default_val("auto");
  cmd->add_option("--quantize", a->quantize, "none | fp8: FP8 block-scaled GEMM and expert weights (CUDA engine)")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->default_val("none");
  ds::app::add_parallel_options(cmd, a->parallel);
  cmd->footer("Environment knobs (read once at start-up; a bad value stops start-up):\n" + ds::knobs::help_text());
  cmd->callback([a] { run(*a); });
}

}  // namespace

DS_REGISTER_COMMAND(10, setup);

#endif  // DELTASERVE_WITH_SERVER
