// Request parsing, prompt preparation and stop strings, without a server.
#include "server/request_parse.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/prompt.h"
#include "server/stop_matcher.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds::server {
namespace {

ApiError parse_error(Endpoint ep, const std::string& body) {
  try {
    parse_request(ep, body);
  } catch (const ApiException& e) {
    return e.error;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

TEST(RequestParse, PromptForms) {
  auto r = parse_request(Endpoint::kCompletions, R"({"prompt": "hi"})");
  EXPECT_EQ(r.prompt_text, "hi");
  r = parse_request(Endpoint::kCompletions, R"({"prompt": ["hi"]})");
  EXPECT_EQ(r.prompt_text, "hi");
  r = parse_request(Endpoint::kCompletions, R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  r = parse_request(Endpoint::kCompletions, R"({"prompt": [[4, 5]]})");
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse_error(Endpoint::kCompletions, R"({"prompt": [[4], [5]]})").param, "prompt");
  EXPECT_EQ(parse_error(Endpoint::kCompletions, R"({"prompt": [2147483648]})").param, "prompt");
}

TEST(RequestParse, SamplingFieldsAndDefaults) {
  auto r = parse_request(Endpoint::kCompletions, R"({"prompt": "x"})");
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.top_p, 1.0f);
  EXPECT_FALSE(r.stream);
  r = parse_request(
      Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_completion_tokens": 7,
                        "temperature": 0, "top_p": 0.5, "top_k": -1, "seed": -3, "stop": "END", "n": 1,
                        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
                        "logprobs": false, "echo": null, "presence_penalty": 0.1})");
  EXPECT_EQ(r.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
  // Explicit nulls mean "not given".
  r = parse_request(Endpoint::kCompletions,
                    R"({"prompt": "x", "max_tokens": null, "stop": null, "seed": null})");
  EXPECT_FALSE(r.max_tokens);
  EXPECT_TRUE(r.stop.empty());
}

TEST(RequestParse, ChatMessagesContentPartsAndToolCalls) {
  auto r = parse_request(Endpoint::kChatCompletions, R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "name": "alice", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "functions.time:1", "type": "function", "function": {"name": "time", "arguments": {"tz": "UTC"}}}]},
      {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].name, "alice");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content,
            "<|tool_calls_section_begin|>"
            "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
            "\"Paris\"}<|tool_call_end|>"
            "<|tool_call_begin|>functions.time:1<|tool_call_argument_begin|>{\"tz\":\"UTC\"}<|tool_call_end|>"
            "<|tool_calls_section_end|>");
  EXPECT_EQ(r.messages[3].tool_call_id, "functions.get_weather:0");
  // Compact, keys in the client's order (not sorted: "type" before "function").
  EXPECT_EQ(r.tools_json,
            R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
}

TEST(RequestParse, ErrorsNameTheField) {
  EXPECT_EQ(parse_error(Endpoint::kCompletions, "{").param, "");
  EXPECT_EQ(parse_error(Endpoint::kCompletions, R"({"prompt": "x", "top_k": 1.5})").param, "top_k");
  EXPECT_EQ(parse_error(Endpoint::kCompletions, R"({"prompt": "x", "best_of": 3})").param, "best_of");
  EXPECT_EQ(parse_error(Endpoint::kCompletions, R"({"prompt": "x", "echo": true})").param, "echo");
  EXPECT_EQ(parse_error(Endpoint::kChatCompletions, R"({"messages": [{"role": ""}]})").param,
            "messages[0].role");
  EXPECT_EQ(parse_error(Endpoint::kChatCompletions,
                        R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]})")
                .param,
            "messages[0].tool_calls[0].function");
  ApiError deep = parse_error(Endpoint::kCompletions, std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_NE(deep.message.find("nested"), std::string::npos);
  // Invalid UTF-8 in the body is a JSON error, and the error message itself is valid JSON.
  ApiError utf = parse_error(Endpoint::kCompletions, "{\"prompt\": \"\xff\"}");
  EXPECT_NO_THROW(nlohmann::json::parse(utf.to_json()));
}

TEST(PreparePrompt, ContextLimitsAndDefaults) {
  ByteTokenizer tok;
  PromptLimits lim;
  lim.max_model_len = 10;
  auto prep = [&](const std::string& body) {
    return prepare_request(parse_request(Endpoint::kCompletions, body), tok, lim);
  };
  auto p = prep(R"({"prompt": "abc"})");
  EXPECT_EQ(p.prompt_tokens, 3);
  EXPECT_EQ(p.engine_request.sampling.max_tokens, 7);  // min(16, 10 - 3)
  p = prep(R"({"prompt": "abc", "max_tokens": 7})");
  EXPECT_EQ(p.engine_request.sampling.max_tokens, 7);
  auto code = [&](const std::string& body) {
    try {
      prep(body);
    } catch (const ApiException& e) {
      return e.error.code.empty() ? e.error.param : e.error.code;
    }
    return std::string("ok");
  };
  EXPECT_EQ(code(R"({"prompt": "abc", "max_tokens": 8})"), "context_length_exceeded");
  EXPECT_EQ(code(R"({"prompt": "0123456789"})"), "context_length_exceeded");
  EXPECT_EQ(code(R"({"prompt": ""})"), "prompt");
  EXPECT_EQ(code(R"({"prompt": [320]})"), "prompt");  // vocab is 320
  EXPECT_EQ(code(R"({"prompt": "a", "stop_token_ids": [400]})"), "stop_token_ids");
  // Chat defaults to the rest of the context.
  auto chat = prepare_request(
      parse_request(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": ""}]})"), tok,
      PromptLimits{100, 16});
  EXPECT_EQ(chat.engine_request.sampling.max_tokens, 100 - chat.prompt_tokens);
}

std::string run_stop(std::vector<std::string> stops, const std::vector<std::string>& pieces, bool* stopped) {
  StopMatcher m(std::move(stops));
  std::string out;
  *stopped = false;
  for (const auto& p : pieces) {
    if (m.push(p, out)) {
      *stopped = true;
      return out;
    }
  }
  m.finish(out);
  return out;
}

TEST(StopMatcher, AcrossPiecesAndNeverEmitted) {
  bool stopped = false;
  EXPECT_EQ(run_stop({"STOP"}, {"ab", "cS", "TO", "Pxyz"}, &stopped), "abc");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run_stop({"STOP"}, {"ab", "ST", "OX", "yz"}, &stopped), "abSTOXyz");  // a near miss is released
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run_stop({"STOP"}, {"abST"}, &stopped), "abST");          // held back, released at the end
  EXPECT_EQ(run_stop({"xyz", "b"}, {"axy", "zb"}, &stopped), "a");    // the earliest occurrence wins
  EXPECT_EQ(run_stop({"aab"}, {"a", "a", "a", "b"}, &stopped), "a");  // overlapping prefixes
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run_stop({"\n\n"}, {"line\n", "\nnext"}, &stopped), "line");
  EXPECT_EQ(run_stop({}, {"a", "b"}, &stopped), "ab");
  // Held text is only what could still become a stop string.
  StopMatcher m({"STOP"});
  std::string out;
  m.push("xxSTO", out);
  EXPECT_EQ(out, "xx");
  m.push("Q", out);
  EXPECT_EQ(out, "xxSTOQ");
}

}  // namespace
}  // namespace ds::server
