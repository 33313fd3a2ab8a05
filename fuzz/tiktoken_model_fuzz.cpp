// libFuzzer harness: what load_tiktoken_bpe reads from a model folder, from memory. Input: tiktoken.model text,
// optionally followed by '\0' and tokenizer_config.json. Only ds::Error may escape; accepted rank files must
// re-serialise to the same table, the special table must have the documented shape (256 consecutive ids from
// the ranks' end or from its lowest named id), and a vocabulary TiktokenBpe accepts must encode losslessly.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

using namespace ds::tok;

void check(bool ok) {
  if (!ok) std::abort();
}

std::string base64(std::string_view in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) out += k[(acc >> (bits -= 6)) & 63];
  }
  if (bits) out += k[(acc << (6 - bits)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view model = in.substr(0, nul);
  std::vector<std::string> ranks;
  try {
    ranks = parse_tiktoken_ranks(model, "fuzz");
  } catch (const ds::Error&) {
    return 0;
  }
  // Accepted: the last rank is a token (ranks are only created by assignment), and writing the table back in
  // the file format reads back identically.
  check(!ranks.empty() && !ranks.back().empty());
  std::string rewritten;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (!ranks[r].empty()) rewritten += base64(ranks[r]) + " " + std::to_string(r) + "\n";
  check(parse_tiktoken_ranks(rewritten, "rewritten") == ranks);

  nlohmann::json config = nlohmann::json::object();  // no tokenizer_config.json: all slots reserved
  if (nul != std::string_view::npos) {
    config = nlohmann::json::parse(in.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return 0;  // read_json_file rejects it before this point
  }
  const auto num_base = static_cast<int32_t>(ranks.size());
  std::vector<SpecialToken> specials;
  try {
    specials = tiktoken_special_tokens(num_base, config);
  } catch (const ds::Error&) {
    return 0;
  }
  // tokenizer_loader.h: 256 slots, consecutive ids, starting at num_base_tokens or at the lowest named id above.
  check(specials.size() == static_cast<size_t>(kKimiNumReservedSpecials));
  for (size_t i = 0; i < specials.size(); ++i) {
    check(static_cast<int64_t>(specials[i].id) >= num_base);
    check(static_cast<int64_t>(specials[i].id) == static_cast<int64_t>(specials[0].id) + static_cast<int64_t>(i));
  }

  std::unique_ptr<TiktokenBpe> bpe;
  try {
    bpe = std::make_unique<TiktokenBpe>(ranks, specials);
  } catch (const ds::Error&) {
    return 0;  // e.g. a single byte without a rank, duplicate token bytes, duplicate special texts
  }
  check(bpe->num_base_tokens() == num_base);
  check(bpe->vocab_size() == specials.back().id + 1);
  for (const auto& s : specials) check(bpe->special_id(s.text) == s.id && bpe->is_special(s.id));
  // Any accepted vocabulary is byte-level: the input itself (specials included) must encode losslessly.
  const std::vector<int32_t> ids = bpe->encode(in);
  for (int32_t id : ids) check(id >= 0 && id < bpe->vocab_size());
  check(bpe->decode(ids) == in);
  return 0;
}
