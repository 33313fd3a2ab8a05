// ByteTokenizer and the shared tokenizer parts: specials, round trips, invalid UTF-8, streaming, chat format.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_tokenizer.h"

namespace ds {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(ByteTokenizer, BytesAndSpecials) {
  ByteTokenizer t;
  EXPECT_EQ(t.vocab_size(), 320);
  EXPECT_EQ(t.encode("Hi"), (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(t.encode("a<|im_end|>b[EOS]"), (std::vector<int32_t>{'a', 258, 'b', 257}));
  EXPECT_EQ(t.encode("<|im_user|><|im_assistant|><|im_system|><|im_middle|>[BOS][PAD]"),
            (std::vector<int32_t>{259, 260, 261, 262, 256, 263}));
  EXPECT_EQ(t.encode("<|reserved_token_300|>"), (std::vector<int32_t>{300}));
  // Near misses stay bytes.
  EXPECT_EQ(t.encode("<|im_end|").size(), 9u);
  EXPECT_EQ(t.encode("[EOS").size(), 4u);
  EXPECT_EQ(t.specials().im_end, 258);
  EXPECT_EQ(t.stop_token_ids(), (std::vector<int32_t>{258, 257}));
  EXPECT_EQ(t.special_token_id("<|im_middle|>"), 262);
  EXPECT_FALSE(t.special_token_id("<|nope|>").has_value());
  EXPECT_TRUE(t.is_special(256));
  EXPECT_FALSE(t.is_special(255));
  EXPECT_THROW(t.token_bytes(320), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
}

TEST(ByteTokenizer, RoundTripAndSkipSpecial) {
  ByteTokenizer t;
  const std::string text = "héllo, 世界 🙂 <|im_end|> [BOS]x";
  const auto ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "héllo, 世界 🙂  x");
}

TEST(ByteTokenizer, InvalidUtf8BecomesReplacementPerMaximalSubpart) {
  ByteTokenizer t;
  auto dec = [&](const std::string& bytes) { return t.decode(t.encode(bytes)); };
  EXPECT_EQ(dec("a\x80" "b"), "a" + kFffd + "b");                 // stray continuation
  EXPECT_EQ(dec("\xC0\xAF"), kFffd + kFffd);                      // overlong lead: each byte
  EXPECT_EQ(dec("\xE4\xB8" "x"), kFffd + "x");                    // truncated 3-byte: one replacement
  EXPECT_EQ(dec("\xED\xA0\x80"), kFffd + kFffd + kFffd);          // surrogate: ED then two stray bytes
  EXPECT_EQ(dec("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(dec("\xF0\x9F\x99"), kFffd);                          // truncated at the end of the text
  EXPECT_EQ(dec("\xFF"), kFffd);
  EXPECT_EQ(dec("\xF0\x9F\x99\x82"), "🙂");
}

TEST(StreamDecoder, NeverEmitsHalfACharacter) {
  ByteTokenizer t;
  const std::string text = "aé世🙂\x80z\xE4\xB8<|im_end|>ok\xF0\x9F";
  const auto ids = t.encode(text);
  StreamDecoder s(t);
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = s.push(id);
    std::string check;
    // Every piece is valid UTF-8 on its own (decoding it changes nothing).
    EXPECT_EQ(utf8_decode_replace(piece, true, &check), piece.size());
    EXPECT_EQ(check, piece);
    joined += piece;
  }
  EXPECT_TRUE(s.has_pending());  // the truncated emoji at the end
  joined += s.flush();
  EXPECT_EQ(joined, t.decode(ids));
  EXPECT_EQ(joined, "aé世🙂" + kFffd + "z" + kFffd + "<|im_end|>ok" + kFffd);

  // Byte-by-byte emoji: nothing until the 4th byte.
  StreamDecoder e(t);
  EXPECT_EQ(e.push(0xF0), "");
  EXPECT_EQ(e.push(0x9F), "");
  EXPECT_EQ(e.push(0x99), "");
  EXPECT_EQ(e.push(0x82), "🙂");
}

// Ids the tokenizer has no text for (a padded model vocabulary, or random weights of a 163,840-id model served
// with this 320-id tokenizer) become U+FFFD; token_bytes threw, and in the server that killed the process.
TEST(StreamDecoder, IdsOutsideTheVocabularyBecomeReplacementCharacters) {
  ByteTokenizer t;
  StreamDecoder s(t, /*skip_special=*/true);
  EXPECT_EQ(s.push(161001), kFffd);
  EXPECT_EQ(s.push(-1), kFffd);
  EXPECT_EQ(s.push(ByteTokenizer::kVocabSize), kFffd);
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push(0xE4), "");                  // an incomplete character ...
  EXPECT_EQ(s.push(161001), kFffd + kFffd);     // ... is ended by the unknown id
  EXPECT_FALSE(s.has_pending());
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamDecoder, RandomBytesMatchDecode) {
  ByteTokenizer t;
  std::mt19937 rng(9);
  for (int it = 0; it < 200; ++it) {
    std::vector<int32_t> ids(rng() % 40);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 300);  // bytes, specials and reserved ids
    for (bool skip : {false, true}) {
      StreamDecoder s(t, skip);
      std::string joined;
      for (int32_t id : ids) joined += s.push(id);
      joined += s.flush();
      EXPECT_EQ(joined, t.decode(ids, skip));
    }
  }
}

TEST(ChatFormat, KimiTemplate) {
  ByteTokenizer t;
  auto msg = [](const char* role, const char* content) {
    ChatMessage m;
    m.role = role, m.content = content;
    return m;
  };
  const std::vector<ChatMessage> msgs = {msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello"),
                                         msg("user", "2+2?")};
  EXPECT_EQ(t.render_chat(msgs, true),
            "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>Hello<|im_end|>"
            "<|im_user|>user<|im_middle|>2+2?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
  const auto ids = t.encode_chat({msg("user", "Hi")}, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{259, 'u', 's', 'e', 'r', 262, 'H', 'i', 258, 260, 'a', 's', 's', 'i', 's',
                                       't', 'a', 'n', 't', 262}));
  ChatMessage tool{"tool", "42", "", "call_1"};
  EXPECT_EQ(t.render_chat({tool}, false), "<|im_system|>tool<|im_middle|>## Return of call_1\n42<|im_end|>");
  ChatMessage named{"user", "x", "alice", ""};
  EXPECT_EQ(t.render_chat({named}, false, "[]"),
            "<|im_system|>tool_declare<|im_middle|>[]<|im_end|><|im_user|>alice<|im_middle|>x<|im_end|>");
}

TEST(LoadTokenizer, ByteConfigRoundTripAndClearErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ds_tok_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ByteTokenizer::write_files(dir.string());
  auto tok = load_tokenizer(dir.string());
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->vocab_size(), 320);
  fs::remove(dir / "tokenizer_config.json");
  try {
    load_tokenizer(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer found"), std::string::npos) << e.what();
  }
  { std::ofstream(dir / "tiktoken.model") << "AA== 0\n"; }
  try {
    load_tokenizer(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiktoken"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ds
