// Loads the tokenizer of a model folder: tiktoken.model + tokenizer_config.json (Kimi), or byte-level.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

#ifdef DELTASERVE_WITH_TIKTOKEN
#include "tokenizer/tiktoken.h"
#endif

namespace ds::tok {

// tokenization_kimi.py reserves 256 special ids right after the BPE ranks.
constexpr int32_t kKimiNumReservedSpecials = 256;

// The tokenizer of a model folder:
//   tokenizer_config.json says "tokenizer_class": "deltaserve-byte"  -> the byte tokenizer (ds::load_tokenizer)
//   tiktoken.model present                                           -> TiktokenTokenizer (Kimi BPE)
//   otherwise                                                        -> ds::load_tokenizer's error
// Builds without PCRE2 cannot load tiktoken.model and say so.
std::unique_ptr<ds::Tokenizer> load_model_tokenizer(const std::string& dir);

#ifdef DELTASERVE_WITH_TIKTOKEN
// The Kimi special-token table (tokenization_kimi.py): 256 slots, named from tokenizer_config.json's
// `added_tokens_decoder` ({"163586": {"content": "<|im_end|>", ...}}), every other slot
// `<|reserved_token_{id}|>`. The slots start right after the ranks (num_base_tokens), as in HF; a config whose
// named ids all lie in one 256-block further up (the byte-level tiktoken.model `make-model` writes: 256 ranks,
// specials at 163584..) starts the slots at its lowest named id, leaving the ids between as unused gaps.
// Throws ds::Error on a malformed entry or ids that fit neither layout.
std::vector<SpecialToken> tiktoken_special_tokens(int32_t num_base_tokens, const nlohmann::json& tokenizer_config);

// Reads dir/tiktoken.model and dir/tokenizer_config.json (the latter optional: all slots reserved).
std::unique_ptr<TiktokenBpe> load_tiktoken_bpe(const std::string& dir);
#endif

}  // namespace ds::tok
