// The engine step times a deltaserve server exports on /metrics (server/engine_loop.h, StepTimes): the load
// generator reads them around each measured pass to set the clients' TPOT beside the engine's own step time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ds::tools {

struct ServerStepSample {
  int64_t decode_steps = 0, prefill_steps = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  int64_t decode_tokens = 0;        // tokens after their request's first
  double decode_token_seconds = 0;  // per decode token, the duration of the step that produced it
};

// The deltaserve_engine_step_seconds and deltaserve_engine_decode_token_step_seconds samples of a Prometheus
// text page; nullopt when the page lacks any of the six or holds a malformed one (another engine's page, or an
// older deltaserve).
std::optional<ServerStepSample> parse_server_step_times(const std::string& page);
// GET <base_url>/metrics and parse it; nullopt on any failure (not every server has the page).
std::optional<ServerStepSample> scrape_server_step_times(const std::string& base_url, const std::string& api_key,
                                                         double timeout_s = 5.0);
// Between two samples: the mean duration (ms) of the step each decode token came from, i.e. the engine's step
// time weighted as clients' TPOT weighs it; NaN when no decode token came in between or a counter went back
// (the server restarted).
double token_step_ms(const ServerStepSample& before, const ServerStepSample& after);

}  // namespace ds::tools
