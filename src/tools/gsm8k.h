// `deltaserve eval gsm8k`: few-shot chain-of-thought GSM8K against any OpenAI-compatible endpoint, scored the
// way lm-evaluation-harness scores its gsm8k task (strict-match and flexible-extract), checked against a band.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/openai.h"

namespace ds::tools {

class Progress;

struct GsmExample {
  std::string question;
  std::string answer;  // reasoning ending in "#### N"
};
// JSONL with "question" and "answer"; errors name the line. Every answer must contain "#### ".
std::vector<GsmExample> load_gsm8k(const std::string& path);

inline constexpr const char* kInvalid = "[invalid]";
// strict-match: the number right after the first "#### " (pattern `#### (-?[0-9.,]+)`), else "[invalid]".
std::string extract_strict(const std::string& response);
// flexible-extract: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)` in the response, else "[invalid]".
std::string extract_flexible(const std::string& response);
// Normalisation applied to extracted answers and references before the exact comparison: drop ',' and '$',
// drop everything up to the last "#### ", drop one trailing '.', lower-case, trim.
std::string normalize_answer(std::string s);

struct Band {
  double center = 0, tolerance = 0;  // pass iff center - tolerance <= score <= center + tolerance (percent)
  std::string metric = "flexible-extract";
};
Band parse_band(const std::string& s, const std::string& metric);  // "96.5:0.5"

struct EvalOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;            // "" = first of /v1/models
  EndpointKind endpoint = EndpointKind::kCompletions;
  std::string dataset_path;
  std::string fewshot_path;     // "" = the dataset's first num_fewshot examples (then not scored)
  int num_fewshot = 5;
  int concurrency = 8;
  int limit = 0;                // 0 = all
  int max_tokens = 256;
  double timeout_s = 600;
};

struct EvalRecord {
  int index = 0;
  std::string question, reference;  // reference = normalised "#### N"
  nlohmann::json prompt;            // string (completions) or messages (chat)
  std::string response;
  std::string strict, flexible;     // normalised extractions
  bool strict_ok = false, flexible_ok = false;
  std::string error;                // request failure (scored as wrong)
};

struct EvalResult {
  std::string model;
  int n = 0, strict_correct = 0, flexible_correct = 0, errors = 0;
  int fewshot = 0;
  bool fewshot_from_dataset = false;
  std::vector<EvalRecord> records;
  double accuracy(const std::string& metric) const;  // percent
  double stderr_pct(const std::string& metric) const;  // sqrt(p (1 - p) / (n - 1)), percent
};

// Prompt for one question: "Question: q\nAnswer: a\n\n" per shot, then "Question: q\nAnswer:" (completions);
// for chat the shots are user/assistant turns.
nlohmann::json build_gsm8k_prompt(const std::vector<GsmExample>& shots, const std::string& question, EndpointKind kind);
// Scores one response against an example (fills strict/flexible fields).
void score_record(EvalRecord& r);

EvalResult run_gsm8k(const EvalOptions& opt, Progress* progress);
// Table of both scores with counts, and the band verdict line when `band` is given.
std::string eval_markdown(const EvalResult& r, const EvalOptions& opt, const Band* band);
// True when the band's metric lies within it; `why` explains a failure (below or above).
bool band_passes(const EvalResult& r, const Band& band, std::string* why);
nlohmann::json record_to_json(const EvalRecord& r);

}  // namespace ds::tools
