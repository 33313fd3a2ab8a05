// Reading deltaserve's engine step counters from a /metrics page (tools/server_steps.h).
#include <gtest/gtest.h>

#include <cmath>

#include "tools/bench.h"
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
    "deltaserve_engine_step_seconds_count{kind=\"prefill\"} 3\n"
    "deltaserve_engine_decode_token_step_seconds_sum 0.75\n"
    "deltaserve_engine_decode_token_step_seconds_count 250";

TEST(ServerSteps, ParsesTheSixSamplesAndIgnoresTheRest) {
  const auto s = parse_server_step_times(kPage);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->decode_steps, 100);
  EXPECT_DOUBLE_EQ(s->decode_seconds, 0.25);
  EXPECT_EQ(s->prefill_steps, 3);
  EXPECT_DOUBLE_EQ(s->prefill_seconds, 0.015);
  EXPECT_EQ(s->decode_tokens, 250);
  EXPECT_DOUBLE_EQ(s->decode_token_seconds, 0.75);
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
  EXPECT_FALSE(with("token_step_seconds_count 250", "token_step_seconds_count{x=\"y\"} 250").has_value());
  EXPECT_FALSE(with("} 100", "} 1e2x").has_value());
  EXPECT_FALSE(with("} 100", "} 100.5").has_value());  // a count is an integer
  EXPECT_FALSE(with("} 0.25", "} -0.25").has_value());
  EXPECT_FALSE(with("} 0.25", "} nan").has_value());
  EXPECT_FALSE(with("} 0.25", "} ").has_value());
  EXPECT_TRUE(with("} 100", "} 1e2").has_value());  // exponent notation is valid Prometheus text
}

TEST(ServerSteps, TokenWeightedStepOverAWindow) {
  ServerStepSample a, b;
  a.decode_tokens = 10, a.decode_token_seconds = 0.05;
  b.decode_tokens = 30, b.decode_token_seconds = 0.09;
  EXPECT_DOUBLE_EQ(token_step_ms(a, b), 2.0);  // 40 ms over 20 tokens
  EXPECT_TRUE(std::isnan(token_step_ms(a, a)));  // no decode token in the window
  EXPECT_TRUE(std::isnan(token_step_ms(b, a)));  // counters went back: the server restarted
}

// The client side of TPOT / step: every decode interval counts once, whichever request it belongs to.
TEST(ServerSteps, TokenWeightedTpotOfAPass) {
  std::vector<RequestTiming> reqs(4);
  reqs[0].ok = true, reqs[0].ttft_ms = 100, reqs[0].latency_ms = 190, reqs[0].output_tokens = 10;  // 9 x 10 ms
  reqs[1].ok = true, reqs[1].ttft_ms = 50, reqs[1].latency_ms = 70, reqs[1].output_tokens = 2;     // 1 x 20 ms
  reqs[2].ok = true, reqs[2].ttft_ms = 50, reqs[2].latency_ms = 50, reqs[2].output_tokens = 1;     // no interval
  reqs[3].ok = false, reqs[3].ttft_ms = 10, reqs[3].latency_ms = 999, reqs[3].output_tokens = 5;   // failed
  EXPECT_DOUBLE_EQ(token_weighted_tpot_ms(reqs), 110.0 / 10);  // the per-request mean of TPOT would be 15
  EXPECT_TRUE(std::isnan(token_weighted_tpot_ms({reqs[2], reqs[3]})));
}

}  // namespace
}  // namespace ds::tools
