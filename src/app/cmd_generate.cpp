// `deltaserve generate`: one-shot generation from the command line, with prefill and decode speed.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "app/commands.h"
#include "app/parallel_cli.h"
#include "core/env.h"
#include "core/error.h"
#include "model/cpu_model.h"
#include "runtime/cpu_engine.h"
#include "runtime/engine_factory.h"
#include "runtime/model_files.h"
#include "runtime/parallel/driver_engine.h"
#include "runtime/parallel/worker_loop.h"

namespace {

struct Args {
  std::string model;
  std::string prompt;
  bool chat = false;
  ds::SamplingParams sampling;
  uint64_t seed = 0;
  std::string device = "auto";
  std::string quantize = "none";
  ds::app::ParallelArgs parallel;
};

void run(const Args& a) {
  ds::knobs::validate_all();
  auto role = ds::app::start_parallel("generate", a.parallel, a.device);
  if (!role) return;  // this process was the launcher
  using Clock = std::chrono::steady_clock;
  const auto t_load = Clock::now();
  ds::LoadedModel m = ds::load_model(a.model);
  ds::app::join_group("generate", *role, m.config);
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();

  ds::Request req;
  if (a.chat) {
    ds::ChatMessage msg;
    msg.role = "user", msg.content = a.prompt;
    req.prompt = m.tokenizer->encode_chat({msg}, /*add_generation_prompt=*/true);
  } else {
    req.prompt = m.tokenizer->encode(a.prompt);
  }
  req.sampling = a.sampling;
  req.sampling.seed = a.seed;

  ds::EngineFactoryOptions eo;
  eo.device = ds::parse_engine_device(a.device);
  eo.max_seqs = 1;
  eo.max_batch_tokens = static_cast<int>(std::max<size_t>(1, req.prompt.size()));  // one prefill step: clean timing
  eo.max_model_len = static_cast<int64_t>(req.prompt.size()) + req.sampling.max_tokens + 1;
  eo.eos_token_ids = m.eos_token_ids();
  eo.device_model = ds::quantize_options(a.quantize == "fp8");
  if (eo.device_model.fp8 && eo.device == ds::EngineDevice::kCpu)
    DS_THROW("generate: --quantize fp8 needs the CUDA engine");
  if (role->parallel()) {
    eo.device = ds::EngineDevice::kCuda;
    ds::app::configure_rank_engine(eo.cuda, eo.device_model, role->group, role->spec);
  }
  ds::MadeEngine made = ds::make_engine(m.config, m.weights, eo);
  if (!role->driver()) {
    ds::parallel::worker_loop(*made.engine, *role->group);  // until rank 0 is done
    return;
  }
  std::unique_ptr<ds::parallel::DriverEngine> driver;
  if (role->parallel()) {
    ds::parallel::DriverOptions dopt;
    dopt.engine_seed = eo.seed;
    driver = ds::parallel::make_driver_engine(*made.engine, *role->group, dopt);
  }
  ds::Engine& engine = driver ? *driver : *made.engine;
  engine.add_request(req);
  std::fprintf(stderr, "model: %s (%d layers, vocab %d) on %s, loaded in %.2f s\n", m.name.c_str(),
               m.config.num_hidden_layers, m.config.vocab_size,
               made.device == ds::EngineDevice::kCuda ? "cuda" : "cpu (fp32 reference engine)", load_s);

  ds::StreamDecoder text(*m.tokenizer, /*skip_special=*/true);
  const auto t0 = Clock::now();
  auto t_first = t0;
  int generated = 0;
  ds::FinishReason reason = ds::FinishReason::kNone;
  while (engine.has_work()) {
    for (const auto& out : engine.step()) {
      for (int32_t tok : out.new_tokens) {
        if (generated++ == 0) t_first = Clock::now();
        std::fputs(text.push(tok).c_str(), stdout);
        std::fflush(stdout);
      }
      if (out.finished) reason = out.reason;
    }
  }
  const auto t_end = Clock::now();
  if (driver) driver->shutdown();
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);

  // Prefill = until the first token exists (the prompt forward + one sample); decode = every later token.
  const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
  const int decode_tokens = generated - 1;
  std::fprintf(stderr, "prefill: %zu tokens in %.1f ms (%.1f tokens/s)\n", req.prompt.size(), prefill_s * 1e3,
               prefill_s > 0 ? req.prompt.size() / prefill_s : 0.0);
  std::fprintf(stderr, "decode: %d tokens in %.1f ms (%.1f tokens/s)\n", decode_tokens, decode_s * 1e3,
               decode_s > 0 ? decode_tokens / decode_s : 0.0);
  std::fprintf(stderr, "generated %d tokens, finish reason: %s\n", generated, ds::finish_reason_name(reason));
}

void setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate a continuation of a prompt and print it (stdout), with prefill and decode tokens/s (stderr).\n"
      "Without --model the embedded tiny random-weight model and its byte tokenizer are used (its output is\n"
      "noise by design: it exercises the whole engine without a download).");
  cmd->add_option("--model", args->model,
                  "Model directory (config.json, *.safetensors, tokenizer files); default: the embedded model");
  cmd->add_option("--prompt", args->prompt, "Prompt text (special-token strings such as <|im_end|> are matched)")
      ->required();
  cmd->add_flag("--chat", args->chat,
                "Wrap the prompt as one user turn in the Kimi chat format, ending with the assistant tag");
  cmd->add_option("--max-tokens", args->sampling.max_tokens, "Tokens to generate at most")
      ->default_val(32)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->sampling.temperature, "Sampling temperature; 0 = greedy")
      ->default_val(0.0f)
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", args->sampling.top_k, "Keep the k most likely tokens; 0 = off")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", args->sampling.top_p, "Nucleus sampling mass in (0, 1]; 1 = off")
      ->default_val(1.0f)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--seed", args->seed, "Seed of the sampler (same seed, same tokens)")->default_val(0);
  cmd->add_option("--device", args->device, "auto (CUDA engine on a GPU, else CPU) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->default_val("auto");
  cmd->add_option("--quantize", args->quantize, "none | fp8 (CUDA engine)")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->default_val("none");
  cmd->add_flag("--ignore-eos", args->sampling.ignore_eos,
                "Keep generating past end-of-sequence tokens until --max-tokens");
  ds::app::add_parallel_options(cmd, args->parallel);
  cmd->callback([args] { run(*args); });
}

}  // namespace

DS_REGISTER_COMMAND(20, setup);
