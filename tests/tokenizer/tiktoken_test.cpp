// tiktoken BPE: golden vectors from an independent implementation (npm tiktoken, Rust/WASM), invalid UTF-8,
// merge strategies, streaming decode, concurrency.
#include "tokenizer/tiktoken.h"

// Built only with PCRE2 (DELTASERVE_WITH_TIKTOKEN); other builds have no tiktoken tokenizer to test.
#include <gtest/gtest.h>

#ifdef DELTASERVE_WITH_TIKTOKEN

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/error.h"
#include "tokenizer/tiktoken_utf8.h"
#include "tokenizer/tokenizer_loader.h"

namespace ds::tok {
namespace {

namespace fs = std::filesystem;

fs::path golden_dir() { return fs::path(DS_SOURCE_DIR) / "tests" / "tokenizer" / "golden"; }

// The test vocabulary (3,840 ranks learned by scripts/make_tokenizer_golden.mjs) with Kimi-layout specials.
const TiktokenBpe& test_bpe() {
  static const auto* bpe = [] {
    auto ranks = load_tiktoken_ranks((golden_dir() / "kimi_test.tiktoken").string());
    std::ifstream f(golden_dir() / "kimi_test_tokenizer_config.json");
    auto config = nlohmann::json::parse(f);
    return new TiktokenBpe(ranks, tiktoken_special_tokens(static_cast<int32_t>(ranks.size()), config));
  }();
  return *bpe;
}

nlohmann::json load_golden() {
  std::ifstream f(golden_dir() / "kimi_test_golden.json");
  return nlohmann::json::parse(f);
}

uint64_t fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) h = (h ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xff)) * 0x100000001b3ull;
  return h;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

int32_t rank_of(std::string_view bytes) {
  for (int32_t id = 0; id < test_bpe().num_base_tokens(); ++id)
    if (test_bpe().token_bytes(id) == bytes) return id;
  return -1;
}

TEST(Tiktoken, GoldenVectorsMatchRustTiktoken) {
  auto golden = load_golden();
  const auto& bpe = test_bpe();
  ASSERT_EQ(bpe.num_base_tokens(), golden["num_base_tokens"].get<int32_t>());
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    if (c.contains("text")) {
      std::string text = c["text"];
      auto ids = bpe.encode(text);
      EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << printable(text);
      EXPECT_EQ(bpe.decode(ids), text);
    } else {
      std::string text;
      for (const auto& p : c["parts"])
        for (int i = 0; i < p[1].get<int>(); ++i) text += p[0].get<std::string>();
      auto ids = bpe.encode(text);
      ASSERT_EQ(ids.size(), c["count"].get<size_t>()) << "long case: " << printable(text);
      auto head = c["head"].get<std::vector<int32_t>>();
      auto tail = c["tail"].get<std::vector<int32_t>>();
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + head.size()), head);
      EXPECT_EQ(std::vector<int32_t>(ids.end() - tail.size(), ids.end()), tail);
      EXPECT_EQ(fmt::format("{:016x}", fnv1a64(ids)), c["fnv1a64"].get<std::string>());
      EXPECT_EQ(bpe.decode(ids), text);
    }
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

// Negative control: the two PCRE2 traps of kimi_linear.md section 7 change golden results, so the golden
// test would catch a regression to either naive spelling.
TEST(Tiktoken, GoldenCatchesRegexTraps) {
  auto ranks = load_tiktoken_ranks((golden_dir() / "kimi_test.tiktoken").string());
  auto replace_all = [](std::string s, const std::string& from, const std::string& to) {
    size_t n = 0;
    for (size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += to.size(), ++n)
      s.replace(i, from.size(), to);
    EXPECT_GT(n, 0u) << from;
    return s;
  };
  // \p{Han} in PCRE2 also matches Script_Extensions=Han (、); \s with UCP also matches U+180E.
  const std::string ws =
      "\\t\\n\\x{0B}\\x{0C}\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
      "\\x{3000}";
  const std::string scx_han = replace_all(kKimiPattern, "\\p{sc:Han}", "\\p{Han}");
  const std::string ucp_space = replace_all(kKimiPattern, ws, "\\s");
  auto golden = load_golden();
  for (const std::string& pattern : {scx_han, ucp_space}) {
    TiktokenBpe naive(ranks, {}, pattern);
    int differ = 0;
    for (const auto& c : golden["cases"])
      if (c.contains("text") &&
          naive.encode(c["text"].get<std::string>()) != c["ids"].get<std::vector<int32_t>>())
        ++differ;
    EXPECT_GT(differ, 0) << pattern;
  }
}

TEST(Tiktoken, SpecialsMatchedInTextOrNot) {
  const auto& bpe = test_bpe();
  const int32_t base = bpe.num_base_tokens();
  EXPECT_EQ(bpe.special_id("<|im_end|>"), base + 2);
  EXPECT_EQ(bpe.special_id("<|reserved_token_3845|>"), base + 5);
  EXPECT_EQ(bpe.special_id("<|im_end"), std::nullopt);
  EXPECT_EQ(bpe.encode("<|im_end|>"), std::vector<int32_t>{base + 2});
  auto plain = bpe.encode("<|im_end|>", /*allow_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_LT(id, base);
  EXPECT_EQ(bpe.decode(plain), "<|im_end|>");
  EXPECT_EQ(bpe.vocab_size(), base + 256);
  EXPECT_TRUE(bpe.is_special(base + 255));
  EXPECT_FALSE(bpe.is_special(base - 1));
}

// The npm binding takes JS strings, which cannot hold invalid UTF-8, so these expectations are derived by
// hand from the documented rule: maximal invalid runs are BPE pieces of their own.
TEST(Tiktoken, InvalidUtf8IsEncodedBytewiseAndRoundTrips) {
  const auto& bpe = test_bpe();
  EXPECT_EQ(bpe.encode("\xff"), std::vector<int32_t>{0xff});
  EXPECT_EQ(bpe.encode("a\xff"
                       "b"),
            (std::vector<int32_t>{'a', 0xff, 'b'}));
  // A truncated 中 (E4 B8 AD) is one invalid run E4 B8, which the test vocabulary has as a token.
  const int32_t e4b8 = rank_of("\xe4\xb8");
  ASSERT_GE(e4b8, 256);
  EXPECT_EQ(bpe.encode("\xe4\xb8"), std::vector<int32_t>{e4b8});
  // The invalid run separates the valid stretches: "ab" left of it is not merged with "ab" right of it.
  auto ab = bpe.encode("ab");
  std::vector<int32_t> want = ab;
  want.push_back(0xc0);
  want.insert(want.end(), ab.begin(), ab.end());
  EXPECT_EQ(bpe.encode("ab\xc0"
                       "ab"),
            want);
  // Surrogates and overlongs are invalid; specials still match next to invalid bytes.
  EXPECT_EQ(bpe.encode("\xed\xa0\x80"), (std::vector<int32_t>{0xed, 0xa0, 0x80}));
  EXPECT_EQ(bpe.encode("\xff<|im_end|>"), (std::vector<int32_t>{0xff, bpe.num_base_tokens() + 2}));
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 0x80 : rng() % 0x100);
    EXPECT_EQ(bpe.decode(bpe.encode(s)), s) << printable(s);
  }
}

TEST(Tiktoken, MergeStrategiesAgree) {
  const auto& bpe = test_bpe();
  std::vector<std::string> ranks = load_tiktoken_ranks((golden_dir() / "kimi_test.tiktoken").string());
  RankTable table(ranks);
  std::mt19937 rng(11);
  const std::string alphabet = "aaabbbthe ing\n  \t\xe4\xb8\xad\xe6\x96\x87";
  for (int i = 0; i < 3000; ++i) {
    std::string s(1 + rng() % 300, ' ');
    for (auto& c : s) c = alphabet[rng() % alphabet.size()];
    std::vector<int32_t> a, b;
    detail::bpe_merge_scan(table, s, a);
    detail::bpe_merge_heap(table, s, b);
    ASSERT_EQ(a, b) << printable(s);
  }
  (void)bpe;
}

TEST(Tiktoken, LoaderRejectsMalformedFiles) {
  EXPECT_THROW(parse_tiktoken_ranks("YQ== 0\nnot-base64! 1\n"), Error);
  EXPECT_THROW(parse_tiktoken_ranks("YQ== x\n"), Error);
  EXPECT_THROW(parse_tiktoken_ranks("YQ== 0\nYg== 0\n"), Error);
  EXPECT_THROW(parse_tiktoken_ranks(""), Error);
  // Missing single bytes cannot be byte-level BPE.
  EXPECT_THROW(TiktokenBpe(parse_tiktoken_ranks("YQ== 0\n"), {}), Error);
  auto r = parse_tiktoken_ranks("YQ== 0\r\n\r\nYmM= 2\n");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], "a");
  EXPECT_EQ(r[1], "");
  EXPECT_EQ(r[2], "bc");
  nlohmann::json bad = {{"added_tokens_decoder", {{"12", {{"content", "<x>"}}}}}};
  EXPECT_THROW(tiktoken_special_tokens(100, bad), Error);  // id below the first special slot
  // Fuzz findings: a rank of 999999999 sized the table at 10^9 strings (out of memory), and special ids near
  // 2^31 overflowed int32; both are refused with the bound in the message.
  auto expect_error = [](const auto& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { (void)parse_tiktoken_ranks("YQ== 0\nYg== 999999999\n", "t.model"); },
               "t.model:2: rank 999999999 is out of range (ranks are below 4194304)");
  EXPECT_NO_THROW(parse_tiktoken_ranks("YQ== 4194303\n"));  // the largest id there is room for
  const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string all_bytes;  // every single byte at its own rank: the smallest valid table
  for (int b = 0; b < 256; ++b) all_bytes += fmt::format("{}{}== {}\n", b64[b >> 2], b64[(b & 3) << 4], b);
  const auto ranks = parse_tiktoken_ranks(all_bytes);
  expect_error([&] { TiktokenBpe(ranks, {{"<x>", 2147483647}}); }, "special token <x> has id 2147483647 outside");
  nlohmann::json far = {{"added_tokens_decoder", {{"4194300", {{"content", "<x>"}}}}}};
  expect_error([&] { (void)tiktoken_special_tokens(4194300, far); }, "pass the largest supported id");
}

TEST(Tiktoken, ConcurrentEncodeIsConsistent) {
  const auto& bpe = test_bpe();
  auto golden = load_golden();
  std::vector<std::string> texts;
  for (const auto& c : golden["cases"])
    if (c.contains("text")) texts.push_back(c["text"]);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < texts.size() * 4; i += 4) {
        const auto& s = texts[i % texts.size()];
        if (bpe.decode(bpe.encode(s)) != s) ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Through the engine's Tokenizer interface: streaming decode never emits half a character, even where BPE
// tokens split characters (the test vocabulary has tokens such as E4 B8 without the final byte).
TEST(Tiktoken, StreamDecodeThroughTokenizerInterface) {
  auto ranks = load_tiktoken_ranks((golden_dir() / "kimi_test.tiktoken").string());
  std::ifstream f(golden_dir() / "kimi_test_tokenizer_config.json");
  auto config = nlohmann::json::parse(f);
  TiktokenTokenizer tok(std::make_unique<TiktokenBpe>(
      ranks, tiktoken_special_tokens(static_cast<int32_t>(ranks.size()), config)));
  const std::string text = "中文、漢字 😀👍🏽 naïve<|im_end|>";
  auto ids = tok.encode(text);
  int split_chars = 0;  // tokens whose bytes end inside a character
  for (int32_t id : ids) {
    std::string b = tok.token_bytes(id);
    size_t i = 0;
    while (i < b.size()) {
      Utf8Char c = utf8_next(b, i);
      if (!c.valid) ++split_chars;
      i += c.len;
    }
  }
  EXPECT_GT(split_chars, 0) << "the test should cover tokens that split characters";
  StreamDecoder d(tok, /*skip_special=*/true);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    for (size_t i = 0; i < piece.size();) {
      Utf8Char c = utf8_next(piece, i);
      ASSERT_TRUE(c.valid) << "half a character streamed";
      i += c.len;
    }
    streamed += piece;
  }
  streamed += d.flush();
  EXPECT_EQ(streamed, "中文、漢字 😀👍🏽 naïve");
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(Utf8, PythonIsspaceAndMaximalSubparts) {
  EXPECT_TRUE(python_isspace(0x1c));
  EXPECT_TRUE(python_isspace(0x3000));
  EXPECT_FALSE(python_isspace(0x180e));
  EXPECT_FALSE(python_isspace(0x200b));
  auto c = utf8_next("\xf0\x9f\x98\x80", 0);
  EXPECT_TRUE(c.valid);
  EXPECT_EQ(c.cp, 0x1f600u);
  EXPECT_EQ(c.len, 4);
  c = utf8_next(
      "\xf0\x9f"
      "A",
      0);
  EXPECT_FALSE(c.valid);
  EXPECT_FALSE(c.truncated);
  EXPECT_EQ(c.len, 2);
  c = utf8_next("\xf0\x9f", 0);
  EXPECT_TRUE(c.truncated);
}

}  // namespace
}  // namespace ds::tok

#endif  // DELTASERVE_WITH_TIKTOKEN
