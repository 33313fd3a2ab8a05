// OpenAI response bodies: completions, chat completions, their stream chunks, usage, the model list.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "server/request_parse.h"

namespace ds::server {

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// Identity of one response: every chunk of a stream repeats it.
struct ResponseIds {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

// A fresh id with the endpoint's prefix (random 96 bits, hex).
ResponseIds make_response_ids(Endpoint endpoint, const std::string& model);

// Non-streaming response body.
std::string response_json(const ResponseIds& ids, const std::string& text, const std::string& finish_reason,
                          const Usage& usage);

// One SSE event "data: {...}\n\n". Chat: the first chunk carries the role (role_chunk), text chunks the
// content delta, the last one an empty delta and the finish reason. With include_usage every chunk has
// "usage": null and usage_chunk (empty choices) comes last, as OpenAI sends it.
std::string role_chunk(const ResponseIds& ids, bool include_usage);
std::string text_chunk(const ResponseIds& ids, const std::string& text, bool include_usage);
std::string finish_chunk(const ResponseIds& ids, const std::string& finish_reason, bool include_usage);
std::string usage_chunk(const ResponseIds& ids, const Usage& usage);
// An error inside an already started stream: "data: {"error": {...}}\n\n".
std::string error_event(const ApiError& e);
inline constexpr const char* kDoneEvent = "data: [DONE]\n\n";

std::string models_json(const std::string& model, int64_t created, int64_t max_model_len);

}  // namespace ds::server
