// `deltaserve make-model`: writes a random-weight model directory of a preset shape.
#include <cstdio>
#include <memory>
#include <string>

#include "app/commands.h"
#include "model/config.h"
#include "runtime/model_files.h"

namespace {

void setup(CLI::App& app) {
  auto o = std::make_shared<ds::MakeModelOptions>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "Write a random-weight model directory: config.json, model.safetensors and tokenizer files.\n"
      "tiny: the embedded model's shape with the byte tokenizer (tokenizer_config.json).\n"
      "kimi-linear-48b-a3b: the real shape with a byte-level tiktoken.model and the Kimi special tokens at their\n"
      "real ids (bf16 weights generated and written one tensor at a time; ~98 GB of disk at 27 layers:\n"
      "--layers cuts it).");
  std::string presets;
  for (const auto& p : ds::preset_names()) presets += (presets.empty() ? "" : "|") + p;
  cmd->add_option("--preset", o->preset, "Model shape: " + presets)
      ->default_val("tiny")
      ->check(CLI::IsMember(ds::preset_names()));
  cmd->add_option("--layers", o->layers,
                  "Keep the first N layers (MLA at every 4th and at the last layer, as in the real model); "
                  "0 = the preset's own count")
      ->default_val(0)
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--out", o->out_dir, "Output directory (created if needed; existing files are replaced)")
      ->required();
  cmd->add_option("--seed", o->seed, "Seed of the random weights (same seed, same bytes)")->default_val(0);
  cmd->callback([o] {
    const ds::ModelConfig c = ds::make_model_dir(*o);
    std::printf("wrote %s: preset %s, %d layers (%zu KDA, %zu MLA), hidden %d, vocab %d, %d experts, seed %llu\n",
                o->out_dir.c_str(), o->preset.c_str(), c.num_hidden_layers, c.linear_attn.kda_layers.size(),
                c.linear_attn.full_attn_layers.size(), c.hidden_size, c.vocab_size, c.num_experts,
                static_cast<unsigned long long>(o->seed));
  });
}

}  // namespace

DS_REGISTER_COMMAND(80, setup);
