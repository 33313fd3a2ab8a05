// Sampler: greedy tie rule, top-k = 1 == greedy, exact top-p cut, seeded reproducibility, temperature frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace ds {
namespace {

TEST(Sampler, ArgmaxTiesPickLowestIdAndSkipNan) {
  const std::vector<float> l = {1.0f, 3.0f, NAN, 3.0f, -INFINITY};
  EXPECT_EQ(argmax(l.data(), 5), 1);
  const std::vector<float> nan_first = {NAN, -1.0f, -1.0f};
  EXPECT_EQ(argmax(nan_first.data(), 3), 1);
}

TEST(Sampler, GreedyAndTopK1AreArgmax) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  SamplingParams greedy;  // temperature 0
  SamplingParams topk1;
  topk1.temperature = 1.5f, topk1.top_k = 1;
  Sampler a(greedy, 1), b(topk1, 2);
  for (int it = 0; it < 200; ++it) {
    std::vector<float> l(320);
    for (auto& x : l) x = std::round(nd(rng) * 2);  // rounded: ties are common
    const int32_t want = argmax(l.data(), 320);
    EXPECT_EQ(a.sample(l.data(), 320), want);
    EXPECT_EQ(b.sample(l.data(), 320), want);
  }
}

TEST(Sampler, TopPCutIsExact) {
  // Probabilities 1/2, 1/4, 1/8, 1/16, 1/16 placed at shuffled ids.
  const std::vector<float> l = {std::log(0.0625f), std::log(0.25f), std::log(0.5f), std::log(0.0625f),
                                std::log(0.125f)};
  SamplingParams p;
  p.temperature = 1.0f;
  auto ids = [&](float top_p) {
    p.top_p = top_p;
    std::vector<int32_t> r;
    for (const auto& c : candidate_distribution(l.data(), 5, p)) r.push_back(c.id);
    return r;
  };
  EXPECT_EQ(ids(1.0f), (std::vector<int32_t>{2, 1, 4, 0, 3}));  // equal probabilities: lower id first
  EXPECT_EQ(ids(0.74f), (std::vector<int32_t>{2, 1}));          // 0.5 < 0.74 <= 0.75
  EXPECT_EQ(ids(0.76f), (std::vector<int32_t>{2, 1, 4}));       // 0.75 < 0.76 <= 0.875
  EXPECT_EQ(ids(0.9f), (std::vector<int32_t>{2, 1, 4, 0}));
  EXPECT_EQ(ids(0.3f), (std::vector<int32_t>{2}));              // always at least one
  p.top_p = 0.74f;
  const auto c = candidate_distribution(l.data(), 5, p);
  EXPECT_NEAR(c[0].prob, 2.0 / 3, 1e-7);  // renormalised over the kept mass (logs are float)
  EXPECT_NEAR(c[1].prob, 1.0 / 3, 1e-7);
  // top-k applies before top-p.
  p.top_p = 0.9f, p.top_k = 2;
  EXPECT_EQ(candidate_distribution(l.data(), 5, p).size(), 2u);

  // Draws only ever return kept ids.
  p.top_k = 0, p.top_p = 0.76f;
  Sampler s(p, 7);
  for (int i = 0; i < 2000; ++i) {
    const int32_t id = s.sample(l.data(), 5);
    EXPECT_TRUE(id == 2 || id == 1 || id == 4) << id;
  }
}

TEST(Sampler, SeededReproducibility) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 0.7f) * 2;
  SamplingParams p;
  p.temperature = 1.0f, p.top_p = 0.95f, p.top_k = 40;
  auto draw = [&](uint64_t seed) {
    Sampler s(p, seed);
    std::vector<int32_t> r;
    for (int i = 0; i < 300; ++i) r.push_back(s.sample(l.data(), 50));
    return r;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TemperatureFrequenciesFollowSoftmax) {
  const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
  for (float temp : {0.7f, 1.0f, 2.5f}) {
    SamplingParams p;
    p.temperature = temp;
    std::vector<double> prob(6);
    double tot = 0;
    for (int i = 0; i < 6; ++i) tot += (prob[i] = std::exp(l[i] / temp));
    for (auto& x : prob) x /= tot;
    Sampler s(p, 1234);
    const int draws = 60000;
    std::vector<int> count(6);
    for (int i = 0; i < draws; ++i) ++count[s.sample(l.data(), 6)];
    double chi2 = 0;
    for (int i = 0; i < 6; ++i) {
      const double e = prob[i] * draws;
      chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    std::printf("[sampler] temperature %.1f: chi-square %.2f (5 dof; 20.5 is p = 0.001)\n", temp, chi2);
    EXPECT_LT(chi2, 20.5) << "temperature " << temp;
  }
}

TEST(Sampler, ValidateRejectsBadParams) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate());
  p.temperature = -1;
  EXPECT_THROW(p.validate(), Error);
  p = {}, p.top_p = 0.0f;
  EXPECT_THROW(p.validate(), Error);
  p = {}, p.top_p = 1.5f;
  EXPECT_THROW(p.validate(), Error);
  p = {}, p.top_k = -2;
  EXPECT_THROW(p.validate(), Error);
  p = {}, p.max_tokens = 0;
  EXPECT_THROW(p.validate(), Error);
  p = {}, p.temperature = NAN;
  EXPECT_THROW(p.validate(), Error);
}

}  // namespace
}  // namespace ds
