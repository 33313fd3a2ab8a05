// A/B verdicts and anomaly flags on scripted repeat data: exact verdicts.
#include <gtest/gtest.h>

#include "tools/ab.h"

namespace ds::tools {
namespace {

AbPointResult judge(std::vector<double> base, std::vector<double> cand, AbOptions o = {}) {
  return judge_ab_point({8, std::move(base), std::move(cand)}, o);
}

TEST(AbJudge, ConsistentGainIsBetter) {
  const auto r = judge({100, 101, 99}, {110, 111, 109});
  EXPECT_EQ(r.verdict, Verdict::kBetter);
  EXPECT_FALSE(r.anomaly);
  EXPECT_NEAR(r.delta_pct, 10.0, 0.01);                  // median of +10, +9.90, +10.10
  EXPECT_NEAR(r.band_pct, 2.0, 1e-9);                    // (101 - 99) / 100
  EXPECT_EQ(r.verdict_text(), "better");
}

TEST(AbJudge, ConsistentLossIsWorse) {
  const auto r = judge({100, 100, 100}, {90, 91, 89});
  EXPECT_EQ(r.verdict, Verdict::kWorse);
  EXPECT_FALSE(r.anomaly);
  EXPECT_NEAR(r.delta_pct, -10.0, 1e-9);
}

TEST(AbJudge, DeltaInsideTheBandIsParity) {
  // Candidate +2 % but the baseline's own repeats spread 3 %.
  const auto r = judge({100, 103, 101}, {103, 104, 102});
  EXPECT_EQ(r.verdict, Verdict::kParity);
  EXPECT_NEAR(r.band_pct, 300.0 / 101, 1e-9);
  EXPECT_EQ(r.verdict_text(), "parity within noise");
}

TEST(AbJudge, FloorAppliesWithOneRepeat) {
  auto r = judge({100}, {100.5});
  EXPECT_EQ(r.verdict, Verdict::kParity);  // +0.5 % < 1 % floor
  EXPECT_DOUBLE_EQ(r.band_pct, 1.0);
  EXPECT_FALSE(r.note.empty());
  r = judge({100}, {102});
  EXPECT_EQ(r.verdict, Verdict::kBetter);
}

TEST(AbJudge, OutlierRepeatIsAnAnomalyNotARegression) {
  // One candidate repeat hit a hiccup: -30 %. The median delta says parity, but the point is flagged.
  auto r = judge({100, 100, 100}, {100, 100, 70});
  EXPECT_TRUE(r.anomaly);
  EXPECT_NE(r.anomaly_reason.find("candidate"), std::string::npos);
  EXPECT_EQ(r.verdict_text().rfind("ANOMALY", 0), 0u);
  // Two of three repeats slow: the median says worse, but the repeats disagree: anomaly, never "worse".
  r = judge({100, 100, 100}, {80, 80, 105});
  EXPECT_TRUE(r.anomaly);
  EXPECT_EQ(to_json(r)["verdict"], "anomaly");
  EXPECT_EQ(r.verdict_text().find("worse"), std::string::npos);
}

TEST(AbJudge, BaselineNoiseIsAnAnomalyToo) {
  const auto r = judge({100, 100, 70}, {100, 100, 100});
  EXPECT_TRUE(r.anomaly);
  EXPECT_NE(r.anomaly_reason.find("baseline"), std::string::npos);
}

TEST(AbJudge, MaxNoiseIsConfigurable) {
  AbOptions o;
  o.max_noise_pct = 40;
  const auto r = judge({100, 100, 100}, {100, 100, 70}, o);
  EXPECT_FALSE(r.anomaly);
  EXPECT_EQ(r.verdict, Verdict::kParity);  // delta 0 inside a 30 % band
}

TEST(AbJudge, PairingCancelsSharedDrift) {
  // Both sides drift together across repeats; the paired deltas are a steady -10 %.
  AbOptions o;
  o.max_noise_pct = 50;
  const auto r = judge({100, 120, 80}, {90, 108, 72}, o);
  EXPECT_NEAR(r.delta_pct, -10.0, 1e-9);
  ASSERT_EQ(r.paired_delta_pct.size(), 3u);
  for (const double d : r.paired_delta_pct) EXPECT_NEAR(d, -10.0, 1e-9);
}

TEST(AbJudge, FailedRepeatIsAnAnomaly) {
  const auto r = judge({100, std::nan(""), 100}, {100, 100, 100});
  EXPECT_TRUE(r.anomaly);
  EXPECT_EQ(r.verdict, Verdict::kParity);
}

TEST(AbJudge, UnpairedComparesMedians) {
  AbOptions o;
  o.paired = false;
  o.noise_floor_pct = 15;
  const auto r = judge({100, 100}, {110, 112, 111}, o);
  EXPECT_TRUE(r.paired_delta_pct.empty());
  EXPECT_NEAR(r.delta_pct, 11.0, 1e-9);
  EXPECT_EQ(r.verdict, Verdict::kParity);  // within the 15 % cross-run floor
}

TEST(AbJudge, PairedNeedsEqualRepeats) { EXPECT_THROW(judge({1, 2}, {1}), std::exception); }

}  // namespace
}  // namespace ds::tools
