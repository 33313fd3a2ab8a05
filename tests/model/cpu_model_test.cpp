// CPU reference model on the tiny preset: token-by-token decode == whole prefill (chunked KDA + expanded MLA vs
// recurrent KDA + absorbed MLA), chunked-prefill continuation, state reset, input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../test_util.h"
#include "core/error.h"
#include "model/cpu_model.h"
#include "model/embedded.h"

namespace ds {
namespace {

// Pseudo-random token ids covering bytes and specials.
std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t x = seed;
  for (auto& id : t) {
    x = x * 1664525u + 1013904223u;
    id = static_cast<int32_t>((x >> 8) % vocab);
  }
  return t;
}

class CpuModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { em_ = new EmbeddedModel(embedded_model()); }
  static void TearDownTestSuite() { delete em_; }
  static CpuModel make(CpuModelOptions o = {}) { return CpuModel(em_->config, em_->weights, o); }
  static EmbeddedModel* em_;
};
EmbeddedModel* CpuModelTest::em_ = nullptr;

TEST_F(CpuModelTest, TinyPresetShape) {
  const ModelConfig& c = em_->config;
  // The test below only means something if both layer kinds and both FFN kinds are present.
  int kda = 0, mla = 0, moe = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) kda += c.is_kda_layer(i), mla += c.is_mla_layer(i), moe += c.is_moe_layer(i);
  EXPECT_GT(kda, 0);
  EXPECT_GT(mla, 0);
  EXPECT_GT(moe, 0);
  EXPECT_LT(moe, c.num_hidden_layers);
}

TEST_F(CpuModelTest, DecodeTokenByTokenEqualsPrefill) {
  // 150 tokens: the chunked KDA form crosses two 64-token chunk boundaries. KDA's o stays fp32 here: rounded to
  // bf16 (the default, as the model) the two evaluation orders land on different sides of a rounding boundary on a
  // few elements (rms 1e-5 instead of 2e-7), which would hide the equivalence this test is about.
  CpuModelOptions fp32_o;
  fp32_o.kda_o_bf16 = false;
  const CpuModel model = make(fp32_o);
  const int T = 150, V = model.vocab_size();
  const auto ids = tokens(T, V, 1);
  SequenceState prefill_state = model.new_state();
  const std::vector<float> prefill = model.forward(ids, prefill_state, /*all_logits=*/true);  // chunked + expanded
  ASSERT_EQ(prefill.size(), static_cast<size_t>(T) * V);

  SequenceState s = model.new_state();
  std::vector<float> decode;
  for (int t = 0; t < T; ++t) {
    const auto l = model.forward({ids[t]}, s);  // recurrent + absorbed
    decode.insert(decode.end(), l.begin(), l.end());
  }
  EXPECT_EQ(s.num_tokens, T);
  EXPECT_TRUE(test::expect_close("tiny model: decode vs prefill logits", decode, prefill, 1e-5));
  // The final states agree too, so decoding can continue from either.
  for (size_t i = 0; i < s.layers.size(); ++i) {
    if (!s.layers[i].recurrent.empty()) {
      EXPECT_TRUE(test::expect_close("layer " + std::to_string(i) + " KDA state", s.layers[i].recurrent,
                                     prefill_state.layers[i].recurrent, 1e-5));
    }
    if (!s.layers[i].conv.empty()) {  // copied inputs: exact in layer 0, rounding-close above it
      EXPECT_TRUE(test::expect_close("layer " + std::to_string(i) + " KDA conv state", s.layers[i].conv,
                                     prefill_state.layers[i].conv, 1e-5));
    }
    if (!s.layers[i].latent.empty()) {
      EXPECT_TRUE(test::expect_close("layer " + std::to_string(i) + " MLA latent", s.layers[i].latent,
                                     prefill_state.layers[i].latent, 1e-5));
    }
  }
}

TEST_F(CpuModelTest, ChunkedAndRecurrentPrefillAgree) {
  CpuModelOptions rec;
  rec.kda = CpuModelOptions::Kda::kRecurrent;
  rec.mla = CpuModelOptions::Mla::kAbsorbed;
  CpuModelOptions chk;
  chk.kda = CpuModelOptions::Kda::kChunked;
  chk.mla = CpuModelOptions::Mla::kExpanded;
  chk.kda_chunk = 16;  // a chunk that does not divide T
  rec.kda_o_bf16 = chk.kda_o_bf16 = false;  // KDA's o in fp32: see DecodeTokenByTokenEqualsPrefill
  const CpuModel a = make(rec), b = make(chk);
  const auto ids = tokens(77, a.vocab_size(), 2);
  SequenceState sa = a.new_state(), sb = b.new_state();
  EXPECT_TRUE(test::expect_close("tiny model: chunked(16)+expanded vs recurrent+absorbed",
                                 b.forward(ids, sb, true), a.forward(ids, sa, true), 1e-5));
}

TEST_F(CpuModelTest, SplitPrefillThenDecodeContinuesExactly) {
  CpuModelOptions fp32_o;  // KDA's o in fp32: see DecodeTokenByTokenEqualsPrefill
  fp32_o.kda_o_bf16 = false;
  const CpuModel model = make(fp32_o);
  const auto ids = tokens(100, model.vocab_size(), 3);
  SequenceState whole = model.new_state();
  const auto ref = model.forward(ids, whole, true);

  // Prefill in uneven pieces (as the engine's chunked prefill does), then decode the rest.
  SequenceState s = model.new_state();
  std::vector<float> got;
  size_t pos = 0;
  for (size_t piece : {37u, 1u, 30u}) {
    const std::vector<int32_t> chunk(ids.begin() + pos, ids.begin() + pos + piece);
    const auto l = model.forward(chunk, s, true);
    got.insert(got.end(), l.begin(), l.end());
    pos += piece;
  }
  for (; pos < ids.size(); ++pos) {
    const auto l = model.forward({ids[pos]}, s);
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_TRUE(test::expect_close("tiny model: split prefill + decode vs whole", got, ref, 1e-5));
}

TEST_F(CpuModelTest, ResetGivesAFreshSequence) {
  const CpuModel model = make();
  const auto ids = tokens(20, model.vocab_size(), 4);
  SequenceState fresh = model.new_state();
  const auto ref = model.forward(ids, fresh);
  SequenceState s = model.new_state();
  model.forward(tokens(33, model.vocab_size(), 5), s);
  s.reset();
  EXPECT_EQ(s.num_tokens, 0);
  EXPECT_EQ(model.forward(ids, s), ref);  // bitwise: same inputs, same path
}

TEST_F(CpuModelTest, LogitsFiniteAndDeterministic) {
  const CpuModel a = make(), b = make();
  const auto ids = tokens(12, a.vocab_size(), 6);
  SequenceState sa = a.new_state(), sb = b.new_state();
  const auto la = a.forward(ids, sa, true), lb = b.forward(ids, sb, true);
  EXPECT_EQ(la, lb);
  double ss = 0;
  for (float v : la) {
    ASSERT_TRUE(std::isfinite(v));
    ss += double(v) * v;
  }
  EXPECT_GT(ss, 0.0);
}

TEST_F(CpuModelTest, HfBiasedRoutingChangesLogits) {
  CpuModelOptions hf;
  hf.hf_biased_routing = true;
  const CpuModel a = make(), b = make(hf);
  const auto ids = tokens(8, a.vocab_size(), 7);
  SequenceState sa = a.new_state(), sb = b.new_state();
  const auto la = a.forward(ids, sa), lb = b.forward(ids, sb);
  const auto s = test::compare("tiny model: HF-biased vs unbiased routing", lb, la);
  EXPECT_GT(s.max_abs, 0.0);  // the switch reaches the router
  EXPECT_LT(s.rms_ratio, 0.1);  // the bias is small (sd 0.01): a perturbation, not a different model
}

TEST_F(CpuModelTest, RejectsBadInput) {
  const CpuModel model = make();
  SequenceState s = model.new_state();
  EXPECT_THROW(model.forward({}, s), Error);
  EXPECT_THROW(model.forward({model.vocab_size()}, s), Error);
  EXPECT_THROW(model.forward({-1}, s), Error);
  EXPECT_EQ(s.num_tokens, 0);  // nothing consumed by a rejected batch
}

}  // namespace
}  // namespace ds
