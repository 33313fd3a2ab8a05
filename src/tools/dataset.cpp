// Seeded random prompts, JSONL prompt files, and the OpenAI request body for one prompt.
#include "tools/dataset.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/json_fields.h"

namespace ds::tools {

namespace {
// Common short English words: most BPE vocabularies hold each as one token, so a prompt of n words is
// close to n tokens (usage.prompt_tokens reports the exact count).
constexpr std::array<const char*, 64> kWords = {
    "time", "year", "people", "way",   "day",   "man",   "thing", "woman", "life",  "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case",
    "week", "company", "system", "program", "question", "work", "number", "night", "point", "home", "water",
    "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye",
    "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father",
    "power", "hour", "game", "line", "end", "member", "law", "car"};

int64_t parse_int(const std::string& s, const char* what) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  CHECK(ec == std::errc() && p == s.data() + s.size() && !s.empty(), "{}: '{}' is not an integer", what, s);
  return v;
}

// splitmix64: decorrelates the per-index seeds so neighbouring indices get unrelated prompts.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t draw(std::mt19937_64& rng, LenRange r) {
  return std::uniform_int_distribution<int64_t>(r.min, r.max)(rng);
}
}  // namespace

PromptMode parse_prompt_mode(const std::string& s) {
  if (s == "tokens") return PromptMode::kTokens;
  if (s == "text") return PromptMode::kText;
  DS_THROW("unknown prompt mode '{}' (expected tokens or text)", s);
}

LenRange parse_len_range(const std::string& s, const char* what) {
  LenRange r;
  const auto colon = s.find(':');
  if (colon == std::string::npos) {
    r.min = r.max = parse_int(s, what);
  } else {
    r.min = parse_int(s.substr(0, colon), what);
    r.max = parse_int(s.substr(colon + 1), what);
  }
  CHECK(r.min >= 1 && r.min <= r.max, "{}: '{}' must be N or MIN:MAX with 1 <= MIN <= MAX", what, s);
  return r;
}

Dataset::Dataset(DatasetOptions opt, EndpointKind kind) : opt_(std::move(opt)), kind_(kind) {
  if (!opt_.path.empty()) {
    file_prompts_ = load_prompt_file(opt_.path, kind_, opt_.output_len);
    CHECK(!file_prompts_.empty(), "prompt file {} holds no prompts", opt_.path);
  }
  CHECK(opt_.token_id_min >= 0 && opt_.token_id_min < opt_.token_id_max, "token id range [{}, {}) is empty",
        opt_.token_id_min, opt_.token_id_max);
}

Prompt Dataset::get(int64_t index) const {
  if (!file_prompts_.empty()) return file_prompts_[static_cast<size_t>(index) % file_prompts_.size()];
  std::mt19937_64 rng(mix(opt_.seed ^ mix(static_cast<uint64_t>(index))));
  Prompt p;
  const int64_t n_in = draw(rng, opt_.input_len);
  p.output_len = draw(rng, opt_.output_len);
  // Chat messages carry text, so chat always gets words even in token mode.
  if (opt_.prompt_mode == PromptMode::kTokens && kind_ == EndpointKind::kCompletions) {
    std::uniform_int_distribution<int64_t> id(opt_.token_id_min, opt_.token_id_max - 1);
    std::vector<int64_t> ids(static_cast<size_t>(n_in));
    for (auto& t : ids) t = id(rng);
    p.prompt = ids;
    p.input_len = n_in;
    return p;
  }
  std::uniform_int_distribution<size_t> w(0, kWords.size() - 1);
  std::string text;
  for (int64_t i = 0; i < n_in; ++i) {
    if (i) text += ' ';
    text += kWords[w(rng)];
  }
  if (kind_ == EndpointKind::kChat) {
    p.messages = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
  } else {
    p.prompt = text;
  }
  return p;
}

std::string describe_dataset(const DatasetOptions& opt, EndpointKind kind) {
  if (!opt.path.empty()) return fmt::format("prompt file {}", opt.path);
  const bool ids = opt.prompt_mode == PromptMode::kTokens && kind == EndpointKind::kCompletions;
  auto range = [](LenRange r) { return r.min == r.max ? fmt::format("{}", r.min) : fmt::format("{}..{}", r.min, r.max); };
  return fmt::format("random {} (seed {}), input {} {}, output {} tokens", ids ? "token ids" : "words", opt.seed,
                     range(opt.input_len), ids ? "tokens" : "words", range(opt.output_len));
}

std::vector<Prompt> load_prompt_file(const std::string& path, EndpointKind kind, LenRange default_output) {
  std::vector<Prompt> out;
  std::mt19937_64 rng(0x5eed);
  for (const auto& [lineno, j] : read_jsonl(path)) {
    Prompt p;
    p.output_len = draw(rng, default_output);
    for (const char* key : {"max_tokens", "output_len"}) {
      if (j.contains(key)) {
        CHECK(j[key].is_number_integer() && j[key].get<int64_t>() > 0, "{}:{}: {} must be a positive integer", path,
              lineno, key);
        p.output_len = j[key].get<int64_t>();
      }
    }
    if (j.contains("messages")) {
      CHECK(j["messages"].is_array() && !j["messages"].empty(), "{}:{}: messages must be a non-empty array", path, lineno);
      CHECK(kind == EndpointKind::kChat, "{}:{}: a messages prompt needs --endpoint chat", path, lineno);
      p.messages = j["messages"];
    } else if (j.contains("prompt")) {
      const auto& pr = j["prompt"];
      if (pr.is_string()) {
        if (kind == EndpointKind::kChat) {
          p.messages = nlohmann::json::array({{{"role", "user"}, {"content", pr}}});
        } else {
          p.prompt = pr;
        }
      } else {
        CHECK(pr.is_array() && !pr.empty() && std::all_of(pr.begin(), pr.end(), [](const auto& t) { return t.is_number_integer(); }),
              "{}:{}: prompt must be a string or a non-empty array of token ids", path, lineno);
        CHECK(kind == EndpointKind::kCompletions, "{}:{}: a token-id prompt needs the completions endpoint", path, lineno);
        p.prompt = pr;
        p.input_len = static_cast<int64_t>(pr.size());
      }
    } else {
      DS_THROW("{}:{}: a line needs \"prompt\" or \"messages\"", path, lineno);
    }
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json build_request_body(const Prompt& p, EndpointKind kind, const RequestOptions& o) {
  nlohmann::json b;
  b["model"] = o.model;
  if (kind == EndpointKind::kChat) {
    b["messages"] = p.messages;
  } else {
    b["prompt"] = p.prompt;
  }
  b["max_tokens"] = p.output_len;
  b["temperature"] = o.temperature;
  b["stream"] = o.stream;
  // Usage in the last chunk gives the exact output count even when a chunk carries several tokens.
  if (o.stream) b["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) {
    b["ignore_eos"] = true;
    b["min_tokens"] = p.output_len;
  }
  if (o.extra.is_object()) b.update(o.extra);
  return b;
}

}  // namespace ds::tools
