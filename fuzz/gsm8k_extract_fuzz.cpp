// libFuzzer harness: GSM8K scoring on arbitrary strings. Input: byte 0 = options, then response '\0' reference
// '\0' band. The extractions are checked against the patterns gsm8k.h documents (std::regex where the input
// is short enough for its per-character recursion, hand-written matchers beyond), the normalised forms against
// what normalize_answer promises, and parse_band may only throw ds::Error or return a band in its bounds.
#include <cstdint>
#include <cstdlib>
#include <regex>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tools/gsm8k.h"

namespace {

using namespace ds::tools;

void check(bool ok) {
  if (!ok) std::abort();
}

bool digit(char c) { return c >= '0' && c <= '9'; }
bool strict_char(char c) { return digit(c) || c == '.' || c == ','; }
bool flex_char(char c) { return strict_char(c) || c == '$'; }
size_t run(const std::string& s, size_t p, bool (*in)(char)) {
  size_t e = p;
  while (e < s.size() && in(s[e])) ++e;
  return e - p;
}

// The documented patterns themselves (std::regex, ECMAScript): the oracle for responses up to 4 KiB.
std::string regex_strict(const std::string& s) {
  static const std::regex re(R"(#### (\-?[0-9\.\,]+))");
  std::smatch m;
  return std::regex_search(s, m, re) ? m[1].str() : std::string(kInvalid);
}
std::string regex_flexible(const std::string& s) {
  static const std::regex re(R"((-?[$0-9.,]{2,})|(-?[0-9]+))");
  std::string last = kInvalid;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
    last = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
  return last;
}

// Longer responses, by hand. `#### (-?[0-9.,]+)`: the leftmost "#### " followed by an optional '-' and at least
// one of [0-9.,] (greedy).
std::string ref_strict(const std::string& s) {
  for (size_t p = s.find("#### "); p != std::string::npos; p = s.find("#### ", p + 1)) {
    size_t q = p + 5;
    const bool minus = q < s.size() && s[q] == '-';
    if (const size_t n = run(s, q + minus, strict_char); n > 0) return s.substr(q, minus + n);
  }
  return kInvalid;
}

// Last of the non-overlapping left-to-right matches of `(-?[$0-9.,]{2,})|(-?[0-9]+)`; ECMAScript tries the
// alternatives in order at each position and `-?` backtracks to empty.
std::string ref_flexible(const std::string& s) {
  std::string last = kInvalid;
  size_t p = 0;
  while (p < s.size()) {
    size_t len = 0;
    const bool minus = s[p] == '-';
    if (minus && run(s, p + 1, flex_char) >= 2) len = 1 + run(s, p + 1, flex_char);
    else if (run(s, p, flex_char) >= 2) len = run(s, p, flex_char);
    else if (minus && run(s, p + 1, digit) >= 1) len = 1 + run(s, p + 1, digit);
    else if (run(s, p, digit) >= 1) len = run(s, p, digit);
    if (len == 0) {
      ++p;
      continue;
    }
    last = s.substr(p, len);
    p += len;
  }
  return last;
}

// What normalize_answer guarantees for any input: ',' and '$' gone, nothing up to a "#### " left, no leading
// whitespace, ASCII lower case. (Not idempotent: it drops one trailing '.', so "5.." -> "5." -> "5".)
void check_normalized(const std::string& n) {
  check(n.find_first_of(",$") == std::string::npos);
  check(n.find("#### ") == std::string::npos);
  check(n.empty() || std::string_view(" \t\r\n").find(n.front()) == std::string_view::npos);
  for (char c : n) check(!(c >= 'A' && c <= 'Z'));
}

// A normalised extraction is "[invalid]" or a plain number: -?[0-9.]* (',' and '$' removed).
void check_normalized_number(const std::string& n) {
  check_normalized(n);
  if (n == kInvalid) return;
  for (size_t i = 0; i < n.size(); ++i) check(digit(n[i]) || n[i] == '.' || (i == 0 && n[i] == '-'));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t opt = data[0];
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t a = in.find('\0');
  const size_t b = a == std::string::npos ? a : in.find('\0', a + 1);
  std::string response = in.substr(0, a);
  // Responses have no size cap (a server may ignore max_tokens): every eighth input repeats the response to
  // 32 KiB, past libFuzzer's default 4 KiB inputs (slow: ~0.2 s each under ASan).
  if ((opt & 0x38) == 0x38 && !response.empty())
    while (response.size() < 32768) response += response;
  const std::string reference = a == std::string::npos ? "" : in.substr(a + 1, b == std::string::npos ? b : b - a - 1);
  const std::string band = b == std::string::npos ? "" : in.substr(b + 1);

  const std::string strict = extract_strict(response), flexible = extract_flexible(response);
  const bool short_input = response.size() <= 4096;
  check(strict == (short_input ? regex_strict(response) : ref_strict(response)));
  check(flexible == (short_input ? regex_flexible(response) : ref_flexible(response)));
  check_normalized(normalize_answer(response));
  check_normalized_number(normalize_answer(strict));
  check_normalized_number(normalize_answer(flexible));

  EvalRecord r;
  r.response = response;
  r.reference = normalize_answer(reference);
  if (opt & 1) r.error = "HTTP 500";
  score_record(r);
  check(r.strict == normalize_answer(strict) && r.flexible == normalize_answer(flexible));
  check(r.strict_ok == (r.error.empty() && r.strict == r.reference));
  check(r.flexible_ok == (r.error.empty() && r.flexible == r.reference));

  const std::string metric = (opt & 2) ? "strict-match" : (opt & 4) ? reference : "flexible-extract";
  try {
    const Band bd = parse_band(band, metric);
    check(bd.metric == metric && bd.center >= 0 && bd.center <= 100 && bd.tolerance >= 0);
  } catch (const ds::Error&) {
  }
  return 0;
}
