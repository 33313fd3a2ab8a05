// Loads the tokenizer of a model folder (see tokenizer_loader.h).
#include "tokenizer/tokenizer_loader.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ds::tok {
#ifdef DELTASERVE_WITH_TIKTOKEN
namespace {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) DS_THROW("cannot open {}", path.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("{}: invalid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

std::vector<SpecialToken> kimi_special_tokens(int32_t num_base_tokens, const nlohmann::json& config) {
  std::vector<std::string> names(kKimiNumReservedSpecials);
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const auto& dec = config["added_tokens_decoder"];
    if (!dec.is_object()) DS_THROW("tokenizer_config.json: added_tokens_decoder must be an object");
    for (const auto& [key, entry] : dec.items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0) DS_THROW("tokenizer_config.json: added_tokens_decoder key `{}` is not an id", key);
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
        DS_THROW("tokenizer_config.json: added_tokens_decoder[{}] has no string `content`", key);
      int64_t slot = id - num_base_tokens;
      if (slot < 0 || slot >= kKimiNumReservedSpecials)
        DS_THROW("tokenizer_config.json: special id {} outside {}..{}", id, num_base_tokens,
                 num_base_tokens + kKimiNumReservedSpecials - 1);
      names[static_cast<size_t>(slot)] = entry["content"].get<std::string>();
    }
  }
  std::vector<SpecialToken> out;
  out.reserve(names.size());
  for (int32_t i = 0; i < kKimiNumReservedSpecials; ++i) {
    int32_t id = num_base_tokens + i;
    std::string& n = names[static_cast<size_t>(i)];
    out.push_back({n.empty() ? fmt::format("<|reserved_token_{}|>", id) : std::move(n), id});
  }
  return out;
}

std::unique_ptr<TiktokenBpe> load_kimi_bpe(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> ranks = load_tiktoken_ranks((fs::path(dir) / "tiktoken.model").string());
  nlohmann::json config = nlohmann::json::object();
  fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) config = read_json_file(config_path);
  auto specials = kimi_special_tokens(static_cast<int32_t>(ranks.size()), config);
  return std::make_unique<TiktokenBpe>(ranks, std::move(specials));
}
#endif

}  // namespace ds::tok
