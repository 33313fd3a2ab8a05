// MoE references: router edge cases (all-negative, all-equal, huge, NaN logits), grouped top-k, scaling, HF biased
// weights, and the block with in-op vs separated routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "../test_util.h"
#include "kernels/moe/moe_ref.h"

namespace ds {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(const std::vector<float>& logits, const std::vector<float>* bias, int T, const moe::RouterParams& p) {
  Routed r{std::vector<int32_t>(static_cast<size_t>(T) * p.topk, -7),
           std::vector<float>(static_cast<size_t>(T) * p.topk, NAN)};
  moe::route_ref(logits.data(), bias ? bias->data() : nullptr, T, p, r.ids.data(), r.w.data());
  return r;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Independent brute force of the documented rule: full sorts with (score desc, index asc).
std::vector<int32_t> brute_force_ids(const float* logits, const float* bias, const moe::RouterParams& p) {
  const int E = p.E, G = p.num_expert_group, per = E / G;
  std::vector<float> sb(E);
  for (int e = 0; e < E; ++e) sb[e] = sigmoid(logits[e]) + (bias ? bias[e] : 0.0f);
  std::vector<std::pair<float, int>> groups;
  for (int g = 0; g < G; ++g) {
    std::vector<float> v(sb.begin() + g * per, sb.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    groups.push_back({v[0] + (per > 1 ? v[1] : 0.0f), g});
  }
  std::sort(groups.begin(), groups.end(),
            [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<std::pair<float, int>> cand;
  for (int i = 0; i < p.topk_group; ++i)
    for (int e = groups[i].second * per; e < (groups[i].second + 1) * per; ++e) cand.push_back({sb[e], e});
  std::sort(cand.begin(), cand.end(),
            [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<int32_t> ids;
  for (int k = 0; k < p.topk; ++k) ids.push_back(cand[k].second);
  return ids;
}

float sum(const float* w, int n) { return std::accumulate(w, w + n, 0.0f); }

TEST(MoeRouter, AllNegativeLogitsPickTheLargest) {
  moe::RouterParams p{.E = 32, .topk = 4, .routed_scaling_factor = 2.446f};
  std::vector<float> logits(32);
  for (int e = 0; e < 32; ++e) logits[e] = -20.0f - 0.5f * ((e * 7) % 32);  // all negative, distinct
  auto r = route(logits, nullptr, 1, p);
  // The four largest logits: (e*7)%32 in {0,1,2,3} -> e = 0, 23, 14, 5.
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 23, 14, 5}));
  EXPECT_NEAR(sum(r.w.data(), 4), 2.446f, 1e-5);
  for (float w : r.w) EXPECT_GT(w, 0.0f);
}

TEST(MoeRouter, AllEqualLogitsLowerIndexWins) {
  moe::RouterParams p{.E = 64, .topk = 8, .routed_scaling_factor = 2.0f};
  auto r = route(std::vector<float>(64, 0.3f), nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (float w : r.w) EXPECT_FLOAT_EQ(w, 2.0f / 8);
  // With groups too: equal group scores keep the lowest groups.
  p.num_expert_group = 8, p.topk_group = 2, p.topk = 4;
  r = route(std::vector<float>(64, -1.0f), nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(MoeRouter, HugeMagnitudeLogitsStayFinite) {
  moe::RouterParams p{.E = 16, .topk = 4, .routed_scaling_factor = 1.5f};
  std::vector<float> logits(16, -1e30f);
  logits[3] = 1e30f, logits[9] = 1e30f, logits[12] = 3e38f, logits[1] = 5.0f, logits[5] = -3e38f;
  auto r = route(logits, nullptr, 1, p);
  // sigmoid saturates to exactly 1 for 3, 9, 12 (tie -> index order), then sigmoid(5) = 0.9933.
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 9, 12, 1}));
  const float tot = 3 + sigmoid(5.0f);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(r.w[k], 1.5f / tot, 1e-6);
  EXPECT_NEAR(r.w[3], 1.5f * sigmoid(5.0f) / tot, 1e-6);
  // sigmoid(50) also rounds to exactly 1.0f: a four-way tie, broken by index.
  logits[1] = 50.0f;
  EXPECT_EQ(route(logits, nullptr, 1, p).ids, (std::vector<int32_t>{1, 3, 9, 12}));
  // Every score underflows to 0: weights are 0/(0 + 1e-20) = 0, not NaN.
  r = route(std::vector<float>(16, -1e30f), nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : r.w) EXPECT_EQ(w, 0.0f);
}

TEST(MoeRouter, NanLogitNeverSelected) {
  moe::RouterParams p{.E = 8, .topk = 2};
  std::vector<float> logits = {NAN, -3, NAN, -1, -2, NAN, -5, -4};
  auto r = route(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 4}));
}

TEST(MoeRouter, GroupedTopKKeepsGroupsByTopTwoSum) {
  // 4 groups of 4. Group 0 holds the single best expert but a weak second; groups 1 and 2 have better top-2 sums.
  moe::RouterParams p{.E = 16, .topk = 3, .num_expert_group = 4, .topk_group = 2};
  std::vector<float> logits(16, -6.0f);
  logits[0] = 6.0f;                   // group 0: 6, -6  -> sum ~ 1.0025
  logits[5] = 2.0f, logits[6] = 1.5f; // group 1: sigmoid sum ~ 1.699
  logits[9] = 1.0f, logits[11] = 1.0f;// group 2: ~ 1.462
  logits[14] = 1.2f;                  // group 3: ~ 0.77 + 0.0025
  auto r = route(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 6, 9}));  // expert 0 excluded with its group; 9 beats 11 on the tie
  // Without grouping expert 0 would be first.
  p.num_expert_group = 1, p.topk_group = 1;
  EXPECT_EQ(route(logits, nullptr, 1, p).ids, (std::vector<int32_t>{0, 5, 6}));
}

TEST(MoeRouter, RandomGroupedMatchesBruteForceUpTo1024Experts) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  struct Shape { int E, topk, G, kg; };
  for (Shape s : {Shape{256, 8, 1, 1}, Shape{256, 8, 8, 4}, Shape{1024, 16, 16, 5}, Shape{72, 6, 9, 3},
                  Shape{1024, 16, 1, 1}}) {
    moe::RouterParams p{.E = s.E, .topk = s.topk, .num_expert_group = s.G, .topk_group = s.kg,
                        .routed_scaling_factor = 2.446f};
    const int T = 9;
    std::vector<float> logits(static_cast<size_t>(T) * s.E), bias(s.E);
    for (auto& v : logits) v = nd(rng) * 2;
    for (auto& v : bias) v = nd(rng) * 0.1f;
    // Quantised logits make exact ties common, so the tie rule is exercised.
    for (size_t i = 0; i < logits.size(); i += 3) logits[i] = std::round(logits[i]);
    auto r = route(logits, &bias, T, p);
    for (int t = 0; t < T; ++t) {
      auto want = brute_force_ids(logits.data() + static_cast<size_t>(t) * s.E, bias.data(), p);
      std::vector<int32_t> got(r.ids.begin() + t * s.topk, r.ids.begin() + (t + 1) * s.topk);
      EXPECT_EQ(got, want) << "E=" << s.E << " G=" << s.G << " t=" << t;
      EXPECT_NEAR(sum(r.w.data() + t * s.topk, s.topk), 2.446f, 1e-5);
    }
  }
}

TEST(MoeRouter, ScalingAndRenormalisation) {
  std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, -0.3f, 1.0f};
  moe::RouterParams p{.E = 6, .topk = 3, .renormalize = true, .routed_scaling_factor = 2.446f};
  auto r = route(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 5, 0}));
  const float s2 = sigmoid(2.0f), s5 = sigmoid(1.0f), s0 = sigmoid(0.5f), tot = s2 + s5 + s0;
  EXPECT_NEAR(r.w[0], s2 / tot * 2.446f, 1e-6);
  EXPECT_NEAR(r.w[1], s5 / tot * 2.446f, 1e-6);
  EXPECT_NEAR(r.w[2], s0 / tot * 2.446f, 1e-6);
  // Without renormalisation: raw sigmoid scores times the factor.
  p.renormalize = false;
  r = route(logits, nullptr, 1, p);
  EXPECT_NEAR(r.w[0], s2 * 2.446f, 1e-6);
  EXPECT_NEAR(r.w[2], s0 * 2.446f, 1e-6);
}

TEST(MoeRouter, UnbiasedVersusHfBiasedWeights) {
  std::vector<float> logits = {1.0f, 0.0f, 0.5f, -0.5f};
  std::vector<float> bias = {0.0f, 0.6f, -0.2f, 0.0f};
  moe::RouterParams p{.E = 4, .topk = 2, .routed_scaling_factor = 1.0f};
  auto unb = route(logits, &bias, 1, p);
  p.hf_biased_weights = true;
  auto hf = route(logits, &bias, 1, p);
  // Selection uses s + bias in both: sb = {0.731, 1.1, 0.422, 0.378} -> experts 1, 0.
  EXPECT_EQ(unb.ids, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(hf.ids, unb.ids);
  const float s0 = sigmoid(1.0f), s1 = sigmoid(0.0f);
  EXPECT_NEAR(unb.w[0], s1 / (s0 + s1), 1e-6);  // bias only steered the choice
  EXPECT_NEAR(unb.w[1], s0 / (s0 + s1), 1e-6);
  EXPECT_NEAR(hf.w[0], (s1 + 0.6f) / (s0 + s1 + 0.6f), 1e-6);  // HF: biased scores as weights
  EXPECT_NEAR(hf.w[1], s0 / (s0 + s1 + 0.6f), 1e-6);
  EXPECT_GT(std::fabs(hf.w[0] - unb.w[0]), 0.05f);
}

// A whole block on random weights: separated routing (caller's ids/weights) equals in-op routing, and the block
// equals a hand-written loop over experts.
TEST(MoeBlock, InOpEqualsSeparatedAndHandLoop) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  const int T = 5, D = 24, I = 10, E = 12, TOPK = 3, SI = 7;
  auto rnd = [&](size_t n, float sc) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng) * sc;
    return v;
  };
  auto x = rnd(T * D, 1), gate = rnd(E * D, 0.3f), bias = rnd(E, 0.05f), res = rnd(T * D, 1);
  auto w1 = rnd(E * I * D, 0.2f), w3 = rnd(E * I * D, 0.2f), w2 = rnd(E * D * I, 0.3f);
  auto sg = rnd(SI * D, 0.2f), su = rnd(SI * D, 0.2f), sd = rnd(D * SI, 0.3f);
  moe::MoeArgs a;
  a.x = x.data(), a.T = T, a.D = D, a.I = I;
  a.router = {.E = E, .topk = TOPK, .num_expert_group = 3, .topk_group = 2, .routed_scaling_factor = 2.446f};
  a.gate_w = gate.data(), a.bias = bias.data();
  std::vector<int32_t> ids(T * TOPK);
  std::vector<float> w(T * TOPK), out(T * D), out_sep(T * D);
  a.topk_ids = ids.data(), a.topk_weights = w.data();
  a.w1 = w1.data(), a.w3 = w3.data(), a.w2 = w2.data();
  a.shared_I = SI, a.shared_gate = sg.data(), a.shared_up = su.data(), a.shared_down = sd.data();
  a.residual = res.data(), a.out = out.data();
  moe::moe_ref(a);

  // Separated: the caller passes (a copy of) the routing; the result must be bit-identical.
  std::vector<int32_t> ids2 = ids;
  std::vector<float> w2c = w;
  moe::MoeArgs b = a;
  b.gate_w = nullptr, b.topk_ids = ids2.data(), b.topk_weights = w2c.data(), b.out = out_sep.data();
  moe::moe_ref(b);
  EXPECT_EQ(out_sep, out);
  EXPECT_EQ(ids2, ids);  // separated routing leaves the caller's routing untouched
  EXPECT_EQ(w2c, w);

  // Hand loop in double.
  std::vector<float> ref(T * D);
  auto ffn = [&](const float* xt, const float* g, const float* u, const float* dn, int ii, std::vector<double>& y) {
    std::vector<double> h(ii);
    for (int i = 0; i < ii; ++i) {
      double a1 = 0, a3 = 0;
      for (int d = 0; d < D; ++d) a1 += double(g[i * D + d]) * xt[d], a3 += double(u[i * D + d]) * xt[d];
      h[i] = a1 / (1 + std::exp(-a1)) * a3;
    }
    y.assign(D, 0);
    for (int d = 0; d < D; ++d)
      for (int i = 0; i < ii; ++i) y[d] += double(dn[d * ii + i]) * h[i];
  };
  for (int t = 0; t < T; ++t) {
    std::vector<double> acc(D), y;
    for (int k = 0; k < TOPK; ++k) {
      const int e = ids[t * TOPK + k];
      ffn(x.data() + t * D, w1.data() + e * I * D, w3.data() + e * I * D, w2.data() + e * D * I, I, y);
      for (int d = 0; d < D; ++d) acc[d] += w[t * TOPK + k] * y[d];
    }
    ffn(x.data() + t * D, sg.data(), su.data(), sd.data(), SI, y);
    for (int d = 0; d < D; ++d) ref[t * D + d] = static_cast<float>(acc[d] + y[d] + res[t * D + d]);
  }
  EXPECT_TRUE(test::expect_close("moe block vs double hand loop", out, ref, 1e-5));
}

TEST(MoeBlock, NegativeIdsContributeNothing) {
  const int T = 1, D = 4, TOPK = 2;
  std::vector<float> expert_out = {1, 2, 3, 4, 100, 100, 100, 100};
  std::vector<int32_t> ids = {0, -1};
  std::vector<float> w = {0.5f, 9.0f}, out(4);
  moe::finalize_ref({expert_out.data(), ids.data(), w.data(), nullptr, nullptr, T, D, TOPK, out.data()});
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
}

}  // namespace
}  // namespace ds
