// Wire format and datasets: SSE framing cut at every byte, chunk decoding, base URLs, seeded prompts, bodies.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "tools/dataset.h"
#include "tools/json_fields.h"
#include "tools/openai.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

TEST(Sse, EventsSurviveAnySplitOfTheBytes) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: message\ndata: {\"b\":2}\n\n"
      "data: line1\ndata: line2\n\n"
      "data:[DONE]\n\n";
  const std::vector<std::string> expect = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"};
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> got;
    auto on = [&](const std::string& d) { got.push_back(d); };
    p.feed(std::string_view(stream).substr(0, cut), on);
    p.feed(std::string_view(stream).substr(cut), on);
    EXPECT_EQ(got, expect) << "cut at " << cut;
  }
}

// A server that never ends a line (or an event) must not grow the client's memory without bound.
TEST(Sse, OverlongLineOrEventStopsTheParser) {
  std::vector<std::string> got;
  auto on = [&](const std::string& d) { got.push_back(d); };
  SseParser p(16);
  EXPECT_TRUE(p.feed("data: 0123456789\n\n", on));  // a 16-byte line is within the limit
  EXPECT_EQ(got, std::vector<std::string>{"0123456789"});
  EXPECT_FALSE(p.feed("data: 0123456789a", on));      // 17 bytes and no end in sight
  EXPECT_TRUE(p.overflowed());
  EXPECT_FALSE(p.feed("\n\ndata: x\n\n", on));        // nothing more is handed over
  EXPECT_EQ(got.size(), 1u);

  SseParser q(16);  // lines within the limit, but one event's data joined past it
  got.clear();
  EXPECT_FALSE(q.feed("data: 012345678\ndata: 012345678\n\n", on));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(SseParser().max_event_bytes(), SseParser::kDefaultMaxEventBytes);
}

TEST(Sse, DecodesCompletionChatUsageAndErrors) {
  auto ev = decode_stream_event(R"({"choices":[{"index":0,"text":"hi","finish_reason":null}]})", EndpointKind::kCompletions);
  EXPECT_EQ(ev.text, "hi");
  EXPECT_FALSE(ev.has_usage);
  ev = decode_stream_event(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})", EndpointKind::kChat);
  EXPECT_EQ(ev.text, "");  // a role-only first chunk carries no output: it must not set TTFT
  ev = decode_stream_event(R"({"choices":[{"delta":{"content":null,"reasoning_content":"think"}}]})", EndpointKind::kChat);
  EXPECT_EQ(ev.text, "think");
  ev = decode_stream_event(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":16}})", EndpointKind::kChat);
  EXPECT_TRUE(ev.has_usage);
  EXPECT_EQ(ev.prompt_tokens, 7);
  EXPECT_EQ(ev.completion_tokens, 16);
  EXPECT_TRUE(decode_stream_event("[DONE]", EndpointKind::kChat).done);
  EXPECT_FALSE(decode_stream_event("{not json", EndpointKind::kChat).error.empty());
  EXPECT_FALSE(decode_stream_event(R"({"error":{"message":"boom"}})", EndpointKind::kChat).error.empty());
}

// What a broken or hostile server may put in usage: anything but a non-negative integral count reads as "not
// reported" (-1). json::value() threw on null (terminating the load generator's thread) and converted 1e300
// to int64 (undefined behaviour); both were fuzz findings.
TEST(Sse, UsageCountsFromAnyServerAreSafe) {
  using Counts = std::pair<int64_t, int64_t>;
  auto counts = [](const std::string& usage) {
    const auto ev = decode_stream_event(R"({"usage": )" + usage + "}", EndpointKind::kCompletions);
    EXPECT_TRUE(ev.error.empty()) << usage;
    EXPECT_TRUE(ev.has_usage) << usage;
    return std::pair(ev.prompt_tokens, ev.completion_tokens);
  };
  EXPECT_EQ(counts(R"({"prompt_tokens": 7, "completion_tokens": 9})"), Counts(7, 9));
  EXPECT_EQ(counts(R"({"prompt_tokens": 7.0, "completion_tokens": 9.5})"), Counts(7, -1));
  EXPECT_EQ(counts(R"({"prompt_tokens": null, "completion_tokens": "9"})"), Counts(-1, -1));
  EXPECT_EQ(counts(R"({"prompt_tokens": 1e300, "completion_tokens": -3})"), Counts(-1, -1));
  EXPECT_EQ(counts(R"({"prompt_tokens": 18446744073709551615, "completion_tokens": [1]})"),
            Counts(-1, -1));
}

// Reports keep whatever a server sent, serialisable: invalid UTF-8 (a raw error body, a snippet cut inside a
// character) becomes U+FFFD instead of making json::dump throw and the run's results lost.
TEST(Reports, InvalidUtf8IsReplacedNotThrown) {
  const nlohmann::json j = {{"error", std::string("bad \xff\xfe and cut \xc3")}, {"ok", "caf\xc3\xa9"}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);  // what the report writers used to call
  const std::string text = report_json(j);
  EXPECT_EQ(nlohmann::json::parse(text)["error"], "bad \xef\xbf\xbd\xef\xbf\xbd and cut \xef\xbf\xbd");
  EXPECT_EQ(nlohmann::json::parse(text)["ok"], "caf\xc3\xa9");  // valid text untouched
}

TEST(Sse, ResponseText) {
  EXPECT_EQ(response_text(nlohmann::json::parse(R"({"choices":[{"text":"a b"}]})"), EndpointKind::kCompletions), "a b");
  EXPECT_EQ(response_text(nlohmann::json::parse(R"({"choices":[{"message":{"content":"x"}}]})"), EndpointKind::kChat), "x");
  EXPECT_THROW(response_text(nlohmann::json::parse(R"({"choices":[]})"), EndpointKind::kChat), std::exception);
}

TEST(BaseUrl, SplitsPrefixAndDropsV1) {
  auto b = split_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(b.scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(b.prefix, "");
  b = split_base_url("http://host:9/openai/v1/");
  EXPECT_EQ(b.scheme_host_port, "http://host:9");
  EXPECT_EQ(b.prefix, "/openai");
  EXPECT_THROW(split_base_url("127.0.0.1:8000"), std::exception);
  EXPECT_THROW(split_base_url("ftp://x"), std::exception);
  EXPECT_THROW(split_base_url("http://"), std::exception);
}

TEST(Dataset, LengthRanges) {
  EXPECT_EQ(parse_len_range("128", "x").min, 128);
  const auto r = parse_len_range("64:256", "x");
  EXPECT_EQ(r.min, 64);
  EXPECT_EQ(r.max, 256);
  for (const char* bad : {"", "0", "5:4", "a", "1:", ":3", "2x", "-1"}) EXPECT_THROW(parse_len_range(bad, "x"), std::exception) << bad;
}

TEST(Dataset, RandomTokenPromptsAreSeededAndInRange) {
  DatasetOptions o;
  o.input_len = {10, 20};
  o.output_len = {5, 9};
  o.seed = 42;
  o.token_id_min = 1000;
  o.token_id_max = 1010;
  const Dataset a(o, EndpointKind::kCompletions), b(o, EndpointKind::kCompletions);
  bool lengths_vary = false;
  for (int i = 0; i < 50; ++i) {
    const Prompt p = a.get(i);
    EXPECT_EQ(p.prompt, b.get(i).prompt) << "same seed and index must give the same prompt";
    ASSERT_TRUE(p.prompt.is_array());
    EXPECT_EQ(static_cast<int64_t>(p.prompt.size()), p.input_len);
    EXPECT_GE(p.input_len, 10);
    EXPECT_LE(p.input_len, 20);
    EXPECT_GE(p.output_len, 5);
    EXPECT_LE(p.output_len, 9);
    for (const auto& t : p.prompt) {
      EXPECT_GE(t.get<int64_t>(), 1000);
      EXPECT_LT(t.get<int64_t>(), 1010);
    }
    lengths_vary = lengths_vary || p.input_len != a.get(0).input_len;
  }
  EXPECT_TRUE(lengths_vary);
  EXPECT_NE(a.get(0).prompt, a.get(1).prompt);
  o.seed = 43;
  EXPECT_NE(Dataset(o, EndpointKind::kCompletions).get(0).prompt, a.get(0).prompt);
}

TEST(Dataset, TextModeAndChatUseWords) {
  DatasetOptions o;
  o.input_len = {12, 12};
  o.prompt_mode = PromptMode::kText;
  const Prompt p = Dataset(o, EndpointKind::kCompletions).get(3);
  ASSERT_TRUE(p.prompt.is_string());
  const std::string text = p.prompt.get<std::string>();
  EXPECT_EQ(std::count(text.begin(), text.end(), ' '), 11);
  o.prompt_mode = PromptMode::kTokens;  // chat carries text even in token mode
  const Prompt c = Dataset(o, EndpointKind::kChat).get(3);
  ASSERT_TRUE(c.messages.is_array());
  EXPECT_EQ(c.messages[0]["role"], "user");
  EXPECT_TRUE(c.messages[0]["content"].is_string());
}

TEST(Dataset, PromptFileParsesAndReportsLines) {
  const auto dir = ds::test::scratch_dir("prompts");
  const auto good = (dir / "good.jsonl").string();
  std::ofstream(good) << R"({"prompt": "hello there", "max_tokens": 7})" "\n\n"
                      << R"({"prompt": [1, 2, 3]})" "\n";
  const auto ps = load_prompt_file(good, EndpointKind::kCompletions, {16, 16});
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].output_len, 7);
  EXPECT_EQ(ps[1].output_len, 16);
  EXPECT_EQ(ps[1].input_len, 3);
  EXPECT_THROW(load_prompt_file(good, EndpointKind::kChat, {16, 16}), std::exception);  // token ids need completions
  EXPECT_THROW(load_prompt_file((dir / "missing.jsonl").string(), EndpointKind::kChat, {16, 16}), std::exception);
}

TEST(Dataset, PromptFileErrors) {
  const auto dir = ds::test::scratch_dir("prompt-errors");
  auto expect_error = [&](const std::string& line, EndpointKind k, const std::string& needle) {
    const auto path = (dir / "f.jsonl").string();
    std::ofstream(path) << R"({"prompt": "ok"})" "\n" << line << "\n";
    try {
      load_prompt_file(path, k, {8, 8});
      ADD_FAILURE() << "no error for " << line;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("not json", EndpointKind::kCompletions, "not a JSON object");
  expect_error(R"({"text": "x"})", EndpointKind::kCompletions, "\"prompt\" or \"messages\"");
  expect_error(R"({"messages": [{"role": "user", "content": "x"}]})", EndpointKind::kCompletions, "--endpoint chat");
  expect_error(R"({"prompt": [1, "a"]})", EndpointKind::kCompletions, "token ids");
  expect_error(R"({"prompt": [1, 2]})", EndpointKind::kChat, "completions endpoint");
  expect_error(R"({"prompt": "x", "max_tokens": 0})", EndpointKind::kCompletions, "positive integer");
}

TEST(RequestBody, IgnoreEosSendsMinTokensAndUsageIsRequested) {
  Prompt p;
  p.prompt = nlohmann::json::array({5, 6, 7});
  p.output_len = 64;
  RequestOptions o;
  o.model = "m";
  o.ignore_eos = true;
  o.extra = {{"top_k", 1}};
  const auto b = build_request_body(p, EndpointKind::kCompletions, o);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["prompt"], p.prompt);
  EXPECT_EQ(b["max_tokens"], 64);
  EXPECT_EQ(b["min_tokens"], 64);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["top_k"], 1);
  o.ignore_eos = false;
  EXPECT_FALSE(build_request_body(p, EndpointKind::kCompletions, o).contains("min_tokens"));
}

}  // namespace
}  // namespace ds::tools
