// ByteTokenizer: bytes as ids, a fixed table of special tokens, and its tokenizer_config.json.
#include "tokenizer/byte_tokenizer.h"

#include <nlohmann/json.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace ds {

namespace {

constexpr std::array<const char*, 8> kNamed = {"[BOS]",         "[EOS]",         "<|im_end|>",    "<|im_user|>",
                                               "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[PAD]"};

// Text of special id (kFirstSpecial <= id < kVocabSize), built once.
const std::string& special_text(int32_t id) {
  static const auto table = [] {
    std::vector<std::string> t;
    for (int32_t i = ByteTokenizer::kFirstSpecial; i < ByteTokenizer::kVocabSize; ++i) {
      const size_t k = static_cast<size_t>(i - ByteTokenizer::kFirstSpecial);
      t.push_back(k < kNamed.size() ? std::string(kNamed[k]) : "<|reserved_token_" + std::to_string(i) + "|>");
    }
    return t;
  }();
  return table[static_cast<size_t>(id - ByteTokenizer::kFirstSpecial)];
}

}  // namespace

ByteTokenizer::ByteTokenizer() {
  specials_.bos = 256;
  specials_.eos = 257;
  specials_.im_end = 258;
  specials_.im_user = 259;
  specials_.im_assistant = 260;
  specials_.im_system = 261;
  specials_.im_middle = 262;
  specials_.pad = 263;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    // Every special starts with '[' or '<'; try them only there (longest match wins).
    if (text[i] == '[' || text[i] == '<') {
      int32_t best = -1;
      size_t best_len = 0;
      for (int32_t id = kFirstSpecial; id < kVocabSize; ++id) {
        const std::string& s = special_text(id);
        if (s.size() > best_len && text.substr(i, s.size()) == s) best = id, best_len = s.size();
      }
      if (best >= 0) {
        ids.push_back(best);
        i += best_len;
        continue;
      }
    }
    ids.push_back(static_cast<unsigned char>(text[i]));
    ++i;
  }
  return ids;
}

std::string ByteTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= kVocabSize) DS_THROW("byte tokenizer: token id {} outside [0, {})", id, kVocabSize);
  if (id < kFirstSpecial) return std::string(1, static_cast<char>(id));
  return special_text(id);
}

std::optional<int32_t> ByteTokenizer::special_token_id(std::string_view text) const {
  for (int32_t id = kFirstSpecial; id < kVocabSize; ++id)
    if (special_text(id) == text) return id;
  return std::nullopt;
}

void ByteTokenizer::write_files(const std::string& dir) {
  nlohmann::json added = nlohmann::json::object();
  for (int32_t id = kFirstSpecial; id < kVocabSize; ++id)
    added[std::to_string(id)] = {{"content", special_text(id)}, {"lstrip", false},      {"normalized", false},
                                 {"rstrip", false},             {"single_word", false}, {"special", true}};
  const nlohmann::json j = {{"tokenizer_class", kTokenizerClass},
                            {"vocab_size", kVocabSize},
                            {"bos_token", "[BOS]"},
                            {"eos_token", "[EOS]"},
                            {"pad_token", "[PAD]"},
                            {"added_tokens_decoder", added}};
  std::filesystem::create_directories(dir);
  const auto path = std::filesystem::path(dir) / "tokenizer_config.json";
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) DS_THROW("cannot write {}", path.string());
}

}  // namespace ds
