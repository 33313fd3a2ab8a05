// OpenAI request bodies -> validated ParsedRequest, or an ApiError (OpenAI-style JSON error with HTTP
// status).
//
// No HTTP, no tokenizer, no engine: callable on any bytes (the request_parse fuzzer does exactly that).
// Unknown fields are ignored; known fields of the wrong type or out of range are a 400 naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ds::server {

// The `error` object of an OpenAI error response, with the HTTP status it is sent with.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // invalid_request_error | authentication_error | ...
  std::string param;                           // the offending field, "" if none
  std::string code;                            // e.g. "model_not_found", "context_length_exceeded"

  std::string to_json() const;  // {"error": {"message", "type", "param", "code"}} (empty -> null)
};

// Thrown by the parsing and preparation functions; carries the response to send.
struct ApiException {
  ApiError error;
};

enum class Endpoint { kCompletions, kChatCompletions };

// Limits the parser enforces (the server passes its own; the defaults are what `serve` uses).
struct ParseLimits {
  int max_json_depth = 64;       // nlohmann's dump() recurses: a 10^6-deep tools array would blow the stack
  size_t max_stop_strings = 16;  // OpenAI allows 4; more only costs matching time
  size_t max_stop_bytes = 1024;  // per stop string
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when the client sent none

  // /v1/completions: exactly one of prompt_text / prompt_ids is set.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;

  // /v1/chat/completions
  std::vector<ChatMessage> messages;
  std::string tools_json;  // compact JSON of `tools`, key order kept; "" without tools
  bool add_generation_prompt = true;

  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens; unset = server default
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int top_k = 0;  // 0 (or -1 on the wire) = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings, matched on the detokenized text
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  // extension (benchmarks): generate exactly max_tokens
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses and validates a request body. Throws ApiException (status 400; 404 is for the caller's model check).
ParsedRequest parse_request(Endpoint endpoint, std::string_view body, const ParseLimits& limits = {});

}  // namespace ds::server
