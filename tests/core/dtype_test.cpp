// Bit-pattern tests of the narrow-float conversions (RNE, saturation, NaN/inf, subnormals).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"

namespace ds {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(DType, Bf16Bits) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // rounds past max -> inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  EXPECT_EQ(bf16_to_f32(0x3fc0), 1.5f);
}

// The vector overloads are the scalar conversion element by element, in order, and keep empty arrays empty.
TEST(DType, Bf16VectorsConvertEachElement) {
  const std::vector<float> f = {1.0f, -2.0f, 1.0f + std::ldexp(1.0f, -8), kInf, kNaN, 0.3f, -0.0f};
  const std::vector<uint16_t> b = f32_to_bf16(f);
  ASSERT_EQ(b.size(), f.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(b[i], f32_to_bf16(f[i])) << i;
  const std::vector<float> back = bf16_to_f32(b);
  ASSERT_EQ(back.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isnan(f[i])) EXPECT_TRUE(std::isnan(back[i]));
    else EXPECT_EQ(back[i], round_bf16(f[i])) << i;
  }
  EXPECT_TRUE(f32_to_bf16(std::vector<float>{}).empty());
  EXPECT_TRUE(bf16_to_f32(std::vector<uint16_t>{}).empty());
}

TEST(DType, F16Bits) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the rounding midpoint
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // midpoint rounds to even = inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 ulp -> 1
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(kInf), 0x7c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(kNaN))));
  // Every fp16 value round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DType, E4M3Bits) {
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(kInf), 0x7e);
  EXPECT_EQ(f32_to_e4m3(kNaN) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie -> even (0)
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);  // halfway 1 .. 1.125 -> even (1.0)
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);  // halfway 1.125 .. 1.25 -> even (1.25)
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;
    ASSERT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(v))), v) << v;
  }
}

TEST(DType, E5M2Bits) {
  EXPECT_EQ(f32_to_e5m2(1.0f), 0x3c);
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(1e9f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(-kInf), 0xfb);
  EXPECT_EQ(f32_to_e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7c) == 0x7c) continue;  // inf / nan codes
    ASSERT_EQ(f32_to_e5m2(e5m2_to_f32(static_cast<uint8_t>(v))), v) << v;
  }
}

TEST(DType, E8M0Bits) {
  EXPECT_EQ(f32_to_e8m0(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0(2.0f), 128);
  EXPECT_EQ(f32_to_e8m0(0.5f), 126);
  EXPECT_EQ(f32_to_e8m0(1.4f), 127);
  EXPECT_EQ(f32_to_e8m0(1.6f), 128);
  EXPECT_EQ(f32_to_e8m0(1.5f), 128);  // tie: 127 is odd, 128 even
  EXPECT_EQ(f32_to_e8m0(3.0f), 128);  // tie between 2 (128) and 4 (129): even code
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-3.0f), 0);
  EXPECT_EQ(f32_to_e8m0(kInf), 254);
  EXPECT_EQ(f32_to_e8m0(kNaN), 255);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  // MX quantiser scale: amax / scale must fit the element range.
  EXPECT_EQ(e8m0_scale_for_amax(6.0f, 6.0f), 127);
  EXPECT_EQ(e8m0_scale_for_amax(6.1f, 6.0f), 128);
  EXPECT_EQ(e8m0_scale_for_amax(448.0f, 448.0f), 127);
  EXPECT_EQ(e8m0_scale_for_amax(0.0f, 448.0f), 127);
  EXPECT_EQ(e8m0_scale_for_amax(std::numeric_limits<float>::infinity(), 6.0f), 254);  // saturates at once
  EXPECT_EQ(e8m0_scale_for_amax(3.0e38f, 6.0f), 253);  // 3e38 / 2^126 = 4.4 <= 6
  for (int c = 1; c < 255; ++c) ASSERT_EQ(f32_to_e8m0(e8m0_to_f32(static_cast<uint8_t>(c))), c);
}

TEST(DType, E2M1Bits) {
  const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(std::fabs(v), vals[c & 7]);
    if (c != 8) {
      EXPECT_EQ(f32_to_e2m1(v), c);
    }
  }
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // tie 0 / 0.5 -> even (0)
  EXPECT_EQ(f32_to_e2m1(0.75f), 0x2);  // tie 0.5 / 1 -> even (1.0, code 2)
  EXPECT_EQ(f32_to_e2m1(2.5f), 0x4);   // tie 2 / 3 -> even (2, code 4)
  EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);   // tie 4 / 6 -> even (4, code 6)
  EXPECT_EQ(f32_to_e2m1(100.0f), 0x7); // saturates
  EXPECT_EQ(f32_to_e2m1(-kInf), 0xf);
  EXPECT_EQ(f32_to_e2m1(kNaN), 0x7);
  EXPECT_EQ(f32_to_e2m1(-1.0f), 0xa);
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_safetensors("Q4_K").has_value());
  EXPECT_EQ(dtype_bytes_for(DType::kF4E2M1, 3), 2u);
  EXPECT_STREQ(dtype_safetensors_name(DType::kF32), "F32");
}

TEST(DType, PackedFp4Storage) {
  uint8_t buf[2] = {0xff, 0xff};
  store_from_f32(buf, DType::kF4E2M1, 0, 1.0f);
  store_from_f32(buf, DType::kF4E2M1, 1, -6.0f);
  store_from_f32(buf, DType::kF4E2M1, 2, 0.5f);
  EXPECT_EQ(buf[0], 0xf2);
  EXPECT_EQ(buf[1] & 0x0f, 0x1);
  EXPECT_EQ(load_as_f32(buf, DType::kF4E2M1, 1), -6.0f);
}

}  // namespace
}  // namespace ds
