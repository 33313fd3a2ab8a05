// libFuzzer harness: the tiktoken tokenizer on arbitrary bytes. decode(encode(x)) == x for every byte string
// (tiktoken.h), both merge strategies agree, the UTF-8 views (decode, StreamDecoder) agree with each other, and
// arbitrary ids either decode or fail with ds::Error. First byte: mode; the rest: the text or the ids.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tiktoken_utf8.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

using namespace ds::tok;

// The test vocabulary: learned merges (tokens that split UTF-8 chars included) and 256 specials after the
// ranks. The RankTable copy is for calling the two merge strategies directly.
struct Vocab {
  std::vector<std::string> ranks;
  std::unique_ptr<RankTable> table;
  std::unique_ptr<TiktokenTokenizer> tok;
};

const Vocab& vocab() {
  static const Vocab* v = [] {
    auto* out = new Vocab;
    const std::string dir = std::string(DS_SOURCE_DIR) + "/tests/tokenizer/golden/";
    out->ranks = load_tiktoken_ranks(dir + "kimi_test.tiktoken");
    std::ifstream f(dir + "kimi_test_tokenizer_config.json");
    const auto config = nlohmann::json::parse(f);
    out->table = std::make_unique<RankTable>(out->ranks);
    out->tok = std::make_unique<TiktokenTokenizer>(std::make_unique<TiktokenBpe>(
        out->ranks, tiktoken_special_tokens(static_cast<int32_t>(out->ranks.size()), config)));
    return out;
  }();
  return *v;
}

void check(bool ok) {
  if (!ok) std::abort();
}

// The tokenizer's own scanner, independent of utf8_decode_replace (tokenizer.cpp).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = utf8_next(s, i);
    if (!c.valid) return false;
    i += c.len;
  }
  return true;
}

// Tokenizer::decode against StreamDecoder: their documented equality, with and without skip_special.
void check_views(const TiktokenTokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  const std::string whole = t.decode(ids, skip_special);
  check(valid_utf8(whole));
  ds::StreamDecoder d(t, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    check(valid_utf8(piece));  // push() returns complete characters only
    streamed += piece;
  }
  streamed += d.flush();
  check(!d.has_pending() && streamed == whole);
}

void fuzz_text(const Vocab& v, std::string_view text, bool round_trip_only = false) {
  const TiktokenTokenizer& t = *v.tok;
  const TiktokenBpe& bpe = t.bpe();
  const std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids) check(id >= 0 && id < t.vocab_size() && !bpe.token_bytes(id).empty());
  check(bpe.decode(ids) == text);
  if (round_trip_only) return;
  // Without specials their strings are plain text: no special id may come out.
  const std::vector<int32_t> plain = bpe.encode(text, /*allow_special=*/false);
  for (int32_t id : plain) check(!bpe.is_special(id));
  check(bpe.decode(plain) == text);
  // The UTF-8 view of the ids is the replacement-decoded text (the identity for valid UTF-8).
  std::string replaced;
  check(ds::utf8_decode_replace(text, /*final=*/true, &replaced) == text.size());
  check(t.decode(ids) == replaced);
  if (valid_utf8(text)) check(replaced == text);
  check_views(t, ids, false);
  check_views(t, ids, true);
  // bpe_encode_piece picks a merge strategy by length only, so both must give the same ranks on any piece.
  const std::string_view piece = text.substr(0, 1024);
  std::vector<int32_t> scan, heap;
  detail::bpe_merge_scan(*v.table, piece, scan);
  detail::bpe_merge_heap(*v.table, piece, heap);
  check(scan == heap);
  check(bpe.decode(scan) == piece);
}

// Ids from the server's side (sampled ids, client-sent prompt ids): near the vocabulary edges or raw int32.
void fuzz_ids(const Vocab& v, const uint8_t* p, size_t n, bool raw) {
  const TiktokenTokenizer& t = *v.tok;
  const int32_t vocab = t.vocab_size();
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 4 <= n && ids.size() < 256; i += 4) {
    int32_t x;
    std::memcpy(&x, p + i, 4);
    ids.push_back(raw ? x : static_cast<int32_t>(static_cast<uint32_t>(x) % (vocab + 8)) - 4);
  }
  bool all_in_range = true, all_known = true;
  for (int32_t id : ids) {
    all_in_range &= id >= 0 && id < vocab;
    all_known &= !t.bpe().token_bytes(id).empty();
  }
  // TiktokenBpe::decode: fails (ds::Error) exactly on ids that are neither a rank nor a special.
  try {
    const std::string bytes = t.bpe().decode(ids);
    check(all_known);
    std::string replaced;
    ds::utf8_decode_replace(bytes, true, &replaced);
    check(t.decode(ids) == replaced);
  } catch (const ds::Error&) {
    check(!all_known);
  }
  // The Tokenizer interface: every id below vocab_size decodes (gaps to nothing), others throw ds::Error.
  try {
    check_views(t, ids, false);
    check_views(t, ids, true);
    check(all_in_range);
  } catch (const ds::Error&) {
    check(!all_in_range);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Vocab& v = vocab();
  const uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode % 8) {
    case 0:
      fuzz_ids(v, data + 1, size - 1, /*raw=*/false);
      break;
    case 1:
      fuzz_ids(v, data + 1, size - 1, /*raw=*/true);
      break;
    case 2: {
      // Runs over 25,000 chars are cut HF-style: a digit run (3-digit pieces keep BPE cheap; a 25,000-char
      // single piece costs ~0.2 s under ASan) that ends up to 31 chars short of the cut, so the cut lands
      // inside the rest when it starts with non-whitespace. Round trip only: the other checks cost ~40 ms here.
      std::string text(24970 + (mode >> 3), '7');
      text += rest;
      fuzz_text(v, text, /*round_trip_only=*/true);
      break;
    }
    default:
      fuzz_text(v, rest);
  }
  return 0;
}
