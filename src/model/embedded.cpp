// The embedded default model (see embedded.h).
#include "model/embedded.h"

namespace ds {

EmbeddedModel embedded_model(uint64_t seed) {
  EmbeddedModel m;
  m.config = preset_config("tiny");
  m.weights = random_weights(m.config, seed);
  return m;
}

}  // namespace ds
