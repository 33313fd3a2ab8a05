// Loads the tokenizer of a model folder (see tokenizer_loader.h).
#include "tokenizer/tokenizer_loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"

namespace ds::tok {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream f(path);
  if (!f) DS_THROW("cannot open {}", path.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("{}: invalid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

std::unique_ptr<ds::Tokenizer> load_model_tokenizer(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  std::string cls;
  if (fs::exists(config_path)) {
    nlohmann::json config = read_json_file(config_path);
    if (config.is_object() && config.contains("tokenizer_class") && config["tokenizer_class"].is_string())
      cls = config["tokenizer_class"];
  }
#ifdef DELTASERVE_WITH_TIKTOKEN
  if (cls != "deltaserve-byte" && fs::exists(fs::path(dir) / "tiktoken.model"))
    return std::make_unique<TiktokenTokenizer>(load_tiktoken_bpe(dir));
#endif
  return ds::load_tokenizer(dir);
}

#ifdef DELTASERVE_WITH_TIKTOKEN
std::vector<SpecialToken> tiktoken_special_tokens(int32_t num_base_tokens, const nlohmann::json& config) {
  std::map<int64_t, std::string> named;
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const auto& dec = config["added_tokens_decoder"];
    if (!dec.is_object()) DS_THROW("tokenizer_config.json: added_tokens_decoder must be an object");
    for (const auto& [key, entry] : dec.items()) {
      int64_t id = -1;
      if (!key.empty() && key.size() <= 10 &&
          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        id = std::stoll(key);
      if (id < 0) DS_THROW("tokenizer_config.json: added_tokens_decoder key `{}` is not an id", key);
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
        DS_THROW("tokenizer_config.json: added_tokens_decoder[{}] has no string `content`", key);
      named[id] = entry["content"].get<std::string>();
    }
  }
  int64_t first = num_base_tokens;
  if (!named.empty()) {
    const int64_t lo = named.begin()->first, hi = named.rbegin()->first;
    if (lo < num_base_tokens || hi >= first + kKimiNumReservedSpecials) {
      if (lo < num_base_tokens || hi >= lo + kKimiNumReservedSpecials)
        DS_THROW(
            "tokenizer_config.json: special ids {}..{} fit neither the {} slots after the {} ranks nor one "
            "{}-slot block",
            lo, hi, kKimiNumReservedSpecials, num_base_tokens, kKimiNumReservedSpecials);
      first = lo;
    }
  }
  if (first + kKimiNumReservedSpecials > kMaxTokenIds)
    DS_THROW("tokenizer_config.json: special ids from {} pass the largest supported id ({})", first, kMaxTokenIds - 1);
  std::vector<SpecialToken> out;
  out.reserve(kKimiNumReservedSpecials);
  for (int64_t id = first; id < first + kKimiNumReservedSpecials; ++id) {
    auto it = named.find(id);
    out.push_back({it != named.end() ? it->second : fmt::format("<|reserved_token_{}|>", id),
                   static_cast<int32_t>(id)});
  }
  return out;
}

std::unique_ptr<TiktokenBpe> load_tiktoken_bpe(const std::string& dir) {
  std::vector<std::string> ranks = load_tiktoken_ranks((fs::path(dir) / "tiktoken.model").string());
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) config = read_json_file(config_path);
  auto specials = tiktoken_special_tokens(static_cast<int32_t>(ranks.size()), config);
  return std::make_unique<TiktokenBpe>(ranks, std::move(specials));
}
#endif

}  // namespace ds::tok
