// OpenAI request bodies -> ParsedRequest (see request_parse.h).
#include "server/request_parse.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace ds::server {
namespace {

// ordered_json keeps the client's key order, which the tools declaration must reproduce (Jinja's tojson
// does not sort keys).
using Json = nlohmann::ordered_json;

[[noreturn]] void bad(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  throw ApiException{std::move(e)};
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    case Json::value_t::binary:
      return "binary";
    case Json::value_t::discarded:
      return "discarded";
    default:
      return v.is_number_float() ? "number" : "integer";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const Json& got) {
  bad(param, "'" + param + "' must be " + want + ", got " + type_name(got));
}

// A field that is absent or null counts as not given (OpenAI clients send null for unset options).
const Json* field(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const Json& v, const std::string& param, int64_t lo, int64_t hi) {
  // 16.0 is a float in JSON; OpenAI rejects it for integer fields, and so do we.
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(param, "'" + param + "' is out of range");
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(param, "'" + param + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                   ", got " + std::to_string(x));
  return x;
}

float get_float(const Json& v, const std::string& param, double lo, double hi, bool lo_open) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
    std::string range = (lo_open ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    bad(param, "'" + param + "' must be in " + range + ", got " + v.dump());
  }
  return static_cast<float>(x);
}

bool get_bool(const Json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

const std::string& get_string(const Json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

std::vector<int32_t> get_token_ids(const Json& arr, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& t : arr) {
    if (!t.is_number_integer()) bad(param, "'" + param + "' must hold integer token ids");
    // Non-negative JSON integers parse as unsigned: compare in the type they hold.
    const bool in_range =
        t.is_number_unsigned()
            ? t.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
            : t.get<int64_t>() >= 0 && t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!in_range) bad(param, "token id " + t.dump() + " in '" + param + "' is out of range");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// prompt: "text" | ["text"] | [ids...] | [[ids...]]. One prompt per request (n = 1 only, no batches).
void parse_prompt(const Json& p, ParsedRequest& r) {
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    return;
  }
  if (!p.is_array()) wrong_type("prompt", "a string, an array of one string, or an array of token ids", p);
  if (p.empty()) bad("prompt", "'prompt' must not be empty");
  if (p[0].is_number()) {
    r.prompt_ids = get_token_ids(p, "prompt");
    return;
  }
  if (p.size() != 1)
    bad("prompt", "only one prompt per request is supported (got " + std::to_string(p.size()) + ")");
  if (p[0].is_string())
    r.prompt_text = p[0].get<std::string>();
  else if (p[0].is_array())
    r.prompt_ids = get_token_ids(p[0], "prompt");
  else
    wrong_type("prompt", "a string, an array of one string, or an array of token ids", p);
}

// content: "text" | null | [{"type": "text", "text": "..."}, ...] (the parts are joined, as the Kimi template
// does).
std::string parse_content(const Json* c, const std::string& param) {
  if (c == nullptr) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) wrong_type(param, "a string or an array of content parts", *c);
  std::string out;
  for (const auto& part : *c) {
    if (!part.is_object()) bad(param, "'" + param + "' parts must be objects");
    const Json* type = field(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text")
      bad(param, "only text content parts are supported");
    const Json* text = field(part, "text");
    if (text == nullptr) bad(param, "a text content part needs 'text'");
    out += get_string(*text, param + ".text");
  }
  return out;
}

// Assistant tool calls in the Kimi format (spec section 7), appended to the content:
// <|tool_calls_section_begin|><|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>
// ...<|tool_calls_section_end|>. A string `arguments` is used verbatim (it already is JSON text), an object
// as compact JSON.
std::string render_tool_calls(const Json& calls, const std::string& param) {
  if (!calls.is_array()) wrong_type(param, "an array", calls);
  if (calls.empty()) return "";
  std::string out = "<|tool_calls_section_begin|>";
  for (size_t i = 0; i < calls.size(); ++i) {
    const Json& c = calls[i];
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!c.is_object()) wrong_type(p, "an object", c);
    const Json* id = field(c, "id");
    const Json* fn = field(c, "function");
    if (fn == nullptr || !fn->is_object()) bad(p + ".function", "a tool call needs a 'function' object");
    std::string args = "{}";
    if (const Json* a = field(*fn, "arguments")) args = a->is_string() ? a->get<std::string>() : a->dump();
    out += "<|tool_call_begin|>";
    out += id != nullptr ? get_string(*id, p + ".id") : "";
    out += "<|tool_call_argument_begin|>" + args + "<|tool_call_end|>";
  }
  return out + "<|tool_calls_section_end|>";
}

void parse_messages(const Json& msgs, ParsedRequest& r) {
  if (!msgs.is_array()) wrong_type("messages", "an array", msgs);
  if (msgs.empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(p, "an object", m);
    const Json* role = field(m, "role");
    if (role == nullptr) bad(p + ".role", "'" + p + ".role' is required");
    ChatMessage cm;
    cm.role = get_string(*role, p + ".role");
    if (cm.role.empty()) bad(p + ".role", "'" + p + ".role' must not be empty");
    cm.content = parse_content(field(m, "content"), p + ".content");
    if (const Json* n = field(m, "name")) cm.name = get_string(*n, p + ".name");
    if (const Json* t = field(m, "tool_call_id")) cm.tool_call_id = get_string(*t, p + ".tool_call_id");
    if (const Json* tc = field(m, "tool_calls")) cm.content += render_tool_calls(*tc, p + ".tool_calls");
    r.messages.push_back(std::move(cm));
  }
}

void parse_stop(const Json& s, const ParseLimits& limits, ParsedRequest& r) {
  auto add = [&](const Json& v) {
    const std::string& str = get_string(v, "stop");
    if (str.empty()) bad("stop", "stop strings must not be empty");
    if (str.size() > limits.max_stop_bytes)
      bad("stop", "a stop string may have at most " + std::to_string(limits.max_stop_bytes) + " bytes");
    r.stop.push_back(str);
  };
  if (s.is_string()) {
    add(s);
    return;
  }
  if (!s.is_array()) wrong_type("stop", "a string or an array of strings", s);
  if (s.size() > limits.max_stop_strings)
    bad("stop", "at most " + std::to_string(limits.max_stop_strings) + " stop strings are supported");
  for (const auto& v : s) add(v);
}

Json parse_json(std::string_view body, const ParseLimits& limits) {
  // The callback sees the nesting depth before values are built; throwing stops the parse at once.
  Json::parser_callback_t depth_guard = [&](int depth, Json::parse_event_t, Json&) {
    if (depth > limits.max_json_depth)
      bad("", "JSON nested deeper than " + std::to_string(limits.max_json_depth) + " levels");
    return true;
  };
  try {
    return Json::parse(body.begin(), body.end(), depth_guard);
  } catch (const Json::exception& e) {
    bad("", std::string("invalid JSON body: ") + e.what());
  }
}

}  // namespace

std::string ApiError::to_json() const {
  auto or_null = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  Json j = {
      {"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
  // Messages may quote client bytes: replace invalid UTF-8 instead of throwing while serialising.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

ParsedRequest parse_request(Endpoint endpoint, std::string_view body, const ParseLimits& limits) {
  const Json j = parse_json(body, limits);
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  ParsedRequest r;
  r.endpoint = endpoint;
  if (const Json* m = field(j, "model")) r.model = get_string(*m, "model");

  if (endpoint == Endpoint::kCompletions) {
    const Json* p = field(j, "prompt");
    if (p == nullptr) bad("prompt", "'prompt' is required");
    parse_prompt(*p, r);
  } else {
    const Json* m = field(j, "messages");
    if (m == nullptr) bad("messages", "'messages' is required");
    parse_messages(*m, r);
    if (const Json* t = field(j, "tools")) {
      if (!t->is_array()) wrong_type("tools", "an array", *t);
      if (!t->empty()) r.tools_json = t->dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    if (const Json* g = field(j, "add_generation_prompt"))
      r.add_generation_prompt = get_bool(*g, "add_generation_prompt");
  }

  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (const Json* v = field(j, "max_tokens")) r.max_tokens = get_int(*v, "max_tokens", 1, kIntMax);
  if (const Json* v = field(j, "max_completion_tokens"))
    r.max_tokens = get_int(*v, "max_completion_tokens", 1, kIntMax);
  if (const Json* v = field(j, "temperature")) r.temperature = get_float(*v, "temperature", 0.0, 2.0, false);
  if (const Json* v = field(j, "top_p")) r.top_p = get_float(*v, "top_p", 0.0, 1.0, true);
  if (const Json* v = field(j, "top_k")) {
    int64_t k = get_int(*v, "top_k", -1, kIntMax);
    r.top_k = k < 0 ? 0 : static_cast<int>(k);
  }
  if (const Json* v = field(j, "seed")) {
    if (!v->is_number_integer()) wrong_type("seed", "an integer", *v);
    r.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const Json* v = field(j, "stop")) parse_stop(*v, limits, r);
  if (const Json* v = field(j, "stop_token_ids")) {
    if (!v->is_array()) wrong_type("stop_token_ids", "an array", *v);
    r.stop_token_ids = get_token_ids(*v, "stop_token_ids");
  }
  if (const Json* v = field(j, "ignore_eos")) r.ignore_eos = get_bool(*v, "ignore_eos");
  if (const Json* v = field(j, "stream")) r.stream = get_bool(*v, "stream");
  if (const Json* v = field(j, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (const Json* u = field(*v, "include_usage"))
      r.include_usage = get_bool(*u, "stream_options.include_usage");
  }
  if (const Json* v = field(j, "n")) {
    if (get_int(*v, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()) != 1)
      bad("n", "only n = 1 is supported");
  }
  if (const Json* v = field(j, "best_of")) {
    if (get_int(*v, "best_of", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()) != 1)
      bad("best_of", "only best_of = 1 is supported");
  }
  // Asking for log-probabilities and getting none would silently break the client: refuse instead.
  if (const Json* v = field(j, "logprobs")) {
    if ((v->is_boolean() && v->get<bool>()) || (v->is_number() && v->get<double>() != 0))
      bad("logprobs", "logprobs are not supported");
  }
  if (const Json* v = field(j, "echo")) {
    if (get_bool(*v, "echo")) bad("echo", "echo is not supported");
  }
  return r;
}

}  // namespace ds::server
