// Benchmark prompts: seeded random token-id or random-word prompts with fixed or ranged lengths, or a JSONL
// file of prompts; and the request body sent for one prompt.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tools/openai.h"

namespace ds::tools {

enum class PromptMode { kTokens, kText };
PromptMode parse_prompt_mode(const std::string& s);  // "tokens" | "text"

struct LenRange {
  int64_t min = 128, max = 128;  // inclusive
};
// "128" -> [128, 128]; "64:256" -> [64, 256]. Throws on anything else, on 0, and on min > max.
LenRange parse_len_range(const std::string& s, const char* what);

struct DatasetOptions {
  std::string path;              // JSONL file of prompts; empty = random prompts
  LenRange input_len{128, 128};  // tokens (token mode) or words (text mode)
  LenRange output_len{128, 128};
  uint64_t seed = 0;
  PromptMode prompt_mode = PromptMode::kTokens;
  int64_t token_id_min = 100;    // random ids are drawn from [min, max): above the usual special tokens
  int64_t token_id_max = 32000;
};

struct Prompt {
  nlohmann::json prompt;      // completions: a string or an array of token ids
  nlohmann::json messages;    // chat: [{role, content}, ...]
  int64_t input_len = -1;     // prompt length in tokens when known (token-id prompts), else -1
  int64_t output_len = 0;     // max_tokens of this request
};

class Dataset {
 public:
  Dataset(DatasetOptions opt, EndpointKind kind);
  // Deterministic in (seed, index): both sides of an A/B get the same prompt for the same index. File
  // prompts cycle through the file.
  Prompt get(int64_t index) const;

 private:
  DatasetOptions opt_;
  EndpointKind kind_;
  std::vector<Prompt> file_prompts_;
};

// One line for reports ("random token ids (seed 0), input 128 tokens, output 128 tokens"); reads no file.
std::string describe_dataset(const DatasetOptions& opt, EndpointKind kind);

// Parses a JSONL prompt file: one object per line with "prompt" (string or token ids) or "messages", and an
// optional "max_tokens"/"output_len". Errors name the file and the line.
std::vector<Prompt> load_prompt_file(const std::string& path, EndpointKind kind, LenRange default_output);

struct RequestOptions {
  std::string model;
  bool stream = true;
  bool ignore_eos = false;   // sends ignore_eos: true and min_tokens = max_tokens, so lengths stay fixed
  double temperature = 0.0;
  nlohmann::json extra;      // merged last into the body (other engines' knobs)
};
nlohmann::json build_request_body(const Prompt& p, EndpointKind kind, const RequestOptions& o);

}  // namespace ds::tools
