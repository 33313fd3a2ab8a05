// Loads the tokenizer of a model folder: tiktoken.model + tokenizer_config.json (Kimi), or byte-level.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifdef DELTASERVE_WITH_TIKTOKEN
#include "tokenizer/tiktoken.h"
#endif

namespace ds::tok {

// tokenization_kimi.py reserves 256 special ids right after the BPE ranks.
constexpr int32_t kKimiNumReservedSpecials = 256;

#ifdef DELTASERVE_WITH_TIKTOKEN
// The Kimi special-token table: ids num_base_tokens .. +255, named from tokenizer_config.json's
// `added_tokens_decoder` ({"163586": {"content": "<|im_end|>", ...}, ...}); every other slot is
// `<|reserved_token_{id}|>`, as in tokenization_kimi.py. Throws ds::Error on a malformed entry.
std::vector<SpecialToken> kimi_special_tokens(int32_t num_base_tokens,
                                              const nlohmann::json& tokenizer_config);

// Reads dir/tiktoken.model and dir/tokenizer_config.json (the latter optional: all slots reserved).
std::unique_ptr<TiktokenBpe> load_kimi_bpe(const std::string& dir);
#endif

}  // namespace ds::tok
