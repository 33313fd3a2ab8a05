// The Kimi chat format through the tiktoken tokenizer: exact token sequences for every kind of turn, and
// loading model folders (Kimi layout, and the byte-level tiktoken.model `make-model` writes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "server/request_parse.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer_loader.h"

namespace ds::server {
namespace {

namespace fs = std::filesystem;

// A model folder holding the committed test vocabulary in the Kimi layout (3,840 ranks + 256 specials).
fs::path golden_model_dir() {
  static const fs::path dir = [] {
    fs::path golden = fs::path(DS_SOURCE_DIR) / "tests" / "tokenizer" / "golden";
    fs::path d = fs::temp_directory_path() / ("ds_chat_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    fs::copy_file(golden / "kimi_test.tiktoken", d / "tiktoken.model", fs::copy_options::overwrite_existing);
    fs::copy_file(golden / "kimi_test_tokenizer_config.json", d / "tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    return d;
  }();
  return dir;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(ChatFormat, KimiTurnsToExactTokenIds) {
  auto tok = tok::load_model_tokenizer(golden_model_dir().string());
  ASSERT_EQ(tok->kind(), "tiktoken");
  ASSERT_EQ(tok->vocab_size(), 3840 + 256);
  // Kimi's special ids relative to the first special slot (163584 in the real vocabulary).
  const int32_t base = 3840;
  const std::vector<int32_t> im_end{base + 2}, im_user{base + 3}, im_assistant{base + 4},
      im_system{base + 10}, im_middle{base + 17}, sec_begin{base + 11}, sec_end{base + 12},
      call_begin{base + 13}, arg_begin{base + 14}, call_end{base + 15};
  EXPECT_EQ(tok->specials().im_end, base + 2);
  EXPECT_EQ(tok->stop_token_ids(), (std::vector<int32_t>{base + 2, base + 1}));
  auto enc = [&](const std::string& s) { return tok->encode(s); };  // plain text: golden-tested BPE

  auto r = parse_request(Endpoint::kChatCompletions, R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "functions.get_weather:0", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
      {"role": "assistant", "content": "It is sunny."},
      {"role": "user", "name": "bob", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather"}}]})");
  auto ids = tok->encode_chat(r.messages, r.add_generation_prompt, r.tools_json);
  auto want = cat({
      im_system,
      enc("tool_declare"),
      im_middle,
      enc(R"([{"type":"function","function":{"name":"get_weather"}}])"),
      im_end,
      im_system,
      enc("system"),
      im_middle,
      enc("You are helpful."),
      im_end,
      im_user,
      enc("user"),
      im_middle,
      enc("Weather in Paris?"),
      im_end,
      im_assistant,
      enc("assistant"),
      im_middle,
      enc("Checking."),
      sec_begin,
      call_begin,
      enc("functions.get_weather:0"),
      arg_begin,
      enc(R"({"city":"Paris"})"),
      call_end,
      sec_end,
      im_end,
      im_system,
      enc("tool"),
      im_middle,
      enc("## Return of functions.get_weather:0\nsunny"),
      im_end,
      im_assistant,
      enc("assistant"),
      im_middle,
      enc("It is sunny."),
      im_end,
      im_user,
      enc("bob"),
      im_middle,
      enc("Thanks"),
      im_end,
      im_assistant,
      enc("assistant"),
      im_middle,
  });
  EXPECT_EQ(ids, want);
  // One short exchange as literal ids, so a change in the format or the BPE shows up even if both sides of
  // the check above changed together. The ids are npm tiktoken's encoding of the rendered text (checked once
  // by hand with the vocabulary and specials of scripts/make_tokenizer_golden.mjs).
  auto small = tok->encode_chat({{"user", "Hi", "", ""}}, /*add_generation_prompt=*/true);
  EXPECT_EQ(small, (std::vector<int32_t>{3843, 2672, 3857, 72, 105, 3842, 3844, 2646, 3857}));
  EXPECT_EQ(tok->decode(small),
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
  EXPECT_EQ(tok->decode(small, /*skip_special=*/true), "userHiassistant");
  // No generation prompt: ends with the last turn's <|im_end|>.
  auto no_gen = tok->encode_chat({{"user", "Hi", "", ""}}, false);
  EXPECT_EQ(no_gen.back(), base + 2);
}

TEST(ChatFormat, LoadsMakeModelByteLevelTiktokenFiles) {
  fs::path d = fs::temp_directory_path() / ("ds_bytelevel_" + std::to_string(::getpid()));
  write_byte_level_tiktoken_files(d.string());
  auto tok = tok::load_model_tokenizer(d.string());
  EXPECT_EQ(tok->kind(), "tiktoken");
  EXPECT_EQ(tok->vocab_size(), 163840);
  EXPECT_EQ(tok->specials().im_end, 163586);
  EXPECT_EQ(tok->specials().im_middle, 163601);
  EXPECT_EQ(tok->encode("hi<|im_end|>"), (std::vector<int32_t>{'h', 'i', 163586}));
  EXPECT_EQ(tok->token_bytes(1000), "");  // between the 256 ranks and the specials: no bytes
  EXPECT_EQ(tok->decode(std::vector<int32_t>{'o', 1000, 'k'}), "ok");
  EXPECT_THROW(tok->token_bytes(163840), ds::Error);
  fs::remove_all(d);
}

}  // namespace
}  // namespace ds::server
