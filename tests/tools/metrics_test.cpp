// Metric math on synthetic timestamps: exact values, no network.
#include <gtest/gtest.h>

#include <cmath>

#include "tools/metrics.h"
#include "tools/stats.h"

namespace ds::tools {
namespace {

RequestTiming req(double start_s, double ttft, double gap, int chunks, int64_t tokens) {
  RequestTiming r;
  r.ok = true;
  r.start_s = start_s;
  r.ttft_ms = ttft;
  for (int i = 0; i < chunks; ++i) r.chunk_ms.push_back(ttft + gap * i);
  r.latency_ms = r.chunk_ms.back();
  r.output_tokens = tokens;
  r.output_from_usage = true;
  r.input_tokens = 100;
  r.requested_output_tokens = tokens;
  return r;
}

TEST(Stats, PercentileInterpolatesLinearly) {
  const std::vector<double> v = {4, 1, 3, 2};  // sorted 1 2 3 4
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);  // pos 2.7 -> 3 + 0.7
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
  const Summary s = summarize({10, 20, 30, 40, 50});
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 30);
  EXPECT_DOUBLE_EQ(s.median, 30);
  EXPECT_DOUBLE_EQ(s.p90, 46);
  EXPECT_DOUBLE_EQ(s.p99, 49.6);
}

TEST(Metrics, TpotExcludesTheFirstTokenAndUsesTokensNotChunks) {
  // 100 ms to the first chunk, 16 tokens in 8 chunks 20 ms apart: the last chunk at 240 ms.
  RequestTiming r = req(0, 100, 20, 8, 16);
  EXPECT_DOUBLE_EQ(tpot_ms(r), (240.0 - 100.0) / 15.0);
  const auto gaps = itl_ms(r);
  ASSERT_EQ(gaps.size(), 7u);
  for (const double g : gaps) EXPECT_DOUBLE_EQ(g, 20);
  r.output_tokens = 1;
  EXPECT_TRUE(std::isnan(tpot_ms(r)));  // no decode interval
  r.output_tokens = 16;
  r.ok = false;
  EXPECT_TRUE(std::isnan(tpot_ms(r)));
  EXPECT_TRUE(itl_ms(r).empty());
}

TEST(Metrics, PointMetricsExact) {
  // Two users, two requests each, back to back. TPOTs 10, 10, 20, 20 ms -> median 15 -> tps/user 66.67.
  std::vector<RequestTiming> v = {req(0.0, 50, 10, 11, 11), req(0.15, 50, 10, 11, 11),
                                  req(0.0, 40, 20, 6, 6), req(0.14, 40, 20, 6, 6)};
  // Request 1 ends at 0.15 + 0.150 = 0.30 s, which is the last end; the first start is 0.
  const PointMetrics m = compute_point_metrics(v);
  EXPECT_EQ(m.requests, 4);
  EXPECT_EQ(m.ok, 4);
  EXPECT_EQ(m.failed, 0);
  EXPECT_DOUBLE_EQ(m.duration_s, 0.30);
  EXPECT_EQ(m.output_tokens, 34);
  EXPECT_EQ(m.input_tokens, 400);
  EXPECT_DOUBLE_EQ(m.output_tps, 34 / 0.30);
  EXPECT_DOUBLE_EQ(m.input_tps, 400 / 0.30);
  EXPECT_DOUBLE_EQ(m.request_rate, 4 / 0.30);
  EXPECT_DOUBLE_EQ(m.tpot_ms.median, 15);
  EXPECT_DOUBLE_EQ(m.tps_per_user, 1000.0 / 15);
  EXPECT_DOUBLE_EQ(m.ttft_ms.mean, 45);
  EXPECT_DOUBLE_EQ(m.ttft_ms.median, 45);
  EXPECT_EQ(m.itl_ms.n, 2u * 10 + 2u * 5);
  EXPECT_DOUBLE_EQ(m.itl_ms.min, 10);
  EXPECT_DOUBLE_EQ(m.itl_ms.max, 20);
  EXPECT_DOUBLE_EQ(m.e2e_ms.max, 150);
}

TEST(Metrics, FailedRequestsCountInDurationButNotInLatencies) {
  RequestTiming bad;
  bad.ok = false;
  bad.error = "HTTP 500";
  bad.start_s = 0;
  bad.latency_ms = 500;  // the slot was busy for 0.5 s
  std::vector<RequestTiming> v = {req(0, 100, 10, 11, 11), bad};
  const PointMetrics m = compute_point_metrics(v);
  EXPECT_EQ(m.ok, 1);
  EXPECT_EQ(m.failed, 1);
  EXPECT_DOUBLE_EQ(m.duration_s, 0.5);
  EXPECT_EQ(m.e2e_ms.n, 1u);
  EXPECT_DOUBLE_EQ(m.output_tps, 11 / 0.5);
}

TEST(Metrics, ShortOutputsAndChunkCountsAreReported) {
  RequestTiming a = req(0, 10, 10, 5, 5);
  a.requested_output_tokens = 8;  // stopped at EOS
  RequestTiming b = req(0, 10, 10, 5, 5);
  b.output_from_usage = false;
  const PointMetrics m = compute_point_metrics({a, b});
  EXPECT_EQ(m.short_outputs, 1);
  EXPECT_EQ(m.counted_from_usage, 1);
}

TEST(Metrics, NoUsableTpotLeavesTpsPerUserUndefined) {
  const PointMetrics m = compute_point_metrics({req(0, 10, 10, 1, 1)});
  EXPECT_TRUE(std::isnan(m.tps_per_user));
  EXPECT_TRUE(std::isnan(compute_point_metrics({}).tps_per_user));
}

TEST(Metrics, DefinitionsSayThroughputExcludesInput) {
  const std::string md = metric_definitions_markdown();
  for (const char* k : {"TTFT", "TPOT", "ITL", "E2E", "tps/user", "output tok/s", "input tok/s"}) {
    EXPECT_NE(md.find(k), std::string::npos) << k;
  }
  EXPECT_NE(md.find("NOT included"), std::string::npos);
  EXPECT_NE(md.find("1000 / median TPOT"), std::string::npos);
}

TEST(Metrics, JsonRoundTripKeepsNaNAsNull) {
  const PointMetrics m = compute_point_metrics({req(0, 10, 10, 1, 1)});
  const auto j = to_json(m);
  EXPECT_TRUE(j["tps_per_user"].is_null());
  const PointMetrics back = point_metrics_from_json(j);
  EXPECT_TRUE(std::isnan(back.tps_per_user));
  const PointMetrics m2 = compute_point_metrics({req(0, 100, 10, 11, 11)});
  EXPECT_DOUBLE_EQ(point_metrics_from_json(to_json(m2)).tps_per_user, m2.tps_per_user);
}

}  // namespace
}  // namespace ds::tools
