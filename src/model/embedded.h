// The embedded default model: preset "tiny" with random weights from a fixed seed, built in memory (no file).
// Its tokenizer is the ByteTokenizer (tokenizer/byte_tokenizer.h): vocab 320, eos 258 = <|im_end|>.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace ds {

inline constexpr uint64_t kEmbeddedSeed = 20251030;
inline constexpr const char* kEmbeddedModelName = "deltaserve-tiny-random";

struct EmbeddedModel {
  ModelConfig config;
  WeightSet weights;
};

// preset_config("tiny") + random_weights(config, seed). The same seed gives bit-identical weights.
EmbeddedModel embedded_model(uint64_t seed = kEmbeddedSeed);

}  // namespace ds
