// Knob parser: defaults, clamping with a warning, and start-up errors for non-integers.
#include <gtest/gtest.h>

#include "core/env.h"
#include "core/error.h"

namespace ds {
namespace {

const IntKnob kTest{"DELTASERVE_TEST_KNOB", 2, 0, 16, "test"};

std::string error_of(const char* v) {
  try {
    parse_int_knob(kTest, v);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Env, DefaultWhenUnset) { EXPECT_EQ(parse_int_knob(kTest, nullptr), 2); }

TEST(Env, InRange) {
  EXPECT_EQ(parse_int_knob(kTest, "0"), 0);
  EXPECT_EQ(parse_int_knob(kTest, "16"), 16);
  EXPECT_EQ(parse_int_knob(kTest, "+7"), 7);
}

TEST(Env, ClampedOutOfRange) {
  EXPECT_EQ(parse_int_knob(kTest, "17"), 16);
  EXPECT_EQ(parse_int_knob(kTest, "100000"), 16);
  EXPECT_EQ(parse_int_knob(kTest, "-1"), 0);
}

TEST(Env, NonIntegerStopsStartup) {
  for (const char* bad : {"2x", "", "1e3", " 3", "3 ", "0x10", "1.0", "-", "abc", "99999999999999999999999"}) {
    const std::string msg = error_of(bad);
    ASSERT_FALSE(msg.empty()) << "accepted '" << bad << "'";
    EXPECT_NE(msg.find("DELTASERVE_TEST_KNOB"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 16]"), std::string::npos) << msg;
  }
}

TEST(Env, ChoiceKnob) {
  EXPECT_EQ(parse_choice_knob(knobs::kKdaLayout, nullptr), "auto");
  EXPECT_EQ(parse_choice_knob(knobs::kKdaLayout, "compact"), "compact");
  try {
    parse_choice_knob(knobs::kKdaLayout, "fast");
    FAIL() << "accepted 'fast'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto|compact|many|stream"), std::string::npos);
  }
}

TEST(Env, RegistryDeclaresFusedKnob) {
  EXPECT_EQ(knobs::kFusedFinalizeArNormMaxTokens.default_value, 2);
  EXPECT_EQ(knobs::kFusedFinalizeArNormMaxTokens.min, 0);
  EXPECT_EQ(knobs::kFusedFinalizeArNormMaxTokens.max, 16);
  EXPECT_NE(knobs::help_text().find("DELTASERVE_FP8_KDA_PROJ"), std::string::npos);
}

TEST(Env, MoeFp8PrefillTileKnob) {
  // 0 = the measured rule; 64 / 128 pass through; other in-range values reach moe_unsupported, which refuses them
  // at set-up (MoeHost.Fp8PrefillTileRows); out of range clamps like every integer knob.
  EXPECT_EQ(parse_int_knob(knobs::kMoeFp8PrefillTile, nullptr), 0);
  EXPECT_EQ(parse_int_knob(knobs::kMoeFp8PrefillTile, "128"), 128);
  EXPECT_EQ(parse_int_knob(knobs::kMoeFp8PrefillTile, "64"), 64);
  EXPECT_EQ(parse_int_knob(knobs::kMoeFp8PrefillTile, "4096"), 128);
  EXPECT_THROW(parse_int_knob(knobs::kMoeFp8PrefillTile, "big"), Error);
  EXPECT_NE(knobs::help_text().find("DELTASERVE_MOE_FP8_PREFILL_TILE"), std::string::npos);
}

TEST(Env, MoeStreamTilesKnob) {
  // 0 = the measured rule; 1 / 2 / 4 / 8 pass through; 3, 5-7 reach moe_unsupported (MoeHost.StreamTokenTiles).
  EXPECT_EQ(parse_int_knob(knobs::kMoeStreamTiles, nullptr), 0);
  EXPECT_EQ(parse_int_knob(knobs::kMoeStreamTiles, "2"), 2);
  EXPECT_THROW(parse_int_knob(knobs::kMoeStreamTiles, "two"), Error);
  EXPECT_NE(knobs::help_text().find("DELTASERVE_MOE_STREAM_TILES"), std::string::npos);
}

TEST(Env, MoeGemvTokensKnob) {
  // 0 = the measured rule; 1..32 pass through to MoeParams::gemv_tokens; out of range clamps.
  EXPECT_EQ(parse_int_knob(knobs::kMoeGemvTokens, nullptr), 0);
  EXPECT_EQ(parse_int_knob(knobs::kMoeGemvTokens, "8"), 8);
  EXPECT_EQ(parse_int_knob(knobs::kMoeGemvTokens, "32"), 32);
  EXPECT_EQ(parse_int_knob(knobs::kMoeGemvTokens, "64"), 32);
  EXPECT_THROW(parse_int_knob(knobs::kMoeGemvTokens, "all"), Error);
  EXPECT_NE(knobs::help_text().find("DELTASERVE_MOE_GEMV_TOKENS"), std::string::npos);
}

TEST(Env, FromEnvironment) {
  setenv("DELTASERVE_TEST_KNOB", "5", 1);
  EXPECT_EQ(get_knob(kTest), 5);
  setenv("DELTASERVE_TEST_KNOB", "five", 1);
  EXPECT_THROW(get_knob(kTest), Error);
  unsetenv("DELTASERVE_TEST_KNOB");
}

}  // namespace
}  // namespace ds
