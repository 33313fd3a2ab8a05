// Loading and writing model directories (see model_files.h).
#include "runtime/model_files.h"

#include <algorithm>

#include "core/error.h"
#include "model/embedded.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds {

std::vector<int32_t> LoadedModel::eos_token_ids() const {
  std::vector<int32_t> ids = tokenizer ? tokenizer->stop_token_ids() : std::vector<int32_t>{};
  if (std::find(ids.begin(), ids.end(), config.eos_token_id) == ids.end()) ids.push_back(config.eos_token_id);
  return ids;
}

LoadedModel load_model(const std::string& dir) {
  LoadedModel m;
  if (dir.empty()) {
    EmbeddedModel e = embedded_model();
    m.name = kEmbeddedModelName;
    m.config = std::move(e.config);
    m.weights = std::move(e.weights);
    m.tokenizer = std::make_unique<ByteTokenizer>();
  } else {
    m.tokenizer = load_tokenizer(dir);  // first: it is cheap and the likelier refusal
    Checkpoint c = load_checkpoint(dir);
    m.name = dir;
    m.config = std::move(c.config);
    m.weights = std::move(c.weights);
  }
  if (m.tokenizer->vocab_size() > m.config.vocab_size)
    DS_THROW("{}: the tokenizer has {} ids but the model's vocab_size is {}", m.name, m.tokenizer->vocab_size(),
             m.config.vocab_size);
  return m;
}

ModelConfig make_model_dir(const MakeModelOptions& o) {
  if (o.out_dir.empty()) DS_THROW("make-model: an output directory is required");
  const ModelConfig config = preset_config(o.preset, o.layers);
  // Streams one tensor at a time (memory: the largest tensor), byte-identical to
  // save_checkpoint(dir, config, random_weights(config, seed)): the 48B shape needs no 98 GB of RAM.
  save_random_checkpoint(o.out_dir, config, o.seed);
  if (o.preset == "tiny")
    ByteTokenizer::write_files(o.out_dir);
  else
    write_byte_level_tiktoken_files(o.out_dir);
  return config;
}

}  // namespace ds
