// The embedded default model: tiny preset shape, valid weights, bit-identical for a seed.
#include <gtest/gtest.h>

#include <cstring>

#include "model/embedded.h"

namespace ds {
namespace {

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.dims() == b.dims() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

TEST(EmbeddedModel, TinyPresetWithValidWeights) {
  const EmbeddedModel m = embedded_model();
  EXPECT_EQ(m.config, preset_config("tiny"));
  EXPECT_NO_THROW(validate_weights(m.config, m.weights));
  EXPECT_EQ(m.config.vocab_size, 320);  // the ByteTokenizer's vocabulary
  EXPECT_EQ(m.config.eos_token_id, 258);  // <|im_end|> of the ByteTokenizer
}

TEST(EmbeddedModel, SameSeedSameBytesOtherSeedDiffers) {
  const EmbeddedModel a = embedded_model(), b = embedded_model(), c = embedded_model(kEmbeddedSeed + 1);
  ASSERT_EQ(a.weights.names(), b.weights.names());
  int differ = 0;
  for (const auto& n : a.weights.names()) {
    EXPECT_TRUE(same_bytes(a.weights.get(n), b.weights.get(n))) << n;
    differ += !same_bytes(a.weights.get(n), c.weights.get(n));
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace ds
