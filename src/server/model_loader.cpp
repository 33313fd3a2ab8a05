// Model + tokenizer for `serve` (see model_loader.h).
#include "server/model_loader.h"

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/tokenizer_loader.h"

namespace ds::server {

LoadedModel load_serving_model(const std::string& dir) {
  if (dir.empty()) return load_model(dir);  // the embedded model and its byte tokenizer
  LoadedModel m;
  m.tokenizer = tok::load_model_tokenizer(dir);  // first: cheap, and the likelier refusal
  Checkpoint c = load_checkpoint(dir);
  m.name = dir;
  m.config = std::move(c.config);
  m.weights = std::move(c.weights);
  if (m.tokenizer->vocab_size() > m.config.vocab_size)
    DS_THROW("{}: the tokenizer has {} ids but the model's vocab_size is {}", m.name,
             m.tokenizer->vocab_size(), m.config.vocab_size);
  return m;
}

LoadedModel random_serving_model(const std::string& preset, int layers) {
  LoadedModel m;
  m.name = preset;
  m.config = preset_config(preset, layers);
  m.tokenizer = std::make_unique<ByteTokenizer>();
  return m;
}

}  // namespace ds::server
