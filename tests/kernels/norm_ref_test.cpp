// RMSNorm references: hand-computed values, HF bf16 rounding, fused residual add.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../test_util.h"
#include "core/dtype.h"
#include "kernels/norm/norm_ref.h"

namespace ds {
namespace {

TEST(NormRef, HandComputed) {
  // x = [3, 4]: mean(x^2) = 12.5, rsqrt(12.5 + 0) = 0.28284...; w = [1, 2].
  const std::vector<float> x = {3, 4}, w = {1, 2};
  std::vector<float> y(2);
  norm::rmsnorm_ref(x.data(), w.data(), 1, 2, 0.0f, y.data());
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5f), 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 / std::sqrt(12.5f), 1e-6);
}

TEST(NormRef, EpsDominatesZeroInput) {
  const std::vector<float> x(8, 0.0f), w(8, 1.0f);
  std::vector<float> y(8, 1.0f);
  norm::rmsnorm_ref(x.data(), w.data(), 1, 8, 1e-5f, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(NormRef, Bf16RoundingFollowsHf) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const int T = 3, D = 77;  // D not a multiple of anything a kernel tiles by
  std::vector<float> x(T * D), w(D), y(T * D), y_hf(T * D);
  for (auto& v : x) v = nd(rng) * 3;
  for (auto& v : w) v = 1 + 0.1f * nd(rng);
  norm::rmsnorm_ref(x.data(), w.data(), T, D, 1e-5f, y.data());
  norm::rmsnorm_ref(x.data(), w.data(), T, D, 1e-5f, y_hf.data(), norm::Rounding::kBf16);
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int d = 0; d < D; ++d) ss += x[t * D + d] * x[t * D + d];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / D) + 1e-5f);
    for (int d = 0; d < D; ++d) EXPECT_EQ(y_hf[t * D + d], w[d] * round_bf16(x[t * D + d] * r));
  }
  // The two orders differ by bf16 resolution only (2^-9 relative).
  EXPECT_TRUE(test::expect_close("rmsnorm fp32 vs HF bf16 rounding", y_hf, y, 4e-3));
}

TEST(NormRef, FusedAddMatchesSeparate) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  const int T = 5, D = 130;
  std::vector<float> x(T * D), res(T * D), w(D);
  for (auto& v : x) v = nd(rng);
  for (auto& v : res) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  std::vector<float> sum(T * D), ref(T * D);
  for (int i = 0; i < T * D; ++i) sum[i] = x[i] + res[i];
  norm::rmsnorm_ref(sum.data(), w.data(), T, D, 1e-5f, ref.data());
  std::vector<float> y(T * D);
  norm::add_rmsnorm_ref(x.data(), res.data(), w.data(), T, D, 1e-5f, y.data());
  EXPECT_EQ(res, sum);  // residual updated in place
  EXPECT_EQ(y, ref);
}

}  // namespace
}  // namespace ds
