// The HTTP server on the embedded model over loopback: endpoints, streaming vs non-streaming, stop strings.
#include "server_harness.h"
#include "core/error.h"
#include "tokenizer/byte_tokenizer.h"
#include "tools/server_steps.h"

namespace ds::server::test {
namespace {

std::string completion_body(const std::string& prompt, int max_tokens, bool stream,
                            const std::string& extra = "") {
  Json j = {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", max_tokens},
            {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
  if (!extra.empty()) j.update(Json::parse(extra));
  return j.dump();
}

TEST(HttpServer, HealthModelsMetrics) {
  Harness h;
  auto health = h.get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json["status"], "ok");
  auto models = h.get("/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json["object"], "list");
  EXPECT_EQ(models.json["data"][0]["id"], "tiny");
  EXPECT_EQ(models.json["data"][0]["max_model_len"], 256);
  auto metrics = h.get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("# TYPE deltaserve_time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_EQ(h.metric("deltaserve_state_slots_total"), 8);
  EXPECT_EQ(h.metric("deltaserve_requests_total{endpoint=\"/health\",status=\"200\"}"), 1);
}

// The engine's own step time on /metrics, by kind: one request of 12 tokens is 11 decode steps (each gives the
// request a token after its first) and 11 decode tokens, and at least one prefill step; the load generator's
// parser reads the page.
TEST(HttpServer, MetricsTimeEngineStepsByKind) {
  Harness h;
  EXPECT_EQ(h.metric("deltaserve_engine_step_seconds_count{kind=\"decode\"}"), 0);
  for (int round = 1; round <= 2; ++round) {
    auto r = h.post("/v1/completions", completion_body("Hello, world", 12, round == 2));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(h.metric("deltaserve_engine_step_seconds_count{kind=\"decode\"}"), 11 * round);
    EXPECT_GE(h.metric("deltaserve_engine_step_seconds_count{kind=\"prefill\"}"), round);
    EXPECT_GT(h.metric("deltaserve_engine_step_seconds_sum{kind=\"decode\"}"), 0);
    EXPECT_EQ(h.metric("deltaserve_engine_decode_token_step_seconds_count"), 11 * round);  // one request at a time
  }
  const auto steps = tools::parse_server_step_times(h.get("/metrics").body);
  ASSERT_TRUE(steps.has_value());
  EXPECT_EQ(steps->decode_steps, 22);
}

TEST(HttpServer, CompletionNonStreaming) {
  Harness h;
  auto r = h.post("/v1/completions", completion_body("Hello, world", 12, false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "text_completion");
  EXPECT_EQ(r.json["model"], "tiny");
  EXPECT_EQ(r.json["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], 12);  // byte tokenizer: one token per byte
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r.json["usage"]["total_tokens"], 24);
  // Same prompt, greedy: the same text again (and through token ids as the prompt).
  auto again = h.post("/v1/completions", completion_body("Hello, world", 12, false));
  EXPECT_EQ(again.json["choices"][0]["text"], r.json["choices"][0]["text"]);
  Json ids = Json::array();
  for (unsigned char c : std::string("Hello, world")) ids.push_back(c);
  Json by_ids = Json::parse(completion_body("", 12, false));
  by_ids["prompt"] = ids;
  auto r_ids = h.post("/v1/completions", by_ids.dump());
  ASSERT_EQ(r_ids.status, 200) << r_ids.body;
  EXPECT_EQ(r_ids.json["choices"][0]["text"], r.json["choices"][0]["text"]);
}

TEST(HttpServer, StreamingMatchesNonStreaming) {
  Harness h;
  auto plain = h.post("/v1/completions", completion_body("Stream me", 20, false));
  ASSERT_EQ(plain.status, 200);
  auto s = h.stream("/v1/completions",
                    completion_body("Stream me", 20, true, R"({"stream_options":{"include_usage":true}})"));
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.done) << s.raw;
  EXPECT_EQ(s.text(), plain.json["choices"][0]["text"].get<std::string>());
  ASSERT_GE(s.events.size(), 2u);
  const Json& usage_event = s.events.back();
  EXPECT_TRUE(usage_event["choices"].empty());
  EXPECT_EQ(usage_event["usage"]["completion_tokens"], 20);
  EXPECT_EQ(usage_event["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(s.last_choice()["finish_reason"], "length");
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    EXPECT_TRUE(s.events[i].contains("usage") &&
                s.events[i]["usage"].is_null());  // include_usage: null until last
    EXPECT_EQ(s.events[i]["object"], "text_completion");
    EXPECT_EQ(s.events[i]["id"], s.events[0]["id"]);
  }
  // Without include_usage there is no usage field and no usage event.
  auto s2 = h.stream("/v1/completions", completion_body("Stream me", 5, true));
  ASSERT_TRUE(s2.done);
  for (const auto& e : s2.events) EXPECT_FALSE(e.contains("usage"));
}

// The byte tokenizer, forwarded; the test tokenizers below override what they change.
class ForwardingByteTokenizer : public Tokenizer {
 public:
  int vocab_size() const override { return base_.vocab_size(); }
  std::vector<int32_t> encode(std::string_view text) const override { return base_.encode(text); }
  std::string token_bytes(int32_t id) const override { return base_.token_bytes(id); }
  bool is_special(int32_t id) const override { return base_.is_special(id); }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    return base_.special_token_id(text);
  }
  const SpecialTokens& specials() const override { return base_.specials(); }

 private:
  ByteTokenizer base_;
};

// A tokenizer that knows only ids below 64 while the model samples from 320: the server served such a model
// (serve --random-weights with the full-size preset: 163,840 ids, byte tokenizer) until the first unknown id,
// whose exception escaped the streaming writer thread and terminated the process.
class NarrowTokenizer final : public ForwardingByteTokenizer {
 public:
  std::string kind() const override { return "narrow"; }
  int vocab_size() const override { return 64; }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) DS_THROW("narrow tokenizer: token id {} outside [0, 64)", id);
    return ForwardingByteTokenizer::token_bytes(id);
  }
  bool is_special(int32_t) const override { return false; }
  std::optional<int32_t> special_token_id(std::string_view) const override { return std::nullopt; }
};

TEST(HttpServer, TokensTheTokenizerCannotDecodeDoNotStopTheServer) {
  const NarrowTokenizer narrow;
  Harness h(test_options(), &narrow);
  const std::string prompt = "0123 4567, 89.";  // every byte below 64
  auto plain = h.post("/v1/completions", completion_body(prompt, 24, false));
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string text = plain.json["choices"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("\xEF\xBF\xBD"), std::string::npos) << text;  // some of the 24 ids were >= 64
  auto s = h.stream("/v1/completions",
                    completion_body(prompt, 24, true, R"({"stream_options":{"include_usage":true}})"));
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.done) << s.raw;
  EXPECT_EQ(s.text(), text);
  EXPECT_EQ(s.events.back()["usage"]["completion_tokens"], 24);
  EXPECT_EQ(h.get("/health").status, 200);  // still serving
}

// The streaming writer's last line of defence: a tokenizer that fails on ids it claims to know. The stream ends
// with an error event and [DONE], the slot is freed, and the server goes on serving.
class FailingTokenizer final : public ForwardingByteTokenizer {
 public:
  std::string kind() const override { return "failing"; }
  std::string token_bytes(int32_t id) const override {
    if (id >= 64) DS_THROW("failing tokenizer: no text for {}", id);
    return ForwardingByteTokenizer::token_bytes(id);
  }
};

TEST(HttpServer, AnErrorWhileStreamingEndsThatStreamOnly) {
  const FailingTokenizer failing;
  ServerOptions o = test_options();
  o.max_concurrent = 1;  // a slot that was not freed would block the next request
  Harness h(o, &failing);
  const std::string prompt = "0123 4567, 89.";
  for (int round = 0; round < 2; ++round) {
    auto s = h.stream("/v1/completions", completion_body(prompt, 24, true));
    ASSERT_EQ(s.status, 200);
    ASSERT_TRUE(s.done) << s.raw;
    ASSERT_FALSE(s.events.empty());
    const Json& last = s.events.back();
    ASSERT_TRUE(last.contains("error")) << s.raw;  // some of the 24 ids were >= 64
    EXPECT_EQ(last["error"]["type"], "server_error");
    EXPECT_NE(last["error"]["message"].get<std::string>().find("failing tokenizer"), std::string::npos);
  }
  EXPECT_EQ(h.get("/health").status, 200);
}

TEST(HttpServer, ChatNonStreamingAndStreaming) {
  Harness h;
  Json body = {
      {"model", "tiny"},
      {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi!"}}}},
      {"max_completion_tokens", 10},
      {"temperature", 0},
      {"ignore_eos", true}};
  auto r = h.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "chat.completion");
  EXPECT_EQ(r.json["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r.json["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 10);
  // Byte tokenizer: the specials are one token each, the role names and contents one token per byte:
  // sys "system" mid "Be brief." end user "user" mid "Hi!" end asst "assistant" mid.
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], 1 + 6 + 1 + 9 + 1 + 1 + 4 + 1 + 3 + 1 + 1 + 9 + 1);
  body["stream"] = true;
  auto s = h.stream("/v1/chat/completions", body.dump());
  ASSERT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 2u);
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(s.text(), r.json["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(s.events.back()["choices"][0]["delta"].empty());
}

// Cuts text at a char boundary at or after byte i (generated text holds multi-byte U+FFFD).
size_t char_boundary(const std::string& t, size_t i) {
  while (i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) ++i;
  return i;
}

TEST(HttpServer, StopStringsAcrossTokensAreNotReturned) {
  Harness h;
  auto full = h.post("/v1/completions", completion_body("Tell me a story", 40, false));
  ASSERT_EQ(full.status, 200);
  const std::string text = full.json["choices"][0]["text"];
  const size_t a = char_boundary(text, 10), b = char_boundary(text, a + 3);
  ASSERT_LT(b, text.size()) << "generated text too short for the test";
  const std::string stop = text.substr(a, b - a);  // >= 3 bytes: spans >= 3 byte-tokens
  const std::string want = text.substr(0, text.find(stop));
  Json extra = {{"stop", {stop, "never-generated-stop"}}};
  auto r = h.post("/v1/completions", completion_body("Tell me a story", 40, false, extra.dump()));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json["choices"][0]["text"], want);
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(r.json["usage"]["completion_tokens"].get<int>(), 40);
  auto s = h.stream("/v1/completions", completion_body("Tell me a story", 40, true, extra.dump()));
  ASSERT_TRUE(s.done);
  EXPECT_EQ(s.text(), want);
  EXPECT_EQ(s.last_choice()["finish_reason"], "stop");
  // The stopped request gave its slot back (it was cancelled in the engine, not run to max_tokens).
  for (int i = 0; i < 100 && h.server().engine_stats().slots_in_use != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(h.server().engine_stats().slots_in_use, 0);
}

TEST(HttpServer, SeededSamplingIsReproducible) {
  Harness h;
  auto body = [](int seed) {
    return Json{{"prompt", "Once upon"}, {"max_tokens", 16}, {"temperature", 0.9}, {"top_p", 0.95},
                {"top_k", 50},           {"seed", seed},     {"ignore_eos", true}}
        .dump();
  };
  auto a = h.post("/v1/completions", body(7)), b = h.post("/v1/completions", body(7)),
       c = h.post("/v1/completions", body(8));
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.json["choices"][0]["text"], b.json["choices"][0]["text"]);
  EXPECT_NE(a.json["choices"][0]["text"], c.json["choices"][0]["text"]);
}

TEST(HttpServer, ApiKeyGuardsV1Only) {
  ServerOptions o = test_options();
  o.api_key = "sk-test-123";
  Harness h(o);
  auto missing = h.post("/v1/completions", completion_body("x", 1, false));
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.json["error"]["type"], "authentication_error");
  auto wrong =
      h.post("/v1/completions", completion_body("x", 1, false), {{"Authorization", "Bearer sk-test-12"}});
  EXPECT_EQ(wrong.status, 401);
  auto not_bearer =
      h.post("/v1/completions", completion_body("x", 1, false), {{"Authorization", "sk-test-123"}});
  EXPECT_EQ(not_bearer.status, 401);
  EXPECT_EQ(h.get("/v1/models").status, 401);
  auto ok =
      h.post("/v1/completions", completion_body("x", 1, false), {{"Authorization", "Bearer sk-test-123"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(h.get("/health").status, 200);
  EXPECT_EQ(h.get("/metrics").status, 200);
}

}  // namespace
}  // namespace ds::server::test
