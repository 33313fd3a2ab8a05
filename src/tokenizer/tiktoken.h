// tiktoken-style byte-level BPE (the Kimi tokenizer): PCRE2-JIT pre-split, rank-ordered merges, specials.
//
// Encoding follows HF `TikTokenTokenizer.encode` of tokenization_kimi.py exactly:
//   1. windows of <= 400,000 chars, each cut into runs of <= 25,000 consecutive whitespace or
//      non-whitespace chars (Python str.isspace; chars = code points);
//   2. in each run, special-token strings are matched as specials (allowed_special="all");
//   3. the text between specials is split by the pre-tokenizer regex and each piece is BPE-encoded.
//
// Invalid UTF-8 input (the server never passes it: JSON strings are validated UTF-8, but the CLI can): the
// text is cut into maximal valid stretches and maximal runs of invalid bytes. Valid stretches are split by
// the regex as usual; each invalid run is one piece, BPE-encoded from its bytes like any piece (so nothing
// is dropped and decode(encode(x)) == x for every byte string x). For step 1 an invalid byte counts as one
// non-whitespace char. Decoding returns raw bytes; ds::Tokenizer::decode and ds::StreamDecoder replace
// invalid sequences by U+FFFD.
//
// Thread safety: all methods are const and may be called concurrently (PCRE2 scratch is thread-local).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tiktoken_bpe.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok {

// The Kimi pre-tokenizer in PCRE2 syntax, equivalent to the Rust-regex `pat_str` of tokenization_kimi.py
// (kimi_linear.md section 7): `&&[^\p{Han}]` intersections become a `(?!\p{sc:Han})` look-ahead per char,
// `\p{Han}` becomes `\p{sc:Han}` (PCRE2's `\p{Han}` also matches Script_Extensions, e.g. `、`), and
// `\s` / `\S` become explicit classes of Unicode White_Space (PCRE2's UCP `\s` adds U+180E).
extern const char* const kKimiPattern;

// Reads a `tiktoken.model` file: one `base64(token bytes) rank` per line. Returns tokens indexed by rank
// (an empty string marks an unused rank). Throws ds::Error naming the line on malformed input.
std::vector<std::string> load_tiktoken_ranks(const std::string& path);
std::vector<std::string> parse_tiktoken_ranks(std::string_view file_text,
                                              const std::string& name = "<memory>");

// Every token id (rank or special) is below this: 25x the Kimi vocabulary (163,840). A larger one means a corrupt
// file; without the bound a rank of 999999999 sized the table at 10^9 strings (fuzz finding: out of memory) and
// special ids near 2^31 overflowed int32.
inline constexpr int64_t kMaxTokenIds = int64_t{1} << 22;

struct SpecialToken {
  std::string text;
  int32_t id;
};

class TiktokenBpe {
 public:
  // ranks: token bytes by rank (every single byte must have a rank); specials: ids outside the ranks.
  TiktokenBpe(const std::vector<std::string>& ranks, std::vector<SpecialToken> specials,
              std::string_view pattern = kKimiPattern);
  ~TiktokenBpe();
  TiktokenBpe(const TiktokenBpe&) = delete;
  TiktokenBpe& operator=(const TiktokenBpe&) = delete;

  // Steps 1-3 above. allow_special = false encodes special-token strings as plain text.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  // Step 3 only: regex split + BPE, appended to out; no specials, no long-run cutting.
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  // Concatenated token bytes (a special id gives its text). Throws ds::Error on an unknown id.
  std::string decode(std::span<const int32_t> ids) const;
  // Bytes of one token; empty for an unknown id.
  std::string_view token_bytes(int32_t id) const;

  std::optional<int32_t> special_id(std::string_view text) const;
  bool is_special(int32_t id) const { return special_text_.count(id) != 0; }
  const std::vector<SpecialToken>& specials() const { return specials_; }
  int32_t num_base_tokens() const { return static_cast<int32_t>(table_.size()); }
  // One past the largest id (ranks and specials).
  int32_t vocab_size() const { return vocab_size_; }

 private:
  struct Regex;  // PCRE2 code, hidden so users need not include pcre2.h

  void encode_run(std::string_view run, bool allow_special, std::vector<int32_t>& out) const;
  void encode_valid_utf8(std::string_view text, std::vector<int32_t>& out) const;
  // Leftmost special-token match in text at or after pos: (offset, length, id), or nullopt.
  struct SpecialMatch {
    size_t pos, len;
    int32_t id;
  };
  std::optional<SpecialMatch> find_special(std::string_view text, size_t pos) const;

  RankTable table_;
  std::unique_ptr<Regex> regex_;
  std::vector<SpecialToken> specials_;
  struct StringHash {  // transparent, so lookups by string_view allocate nothing
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> special_ids_;
  std::unordered_map<int32_t, std::string> special_text_;
  std::vector<size_t> special_lengths_;  // distinct lengths, longest first (longest match wins)
  bool special_first_byte_[256] = {};
  int32_t vocab_size_ = 0;
};

// The Kimi tokenizer behind the engine's Tokenizer interface (encode with specials, decode, chat format).
// Ids below vocab_size() that are neither a rank nor a special (a gap: e.g. the byte-level tiktoken.model
// that `make-model` writes has 256 ranks and its specials at 163584..163839) decode to no bytes, so a
// random-weight model that samples them streams nothing for them instead of failing.
class TiktokenTokenizer final : public ds::Tokenizer {
 public:
  explicit TiktokenTokenizer(std::unique_ptr<TiktokenBpe> bpe);

  std::string kind() const override { return "tiktoken"; }
  int vocab_size() const override { return bpe_->vocab_size(); }
  std::vector<int32_t> encode(std::string_view text) const override { return bpe_->encode(text); }
  std::string token_bytes(int32_t id) const override;
  bool is_special(int32_t id) const override { return bpe_->is_special(id); }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    return bpe_->special_id(text);
  }
  const SpecialTokens& specials() const override { return specials_; }
  const TiktokenBpe& bpe() const { return *bpe_; }

 private:
  std::unique_ptr<TiktokenBpe> bpe_;
  SpecialTokens specials_;
};

}  // namespace ds::tok
