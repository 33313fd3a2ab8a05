// ByteTokenizer: the embedded model's tokenizer. Ids 0..255 are bytes, 256..263 the specials, 264..319 reserved.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace ds {

// Ids: 0..255 = the byte, 256 [BOS], 257 [EOS], 258 <|im_end|>, 259 <|im_user|>, 260 <|im_assistant|>,
// 261 <|im_system|>, 262 <|im_middle|>, 263 [PAD], 264..319 <|reserved_token_{id}|>. Vocab 320 (a multiple of 64,
// the padding model vocabularies get for GEMM tiles).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kVocabSize = 320;
  static constexpr int32_t kFirstSpecial = 256;
  static constexpr const char* kTokenizerClass = "deltaserve-byte";  // tokenizer_config.json "tokenizer_class"

  ByteTokenizer();
  std::string kind() const override { return "byte"; }
  int vocab_size() const override { return kVocabSize; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  bool is_special(int32_t id) const override { return id >= kFirstSpecial && id < kVocabSize; }
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  const SpecialTokens& specials() const override { return specials_; }

  // Writes tokenizer_config.json declaring this tokenizer (tokenizer_class + added_tokens_decoder) into dir.
  static void write_files(const std::string& dir);

 private:
  SpecialTokens specials_;
};

}  // namespace ds
