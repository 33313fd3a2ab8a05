// Reading deltaserve's engine step counters from a /metrics page (tools/server_steps.h).
#include <gtest/gtest.h>

#include <cmath>

#include "tools/server_steps.h"

namespace ds::tools {
namespace {

const char* kPage =
    "# HELP deltaserve_requests_running Requests holding a state slot.\n"
    "deltaserve_requests_running 2\n"
    "# TYPE deltaserve_engine_step_seconds summary\n"
    "deltaserve_engine_step_seconds_sum{kind=\"decode\"} 0.25\n"
    "deltaserve_engine_step_seconds_count{kind=\"decode\"} 100\n"
    "deltaserve_engine_step_seconds_sum{kind=\"prefill\"} 1.5e-2\r\n"
    "deltaserve_engine_step_seconds_count{kind=\"prefill\"} 3";

TEST(ServerSteps, ParsesTheFourSamplesAndIgnoresTheRest) {
  const auto s = parse_server_step_times(kPage);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->decode_steps, 100);
  EXPECT_DOUBLE_EQ(s->decode_seconds, 0.25);
  EXPECT_EQ(s->prefill_steps, 3);
  EXPECT_DOUBLE_EQ(s->prefill_seconds, 0.015);
}

TEST(ServerSteps, RefusesIncompleteOrMalformedPages) {
  EXPECT_FALSE(parse_server_step_times("").has_value());
  EXPECT_FALSE(parse_server_step_times("vllm:num_requests_running 1\n").has_value());  // another engine
  const std::string page = kPage;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string p = page;
    p.replace(p.find(from), from.size(), to);
    return parse_server_step_times(p);
  };
  EXPECT_FALSE(with("_count{kind=\"prefill\"} 3", "_count{kind=\"other\"} 3").has_value());  // one missing
  EXPECT_FALSE(with("} 100", "} 1e2x").has_value());
  EXPECT_FALSE(with("} 100", "} 100.5").has_value());  // a count is an integer
  EXPECT_FALSE(with("} 0.25", "} -0.25").has_value());
  EXPECT_FALSE(with("} 0.25", "} nan").has_value());
  EXPECT_FALSE(with("} 0.25", "} ").has_value());
  EXPECT_TRUE(with("} 100", "} 1e2").has_value());  // exponent notation is valid Prometheus text
}

TEST(ServerSteps, MeanDecodeStepOverAWindow) {
  ServerStepSample a, b;
  a.decode_steps = 10, a.decode_seconds = 0.05;
  b.decode_steps = 30, b.decode_seconds = 0.09;
  EXPECT_DOUBLE_EQ(mean_decode_step_ms(a, b), 2.0);  // 40 ms over 20 steps
  EXPECT_TRUE(std::isnan(mean_decode_step_ms(a, a)));  // no step in the window
  EXPECT_TRUE(std::isnan(mean_decode_step_ms(b, a)));  // counters went back: the server restarted
}

}  // namespace
}  // namespace ds::tools
