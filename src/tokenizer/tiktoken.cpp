// tiktoken-style byte-level BPE: rank file loading, HF long-run splitting, specials, PCRE2 pre-split.
#include "tokenizer/tiktoken.h"

#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tiktoken_utf8.h"

namespace ds::tok {

// clang-format off
// White_Space as Rust's regex crate defines `\s` (the Unicode property, which has no U+180E since 6.3).
#define DS_WS "\\t\\n\\x{0B}\\x{0C}\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
              "\\x{3000}"
#define DS_NOT_HAN "(?!\\p{sc:Han})"
#define DS_UPPERISH DS_NOT_HAN "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define DS_LOWERISH DS_NOT_HAN "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define DS_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
const char* const kKimiPattern =
    "[\\p{sc:Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:" DS_UPPERISH ")*(?:" DS_LOWERISH ")+" DS_CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?(?:" DS_UPPERISH ")+(?:" DS_LOWERISH ")*" DS_CONTRACTION
    "|\\p{N}{1,3}"
    "| ?[^" DS_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" DS_WS "]*[\\r\\n]+"
    "|[" DS_WS "]+(?![^" DS_WS "])"
    "|[" DS_WS "]+";
// clang-format on
#undef DS_WS
#undef DS_NOT_HAN
#undef DS_UPPERISH
#undef DS_LOWERISH
#undef DS_CONTRACTION

namespace {

// HF cuts: 400,000-char windows, runs of at most 25,000 whitespace or non-whitespace chars.
constexpr size_t kMaxEncodeChars = 400000;
constexpr size_t kMaxRunChars = 25000;

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with '=' padding; returns false on any other character or a bad length.
bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return false;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

// Per-thread PCRE2 scratch: match data for one pair and a JIT stack. The default 32 KiB JIT stack is
// machine-stack backed and too small for 25,000-char whitespace runs under `[ws]+(?![^ws])`.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (md == nullptr || mctx == nullptr || jit_stack == nullptr) throw std::bad_alloc();
    pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct TiktokenBpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

std::vector<std::string> parse_tiktoken_ranks(std::string_view text, const std::string& name) {
  std::vector<std::string> tokens;
  std::string bytes;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || !base64_decode(line.substr(0, sp), bytes) || bytes.empty())
      DS_THROW("{}:{}: expected `base64 rank`, got `{}`", name, line_no, line.substr(0, 80));
    std::string_view rank_str = line.substr(sp + 1);
    uint64_t rank = 0;
    if (rank_str.empty() || rank_str.size() > 9 ||
        !std::all_of(rank_str.begin(), rank_str.end(), [](char c) { return c >= '0' && c <= '9'; }))
      DS_THROW("{}:{}: bad rank `{}`", name, line_no, rank_str.substr(0, 20));
    for (char c : rank_str) rank = rank * 10 + static_cast<uint64_t>(c - '0');
    if (rank >= static_cast<uint64_t>(kMaxTokenIds))
      DS_THROW("{}:{}: rank {} is out of range (ranks are below {})", name, line_no, rank, kMaxTokenIds);
    if (rank >= tokens.size()) tokens.resize(rank + 1);
    if (!tokens[rank].empty()) DS_THROW("{}:{}: rank {} appears twice", name, line_no, rank);
    tokens[rank] = bytes;
  }
  if (tokens.empty()) DS_THROW("{}: no tokens", name);
  return tokens;
}

std::vector<std::string> load_tiktoken_ranks(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) DS_THROW("cannot open tokenizer ranks file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_tiktoken_ranks(ss.str(), path);
}

TiktokenBpe::TiktokenBpe(const std::vector<std::string>& ranks, std::vector<SpecialToken> specials,
                         std::string_view pattern)
    : table_(ranks), regex_(std::make_unique<Regex>()), specials_(std::move(specials)) {
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    if (table_.find(std::string_view(&c, 1)) == RankTable::kNone)
      DS_THROW("tokenizer ranks lack the single byte 0x{:02x}: byte-level BPE needs all 256", b);
  }
  vocab_size_ = static_cast<int32_t>(table_.size());
  for (const auto& s : specials_) {
    if (s.text.empty()) DS_THROW("empty special token (id {})", s.id);
    if (s.id < 0 || s.id >= kMaxTokenIds)
      DS_THROW("special token {} has id {} outside [0, {})", s.text, s.id, kMaxTokenIds);
    if (!table_.bytes(static_cast<uint32_t>(s.id)).empty())
      DS_THROW("special token {} id {} collides with a BPE rank", s.text, s.id);
    if (!special_text_.emplace(s.id, s.text).second) DS_THROW("special id {} appears twice", s.id);
    vocab_size_ = std::max(vocab_size_, s.id + 1);
  }
  for (const auto& s : specials_) {
    if (!special_ids_.emplace(s.text, s.id).second) DS_THROW("special token {} appears twice", s.text);
    special_first_byte_[static_cast<unsigned char>(s.text[0])] = true;
    if (std::find(special_lengths_.begin(), special_lengths_.end(), s.text.size()) == special_lengths_.end())
      special_lengths_.push_back(s.text.size());
  }
  std::sort(special_lengths_.rbegin(), special_lengths_.rend());

  int err = 0;
  PCRE2_SIZE err_off = 0;
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (regex_->code == nullptr)
    DS_THROW("pre-tokenizer regex does not compile at offset {}: {}", err_off, pcre2_message(err));
  // Without JIT the interpreter still gives the same splits, only slower (~5x): keep going.
  (void)pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);
}

TiktokenBpe::~TiktokenBpe() = default;

std::vector<int32_t> TiktokenBpe::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (text.size() <= kMaxRunChars) {  // fewer bytes than the run limit: no cut possible
    encode_run(text, allow_special, out);
    return out;
  }
  // HF's cuts, chars counted as code points (an invalid byte counts as one non-whitespace char).
  size_t win_start = 0;
  while (win_start < text.size()) {
    size_t pos = win_start, chars = 0, slice_start = win_start, run_len = 0;
    bool run_space = false;
    while (pos < text.size() && chars < kMaxEncodeChars) {
      Utf8Char ch = utf8_next(text, pos);
      bool space = ch.valid && python_isspace(ch.cp);
      if (chars == 0) run_space = space;
      if (space != run_space) {
        run_len = 1;
        run_space = space;
      } else if (++run_len > kMaxRunChars) {
        encode_run(text.substr(slice_start, pos - slice_start), allow_special, out);
        slice_start = pos;
        run_len = 1;
      }
      pos += ch.len;
      ++chars;
    }
    encode_run(text.substr(slice_start, pos - slice_start), allow_special, out);
    win_start = pos;
  }
  return out;
}

void TiktokenBpe::encode_run(std::string_view run, bool allow_special, std::vector<int32_t>& out) const {
  size_t pos = 0;
  if (allow_special) {
    while (auto m = find_special(run, pos)) {
      encode_ordinary(run.substr(pos, m->pos - pos), out);
      out.push_back(m->id);
      pos = m->pos + m->len;
    }
  }
  encode_ordinary(run.substr(pos), out);
}

std::optional<TiktokenBpe::SpecialMatch> TiktokenBpe::find_special(std::string_view text, size_t pos) const {
  if (special_lengths_.empty()) return std::nullopt;
  for (size_t i = pos; i < text.size(); ++i) {
    if (!special_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (size_t len : special_lengths_) {
      if (i + len > text.size()) continue;
      auto it = special_ids_.find(text.substr(i, len));
      if (it != special_ids_.end()) return SpecialMatch{i, len, it->second};
    }
  }
  return std::nullopt;
}

void TiktokenBpe::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  // Valid stretches go to the regex with PCRE2_NO_UTF_CHECK (checked here once: letting PCRE2 re-check
  // the whole subject on every call from a moving offset makes the split loop quadratic).
  size_t pos = 0;
  while (pos < text.size()) {
    size_t valid_end = pos;
    while (valid_end < text.size()) {
      if (static_cast<unsigned char>(text[valid_end]) < 0x80) {  // ASCII fast path
        ++valid_end;
        continue;
      }
      Utf8Char ch = utf8_next(text, valid_end);
      if (!ch.valid) break;
      valid_end += ch.len;
    }
    if (valid_end > pos) encode_valid_utf8(text.substr(pos, valid_end - pos), out);
    size_t bad_end = valid_end;
    while (bad_end < text.size()) {
      Utf8Char ch = utf8_next(text, bad_end);
      if (ch.valid) break;
      bad_end += ch.len;
    }
    if (bad_end > valid_end) bpe_encode_piece(table_, text.substr(valid_end, bad_end - valid_end), out);
    pos = bad_end;
  }
}

void TiktokenBpe::encode_valid_utf8(std::string_view text, std::vector<int32_t>& out) const {
  MatchScratch& s = match_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
  size_t off = 0;
  while (off < text.size()) {
    int rc = pcre2_match(regex_->code, subject, text.size(), off, PCRE2_NO_UTF_CHECK, s.md, s.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // tiktoken drops unmatched text too (none for the Kimi pattern)
    if (rc < 0) DS_THROW("pre-tokenizer regex failed at byte {}: {}", off, pcre2_message(rc));
    size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match (impossible for the Kimi pattern): step over one char
      off = start + utf8_next(text, start).len;
      continue;
    }
    bpe_encode_piece(table_, text.substr(start, end - start), out);
    off = end;
  }
}

std::string_view TiktokenBpe::token_bytes(int32_t id) const {
  if (id < 0) return {};
  std::string_view b = table_.bytes(static_cast<uint32_t>(id));
  if (!b.empty()) return b;
  auto it = special_text_.find(id);
  return it == special_text_.end() ? std::string_view() : std::string_view(it->second);
}

std::string TiktokenBpe::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    std::string_view b = token_bytes(id);
    if (b.empty()) DS_THROW("token id {} is not in the vocabulary (size {})", id, vocab_size_);
    out += b;
  }
  return out;
}

std::optional<int32_t> TiktokenBpe::special_id(std::string_view text) const {
  auto it = special_ids_.find(text);
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

TiktokenTokenizer::TiktokenTokenizer(std::unique_ptr<TiktokenBpe> bpe) : bpe_(std::move(bpe)) {
  auto id = [&](const char* text) { return bpe_->special_id(text).value_or(-1); };
  specials_.bos = id("[BOS]");
  specials_.eos = id("[EOS]");
  specials_.im_end = id("<|im_end|>");
  specials_.im_user = id("<|im_user|>");
  specials_.im_assistant = id("<|im_assistant|>");
  specials_.im_system = id("<|im_system|>");
  specials_.im_middle = id("<|im_middle|>");
  specials_.pad = id("[PAD]");
}

std::string TiktokenTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= bpe_->vocab_size())
    DS_THROW("tiktoken tokenizer: token id {} outside [0, {})", id, bpe_->vocab_size());
  return std::string(bpe_->token_bytes(id));
}

}  // namespace ds::tok
