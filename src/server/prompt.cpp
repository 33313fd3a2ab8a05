// ParsedRequest -> engine Request (see prompt.h).
#include "server/prompt.h"

#include <algorithm>

namespace ds::server {
namespace {

[[noreturn]] void bad(std::string param, std::string message, std::string code = "") {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  throw ApiException{std::move(e)};
}

}  // namespace

PreparedRequest prepare_request(const ParsedRequest& r, const Tokenizer& tok, const PromptLimits& limits) {
  PreparedRequest out;
  std::vector<int32_t>& ids = out.engine_request.prompt;
  const char* prompt_param = r.endpoint == Endpoint::kCompletions ? "prompt" : "messages";
  if (r.endpoint == Endpoint::kCompletions) {
    if (r.prompt_ids) {
      ids = *r.prompt_ids;
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size())
          bad("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(tok.vocab_size()) + ")");
    } else if (r.prompt_text) {
      ids = tok.encode(*r.prompt_text);
    }
  } else {
    ids = tok.encode_chat(r.messages, r.add_generation_prompt, r.tools_json);
  }
  if (ids.empty()) bad(prompt_param, "the prompt must not be empty");
  out.prompt_tokens = static_cast<int>(ids.size());

  const int64_t prompt = static_cast<int64_t>(ids.size());
  const int64_t room = limits.max_model_len - prompt;
  if (room < 1)
    bad(prompt_param,
        "this model's maximum context length is " + std::to_string(limits.max_model_len) +
            " tokens, but the prompt has " + std::to_string(prompt) +
            " tokens (at least one must be left to generate)",
        "context_length_exceeded");
  int64_t max_tokens = 0;
  if (r.max_tokens) {
    max_tokens = *r.max_tokens;
    if (max_tokens > room)
      bad(r.endpoint == Endpoint::kCompletions ? "max_tokens" : "max_completion_tokens",
          "this model's maximum context length is " + std::to_string(limits.max_model_len) +
              " tokens; you requested " + std::to_string(prompt + max_tokens) + " tokens (" +
              std::to_string(prompt) + " in the prompt, " + std::to_string(max_tokens) + " to generate)",
          "context_length_exceeded");
  } else {
    // Chat defaults to the rest of the context (OpenAI: no limit); completions to OpenAI's 16.
    max_tokens =
        r.endpoint == Endpoint::kCompletions ? std::min(limits.default_completion_tokens, room) : room;
  }

  SamplingParams& s = out.engine_request.sampling;
  s.max_tokens = static_cast<int>(max_tokens);
  s.temperature = r.temperature;
  s.top_p = r.top_p;
  s.top_k = r.top_k;
  s.seed = r.seed;
  s.ignore_eos = r.ignore_eos;
  s.stop_token_ids = r.stop_token_ids;
  for (int32_t id : s.stop_token_ids)
    if (id >= tok.vocab_size())
      bad("stop_token_ids", "stop token id " + std::to_string(id) + " is outside the vocabulary");
  out.stop = r.stop;
  return out;
}

}  // namespace ds::server
