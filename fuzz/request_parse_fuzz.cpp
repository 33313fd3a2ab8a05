// libFuzzer harness: request body -> parse_request -> prepare_request (byte tokenizer) -> stop strings.
// Anything but an ApiException escaping is a bug, as are invalid error JSON and a broken stop invariant.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/prompt.h"
#include "server/request_parse.h"
#include "server/stop_matcher.h"
#include "tokenizer/byte_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace ds::server;
  const Endpoint ep = (data[0] & 1) ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const ds::ByteTokenizer tok;
  ParseLimits parse_limits;
  PromptLimits prompt_limits{512, 16};
  try {
    ParsedRequest r = parse_request(ep, body, parse_limits);
    PreparedRequest p = prepare_request(r, tok, prompt_limits);
    if (p.engine_request.prompt.empty() || p.engine_request.sampling.max_tokens < 1 ||
        p.prompt_tokens + p.engine_request.sampling.max_tokens > prompt_limits.max_model_len)
      std::abort();
    p.engine_request.sampling.validate();  // what the engine will check must already hold
    // Stop strings over the prompt text in 3-byte pieces: the output is always a prefix of the text.
    if (r.prompt_text && !r.stop.empty()) {
      StopMatcher m(r.stop);
      std::string out;
      const std::string& t = *r.prompt_text;
      bool stopped = false;
      for (size_t i = 0; i < t.size() && !stopped; i += 3)
        stopped = m.push(std::string_view(t).substr(i, 3), out);
      if (!stopped) m.finish(out);
      if (t.compare(0, out.size(), out) != 0) std::abort();
    }
  } catch (const ApiException& e) {
    if (e.error.status < 400 || e.error.message.empty()) std::abort();
    (void)nlohmann::json::parse(e.error.to_json());  // must be valid JSON whatever the client sent
  }
  return 0;
}
