// Model directories: load a checkpoint + tokenizer (or the embedded default model), and write a random-weight
// model directory (what `deltaserve make-model` does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace ds {

struct LoadedModel {
  std::string name;  // the directory, or the embedded model's name
  ModelConfig config;
  WeightSet weights;
  std::unique_ptr<Tokenizer> tokenizer;

  // Generation stops on: the tokenizer's end-of-turn ids (<|im_end|>, [EOS]) and config.eos_token_id.
  std::vector<int32_t> eos_token_ids() const;
};

// dir empty: the embedded default model (preset tiny, seed kEmbeddedSeed, ByteTokenizer). Otherwise the tokenizer
// of dir (load_tokenizer: a clear error if it cannot be loaded yet), then load_checkpoint(dir). Throws ds::Error
// if the tokenizer has more ids than the model's vocabulary.
LoadedModel load_model(const std::string& dir);

struct MakeModelOptions {
  std::string preset = "tiny";  // a preset_config() name
  int layers = 0;               // 0 = the preset's own layer count
  uint64_t seed = 0;
  std::string out_dir;
};

// Writes config.json + model.safetensors (random_weights(config, seed), streamed by save_random_checkpoint) and
// tokenizer files:
// the byte tokenizer's tokenizer_config.json for "tiny", a byte-level tiktoken.model + Kimi tokenizer_config.json
// for the real shape. Returns the config written.
ModelConfig make_model_dir(const MakeModelOptions& options);

}  // namespace ds
