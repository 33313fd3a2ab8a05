// OpenAI response bodies (see openai_json.h).
#include "server/openai_json.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

namespace ds::server {
namespace {

using Json = nlohmann::ordered_json;  // fields in the order OpenAI sends them

// Generated text is valid UTF-8 (the stream decoder replaces invalid bytes), but never let a serialisation
// error escape into a handler thread.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

bool is_chat(const ResponseIds& ids) { return ids.endpoint == Endpoint::kChatCompletions; }

Json chunk_base(const ResponseIds& ids) {
  return Json{{"id", ids.id},
              {"object", is_chat(ids) ? "chat.completion.chunk" : "text_completion"},
              {"created", ids.created},
              {"model", ids.model}};
}

Json usage_json(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

Json finish_value(const std::string& reason) { return reason.empty() ? Json(nullptr) : Json(reason); }

std::string chunk(const ResponseIds& ids, Json choice, bool include_usage) {
  Json j = chunk_base(ids);
  j["choices"] = Json::array({std::move(choice)});
  if (include_usage) j["usage"] = nullptr;
  return sse(j);
}

Json chat_choice(Json delta, const std::string& finish_reason) {
  return Json{{"index", 0},
              {"delta", std::move(delta)},
              {"logprobs", nullptr},
              {"finish_reason", finish_value(finish_reason)}};
}

Json text_choice(const std::string& text, const std::string& finish_reason) {
  return Json{
      {"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_value(finish_reason)}};
}

}  // namespace

ResponseIds make_response_ids(Endpoint endpoint, const std::string& model) {
  // A process-wide random base plus a counter: unique within the process, unguessable across restarts.
  static const uint64_t base = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  ResponseIds ids;
  ids.endpoint = endpoint;
  ids.id = fmt::format("{}-{:016x}{:08x}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", base,
                       static_cast<uint32_t>(counter.fetch_add(1)));
  ids.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ids.model = model;
  return ids;
}

std::string response_json(const ResponseIds& ids, const std::string& text, const std::string& finish_reason,
                          const Usage& usage) {
  Json j = {{"id", ids.id},
            {"object", is_chat(ids) ? "chat.completion" : "text_completion"},
            {"created", ids.created},
            {"model", ids.model}};
  if (is_chat(ids)) {
    Json message = {{"role", "assistant"}, {"content", text}};
    j["choices"] = Json::array({Json{{"index", 0},
                                     {"message", std::move(message)},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish_value(finish_reason)}}});
  } else {
    j["choices"] = Json::array({text_choice(text, finish_reason)});
  }
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string role_chunk(const ResponseIds& ids, bool include_usage) {
  return chunk(ids, chat_choice(Json{{"role", "assistant"}, {"content", ""}}, ""), include_usage);
}

std::string text_chunk(const ResponseIds& ids, const std::string& text, bool include_usage) {
  if (is_chat(ids)) return chunk(ids, chat_choice(Json{{"content", text}}, ""), include_usage);
  return chunk(ids, text_choice(text, ""), include_usage);
}

std::string finish_chunk(const ResponseIds& ids, const std::string& finish_reason, bool include_usage) {
  if (is_chat(ids)) return chunk(ids, chat_choice(Json::object(), finish_reason), include_usage);
  return chunk(ids, text_choice("", finish_reason), include_usage);
}

std::string usage_chunk(const ResponseIds& ids, const Usage& usage) {
  Json j = chunk_base(ids);
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return sse(j);
}

std::string error_event(const ApiError& e) { return "data: " + e.to_json() + "\n\n"; }

std::string models_json(const std::string& model, int64_t created, int64_t max_model_len) {
  Json m = {{"id", model},
            {"object", "model"},
            {"created", created},
            {"owned_by", "deltaserve"},
            {"max_model_len", max_model_len}};
  return dump(Json{{"object", "list"}, {"data", Json::array({std::move(m)})}});
}

}  // namespace ds::server
