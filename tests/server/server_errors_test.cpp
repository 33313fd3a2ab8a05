// Every error the server answers: OpenAI-style JSON with the right status, never a crash or a hang.
#include "server_harness.h"

namespace ds::server::test {
namespace {

struct BadCase {
  const char* path;
  std::string body;
  int status;
  const char* param;  // expected error.param ("" = null)
  const char* code;   // expected error.code ("" = null)
};

void expect_error(const Harness::Reply& r, const BadCase& c) {
  SCOPED_TRACE(std::string(c.path) + " " + c.body.substr(0, 120));
  ASSERT_EQ(r.status, c.status) << r.body;
  ASSERT_TRUE(r.json.is_object()) << r.body;
  const Json& e = r.json["error"];
  ASSERT_TRUE(e.is_object()) << r.body;
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
  EXPECT_TRUE(e["type"].is_string());
  if (std::string(c.param).empty())
    EXPECT_TRUE(e["param"].is_null()) << r.body;
  else
    EXPECT_EQ(e["param"], c.param);
  if (std::string(c.code).empty())
    EXPECT_TRUE(e["code"].is_null()) << r.body;
  else
    EXPECT_EQ(e["code"], c.code);
}

TEST(ServerErrors, BadRequestsGet400) {
  Harness h;  // max_model_len 256
  const char* C = "/v1/completions";
  const char* CH = "/v1/chat/completions";
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<BadCase> cases = {
      {C, "{not json", 400, "", ""},
      {C, "", 400, "", ""},
      {C, "[1, 2]", 400, "", ""},
      {C, R"({"max_tokens": 5})", 400, "prompt", ""},
      {C, R"({"prompt": 5})", 400, "prompt", ""},
      {C, R"({"prompt": ""})", 400, "prompt", ""},
      {C, R"({"prompt": []})", 400, "prompt", ""},
      {C, R"({"prompt": ["a", "b"]})", 400, "prompt", ""},
      {C, R"({"prompt": [1, -2]})", 400, "prompt", ""},
      {C, R"({"prompt": [1, 99999]})", 400, "prompt", ""},  // outside the 320-id vocabulary
      {C, R"({"prompt": [1, 2.5]})", 400, "prompt", ""},
      {C, R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens", ""},
      {C, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", ""},
      {C, R"({"prompt": "x", "max_tokens": -1})", 400, "max_tokens", ""},
      {C, R"({"prompt": "x", "max_tokens": 1e30})", 400, "max_tokens", ""},
      {C, R"({"prompt": "x", "max_tokens": 99999999999999999999})", 400, "max_tokens", ""},
      {C, R"({"prompt": "x", "max_tokens": 1000000})", 400, "max_tokens", "context_length_exceeded"},
      {C, R"({"prompt": ")" + std::string(300, 'a') + R"("})", 400, "prompt", "context_length_exceeded"},
      {C, R"({"prompt": "x", "temperature": "hot"})", 400, "temperature", ""},
      {C, R"({"prompt": "x", "temperature": -0.5})", 400, "temperature", ""},
      {C, R"({"prompt": "x", "top_p": 0})", 400, "top_p", ""},
      {C, R"({"prompt": "x", "top_p": 1.5})", 400, "top_p", ""},
      {C, R"({"prompt": "x", "top_k": -5})", 400, "top_k", ""},
      {C, R"({"prompt": "x", "seed": "abc"})", 400, "seed", ""},
      {C, R"({"prompt": "x", "stream": "yes"})", 400, "stream", ""},
      {C, R"({"prompt": "x", "stop": 5})", 400, "stop", ""},
      {C, R"({"prompt": "x", "stop": [""]})", 400, "stop", ""},
      {C, R"({"prompt": "x", "n": 2})", 400, "n", ""},
      {C, R"({"prompt": "x", "logprobs": 3})", 400, "logprobs", ""},
      {C, R"({"prompt": "x", "stream_options": 1})", 400, "stream_options", ""},
      {C, R"({"prompt": "x", "model": 7})", 400, "model", ""},
      {C, std::string(200, '[') + std::string(200, ']'), 400, "", ""},  // nested too deep
      {CH, R"({"prompt": "x"})", 400, "messages", ""},
      {CH, R"({"messages": []})", 400, "messages", ""},
      {CH, R"({"messages": "hi"})", 400, "messages", ""},
      {CH, R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role", ""},
      {CH, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content", ""},
      {CH, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "messages[0].content", ""},
      {CH, "{" + msgs + R"(, "tools": {}})", 400, "tools", ""},
      {CH, "{" + msgs + R"(, "max_completion_tokens": 100000})", 400, "max_completion_tokens",
       "context_length_exceeded"},
  };
  for (const auto& c : cases) expect_error(h.post(c.path, c.body), c);
  // Unknown fields are ignored.
  auto ok = h.post(C, R"({"prompt": "x", "max_tokens": 2, "frobnicate": {"a": [1]}, "user": "u1"})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  // Nothing leaked, and the server still answers.
  EXPECT_EQ(h.server().engine_stats().slots_in_use, 0);
  EXPECT_EQ(h.get("/health").status, 200);
}

TEST(ServerErrors, NotFoundAndUnknownModel) {
  Harness h;
  expect_error(h.get("/v1/nothing"), {"", "", 404, "", "not_found"});
  expect_error(h.post("/v2/completions", "{}"), {"", "", 404, "", "not_found"});
  expect_error(h.get("/v1/completions"), {"", "", 404, "", "not_found"});  // POST only
  expect_error(h.post("/v1/completions", R"({"model": "gpt-4", "prompt": "x"})"),
               {"", "", 404, "model", "model_not_found"});
  EXPECT_EQ(h.metric("deltaserve_requests_total{endpoint=\"other\",status=\"404\"}"), 2);
}

TEST(ServerErrors, BodyTooLargeGets413) {
  Harness h;  // max_body_bytes 64 KiB
  std::string big = R"({"prompt": ")" + std::string(70 * 1024, 'a') + R"("})";
  expect_error(h.post("/v1/completions", big), {"", "", 413, "", "payload_too_large"});
  EXPECT_EQ(h.get("/health").status, 200);
}

TEST(ServerErrors, OverCapacityGets429) {
  ServerOptions o = test_options();
  o.max_concurrent = 1;
  o.max_queue = 1;
  Harness h(o);
  // Two long streams fill the one slot and the one queue place; the third request is refused at once.
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  auto hold = [&] {
    h.stream("/v1/completions",
             R"({"prompt": "hold", "max_tokens": 200, "ignore_eos": true, "stream": true})",
             [&](const Json&) {
               started++;
               return !release.load();
             });
  };
  std::thread a(hold), b(hold);
  for (int i = 0; i < 500 && started.load() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (int i = 0; i < 200 && h.server().engine_stats().waiting + h.server().engine_stats().running < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto r = h.post("/v1/completions", R"({"prompt": "x", "max_tokens": 1})");
  release = true;
  a.join();
  b.join();
  expect_error(r, {"", "", 429, "", "too_many_requests"});
}

}  // namespace
}  // namespace ds::server::test
