// util CPU definitions: the Philox generator against the Random123 known-answer vectors, the fill's
// distributions (the same expression the CUDA kernel evaluates), and the SwiGLU product.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/util/fill_value.h"
#include "kernels/util/util_ref.h"

namespace ds::util {
namespace {

TEST(UtilRef, PhiloxMatchesRandom123KnownAnswers) {
  using detail::Philox4;
  struct Kat { Philox4 ctr; uint32_t k0, k1; Philox4 want; };
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = detail::philox4x32_10(k.ctr, k.k0, k.k1);
    EXPECT_EQ(r.x, k.want.x);
    EXPECT_EQ(r.y, k.want.y);
    EXPECT_EQ(r.z, k.want.z);
    EXPECT_EQ(r.w, k.want.w);
  }
}

TEST(UtilRef, FillDistributions) {
  const int64_t n = 1 << 20;
  FillParams p;
  p.n = n;
  p.dtype = DType::kF32;
  p.seed = 5;
  std::vector<float> v(n);
  p.out = v.data();
  p.a = 0.5f;
  p.b = 2.0f;
  fill_random_ref(p);
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  const double mean = s / n;
  for (float x : v) s2 += (x - mean) * (x - mean);
  std::printf("[stat] cpu normal(0.5, 2): mean %.5f sd %.5f\n", mean, std::sqrt(s2 / n));
  EXPECT_NEAR(mean, 0.5, 0.01);
  EXPECT_NEAR(std::sqrt(s2 / n), 2.0, 0.01);
  // Element values depend on (seed, index) only.
  EXPECT_EQ(fill_value_ref(p, 12345), v[12345]);
  p.seed = 6;
  EXPECT_NE(fill_value_ref(p, 12345), v[12345]);

  p.dist = FillDist::kUniform;
  p.map = FillMap::kInvSoftplus;
  p.a = 0.001f;
  p.b = 0.1f;
  fill_random_ref(p);
  for (float x : v) {
    const double sp = std::log1p(std::exp(static_cast<double>(x)));
    ASSERT_GE(sp, 0.001 * 0.9999);
    ASSERT_LT(sp, 0.1 * 1.0001);
  }
  p.map = FillMap::kLog1p15;
  p.a = 0.0f;
  p.b = 1.0f;
  fill_random_ref(p);
  for (float x : v) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, std::log(16.0f) + 1e-6f);
  }
  p.dist = FillDist::kConst;
  p.map = FillMap::kNone;
  p.a = 1.0f;
  p.dtype = DType::kBF16;
  std::vector<uint16_t> b(n);
  p.out = b.data();
  fill_random_ref(p);
  for (uint16_t x : b) ASSERT_EQ(x, f32_to_bf16(1.0f));
}

TEST(UtilRef, SiluMul) {
  // x rows [g0 g1 | u0 u1] with a padded stride of 5.
  const float x[] = {0.0f, 1.0f, 2.0f, 3.0f, 99.0f, -1.0f, 20.0f, 0.5f, -2.0f, 99.0f};
  float y[4];
  silu_mul_ref(x, 5, 2, 2, y);
  EXPECT_FLOAT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 1.0 / (1.0 + std::exp(-1.0)) * 3.0, 1e-6);
  EXPECT_NEAR(y[2], -1.0 / (1.0 + std::exp(1.0)) * 0.5, 1e-6);
  EXPECT_NEAR(y[3], 20.0 / (1.0 + std::exp(-20.0)) * -2.0, 1e-4);
}

}  // namespace
}  // namespace ds::util
