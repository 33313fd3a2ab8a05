// ParsedRequest + tokenizer -> the engine Request: tokenized prompt, context-length check, sampling params.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/request_parse.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

struct PromptLimits {
  int64_t max_model_len = 4096;            // prompt + generated tokens
  int64_t default_completion_tokens = 16;  // /v1/completions without max_tokens (OpenAI's default)
};

struct PreparedRequest {
  Request engine_request;         // prompt ids + sampling (max_tokens resolved)
  std::vector<std::string> stop;  // stop strings for the text path
  int prompt_tokens = 0;
};

// Tokenizes (chat: the Kimi format with the generation prompt) and validates against the limits. Throws
// ApiException 400: empty prompt, ids outside the vocabulary, prompt + max_tokens beyond max_model_len
// (code "context_length_exceeded").
PreparedRequest prepare_request(const ParsedRequest& r, const Tokenizer& tok, const PromptLimits& limits);

}  // namespace ds::server
