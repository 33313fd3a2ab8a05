// KDA references cross-checked: chunked (chunk 64) == token-by-token recurrence; conv and norm definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/kda/kda_ref.h"
#include "tests/test_util.h"

namespace ds {
namespace {

struct Problem {
  std::vector<int32_t> cu;
  int H, K, V;
  std::vector<float> q, k, v, g, beta, h0;
  int T() const { return cu.back(); }
  int N() const { return static_cast<int>(cu.size()) - 1; }
};

// Random KDA inputs as the fla tests draw them: g = logsigmoid(randn) / 16 style decays, beta = sigmoid(randn).
Problem make_problem(std::vector<int32_t> lens, int H, int K, int V, uint64_t seed) {
  Problem p;
  p.cu = {0};
  for (int l : lens) p.cu.push_back(p.cu.back() + l);
  p.H = H, p.K = K, p.V = V;
  const size_t T = p.T();
  p.q = test::randn(T * H * K, seed + 1);
  p.k = test::randn(T * H * K, seed + 2);
  p.v = test::randn(T * H * V, seed + 3);
  p.g = test::randn(T * H * K, seed + 4);
  for (auto& x : p.g) x = -std::log1p(std::exp(-x)) / 8.0f;  // logsigmoid(x)/8: in (-inf, 0)
  p.beta = test::randn(T * H, seed + 5);
  for (auto& x : p.beta) x = 1.0f / (1.0f + std::exp(-x));
  p.h0 = test::randn(static_cast<size_t>(p.N()) * H * K * V, seed + 6, 0.5f);
  return p;
}

kda::RecurrenceArgs args_of(const Problem& p) {
  return {p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(), p.cu.data(),
          p.N(), p.H, p.K, p.V, 1.0f / std::sqrt(static_cast<float>(p.K)), true};
}

TEST(KdaRef, ChunkedEqualsRecurrentVarlen) {
  // T not a multiple of 64, an empty sequence, a single token, and a multi-chunk one.
  const Problem p = make_problem({130, 0, 1, 64, 77}, 3, 128, 128, 7);
  std::vector<float> s_rec = p.h0, s_chk = p.h0;
  std::vector<float> o_rec(p.T() * p.H * p.V, NAN), o_chk(p.T() * p.H * p.V, NAN);
  kda::recurrent_ref(args_of(p), s_rec.data(), o_rec.data());
  kda::chunked_ref(args_of(p), s_chk.data(), o_chk.data(), 64);
  EXPECT_CLOSE("chunked vs recurrent: output", o_chk, o_rec, 1e-4);
  EXPECT_CLOSE("chunked vs recurrent: final state", s_chk, s_rec, 1e-4);
}

TEST(KdaRef, ChunkSizesAgree) {
  const Problem p = make_problem({100, 33}, 2, 64, 32, 11);
  std::vector<float> s16 = p.h0, s64 = p.h0;
  std::vector<float> o16(p.T() * p.H * p.V, NAN), o64(p.T() * p.H * p.V, NAN);
  kda::chunked_ref(args_of(p), s16.data(), o16.data(), 16);
  kda::chunked_ref(args_of(p), s64.data(), o64.data(), 64);
  EXPECT_CLOSE("chunk 16 vs chunk 64: output", o16, o64, 1e-4);
  EXPECT_CLOSE("chunk 16 vs chunk 64: state", s16, s64, 1e-4);
}

TEST(KdaRef, PrefillThenDecodeEqualsWholeSequence) {
  const Problem p = make_problem({90}, 2, 128, 128, 21);
  std::vector<float> s_all = p.h0, o_all(p.T() * p.H * p.V);
  kda::recurrent_ref(args_of(p), s_all.data(), o_all.data());
  // Prefill 70 tokens chunked, then decode the remaining 20 one at a time with the recurrence.
  std::vector<float> s = p.h0, o(p.T() * p.H * p.V, NAN);
  Problem pre = p;
  pre.cu = {0, 70};
  kda::chunked_ref(args_of(pre), s.data(), o.data(), 64);
  for (int t = 70; t < 90; ++t) {
    Problem step = p;
    const int32_t cu[2] = {0, 1};
    auto a = args_of(step);
    const size_t qo = static_cast<size_t>(t) * p.H * p.K, vo = static_cast<size_t>(t) * p.H * p.V;
    a.q += qo, a.k += qo, a.g += qo, a.v += vo, a.beta += static_cast<size_t>(t) * p.H;
    a.cu_seqlens = cu;
    kda::recurrent_ref(a, s.data(), o.data() + vo);
  }
  EXPECT_CLOSE("prefill+decode vs whole: output", o, o_all, 1e-4);
  EXPECT_CLOSE("prefill+decode vs whole: state", s, s_all, 1e-4);
}

TEST(KdaRef, RecurrenceMatchesClosedFormSingleStep) {
  // One token from a zero state: S = beta k^ v^T, o = (q^ . k^) beta v.
  const int K = 4, V = 3;
  std::vector<float> q = {1, 0, 0, 0}, k = {2, 0, 0, 0}, v = {1, 2, 3}, g(K, -0.5f), beta = {0.5f};
  std::vector<int32_t> cu = {0, 1};
  std::vector<float> S(K * V, 0.0f), o(V);
  kda::recurrent_ref({q.data(), k.data(), v.data(), g.data(), beta.data(), cu.data(), 1, 1, K, V, 1.0f, true},
                     S.data(), o.data());
  const float kn = 2.0f / std::sqrt(4.0f + kda::kL2NormEps), qn = 1.0f / std::sqrt(1.0f + kda::kL2NormEps);
  for (int e = 0; e < V; ++e) {
    EXPECT_NEAR(S[e], 0.5f * kn * v[e], 1e-6);
    EXPECT_NEAR(o[e], qn * kn * 0.5f * v[e], 1e-6);
  }
}

TEST(KdaRef, ShortConvStateCarriesAcrossCalls) {
  const int C = 5, W = 4, T = 9;
  auto x = test::randn(T * C, 3), w = test::randn(C * W, 4);
  std::vector<int32_t> cu_all = {0, T};
  std::vector<float> st_all(3 * C, 0.0f), y_all(T * C);
  kda::short_conv_ref(x.data(), w.data(), cu_all.data(), 1, C, W, st_all.data(), y_all.data());
  // Same tokens fed as 2 + 1 + 6 with the state carried: identical outputs and final state.
  std::vector<float> st(3 * C, 0.0f), y(T * C, NAN);
  int off = 0;
  for (int len : {2, 1, 0, 6}) {
    std::vector<int32_t> cu = {0, len};
    kda::short_conv_ref(x.data() + off * C, w.data(), cu.data(), 1, C, W, st.data(), y.data() + off * C);
    off += len;
  }
  EXPECT_CLOSE("conv split vs whole", y, y_all, 1e-7);
  EXPECT_CLOSE("conv state split vs whole", st, st_all, 1e-7);
  // First output from a zero state is silu(w[c,3] * x_0[c]).
  for (int c = 0; c < C; ++c) {
    const float z = w[c * W + 3] * x[c];
    EXPECT_NEAR(y_all[c], z / (1 + std::exp(-z)), 1e-6);
  }
}

TEST(KdaRef, GateAndGatedNorm) {
  const int T = 2, H = 2, K = 3;
  std::vector<float> f = {0, 1, -1, 25, 2, 3, -30, 0, 0, 0.5f, 0.5f, 0.5f}, A_log = {0.0f, std::log(2.0f)};
  std::vector<float> dt(H * K, 0.1f), g(T * H * K);
  kda::gate_ref(f.data(), A_log.data(), dt.data(), T, H, K, g.data());
  EXPECT_NEAR(g[0], -std::log1p(std::exp(0.1f)), 1e-6);
  EXPECT_NEAR(g[3], -2.0f * 25.1f, 1e-4);  // softplus threshold 20: identity
  for (float x : g) EXPECT_LE(x, 0.0f);
  std::vector<float> o = {3, 4}, gz = {0, 100}, w = {1, 2}, out(2);
  kda::gated_rmsnorm_ref(o.data(), gz.data(), w.data(), 1, 1, 2, 0.0f, out.data());
  const float r = 1.0f / std::sqrt(12.5f);
  EXPECT_NEAR(out[0], 3 * r * 0.5f, 1e-6);
  EXPECT_NEAR(out[1], 4 * r * 2.0f, 1e-5);
}

}  // namespace
}  // namespace ds
