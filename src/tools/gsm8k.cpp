// GSM8K prompts, answer extraction, scoring and the concurrent eval loop (see gsm8k.h).
#include "tools/gsm8k.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/bench.h"
#include "tools/http_client.h"
#include "tools/json_fields.h"

namespace ds::tools {

std::vector<GsmExample> load_gsm8k(const std::string& path) {
  std::vector<GsmExample> out;
  for (const auto& [lineno, j] : read_jsonl(path)) {
    CHECK(j.contains("question") && j["question"].is_string(), "{}:{}: missing string \"question\"", path, lineno);
    CHECK(j.contains("answer") && j["answer"].is_string(), "{}:{}: missing string \"answer\"", path, lineno);
    GsmExample e{j["question"].get<std::string>(), j["answer"].get<std::string>()};
    CHECK(e.answer.find("#### ") != std::string::npos, "{}:{}: answer does not end in '#### N'", path, lineno);
    out.push_back(std::move(e));
  }
  CHECK(!out.empty(), "{} holds no examples", path);
  return out;
}

// The two extractors are the lm-eval-harness regexes, scanned by hand: std::regex recurses once per matched
// character, so a response with a long run of digits (a model that loops) overflowed the stack (fuzz finding).
// gsm8k_test.cpp checks them against std::regex on short random strings.
namespace {
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_number_char(char c) { return is_digit(c) || c == '.' || c == ','; }                // [0-9\.\,]
bool is_flexible_char(char c) { return is_digit(c) || c == '$' || c == '.' || c == ','; }  // [$0-9.,]
size_t run(const std::string& s, size_t i, bool (*in)(char)) {
  size_t j = i;
  while (j < s.size() && in(s[j])) ++j;
  return j - i;
}
}  // namespace

std::string extract_strict(const std::string& response) {  // "#### (\-?[0-9\.\,]+)", first match
  for (size_t p = response.find("#### "); p != std::string::npos; p = response.find("#### ", p + 1)) {
    const size_t i = p + 5;
    if (i < response.size() && response[i] == '-')
      if (const size_t n = run(response, i + 1, is_number_char); n > 0) return response.substr(i, 1 + n);
    if (const size_t n = run(response, i, is_number_char); n > 0) return response.substr(i, n);
  }
  return kInvalid;
}

std::string extract_flexible(const std::string& response) {  // "(-?[$0-9.,]{2,})|(-?[0-9]+)", last match
  std::string last = kInvalid;
  for (size_t i = 0; i < response.size();) {
    const size_t sign = response[i] == '-' ? 1 : 0;
    size_t len = 0;
    if (const size_t n = run(response, i + sign, is_flexible_char); n >= 2) len = sign + n;  // first alternative
    else if (const size_t d = run(response, i + sign, is_digit); d >= 1) len = sign + d;     // second
    if (len == 0) {
      ++i;
      continue;
    }
    last = response.substr(i, len);
    i += len;
  }
  return last;
}

std::string normalize_answer(std::string s) {
  std::erase(s, ',');
  std::erase(s, '$');
  if (const auto p = s.rfind("#### "); p != std::string::npos) s = s.substr(p + 5);
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  s = b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Band parse_band(const std::string& s, const std::string& metric) {
  Band b;
  b.metric = metric;
  CHECK(metric == "flexible-extract" || metric == "strict-match", "band metric '{}' must be flexible-extract or strict-match", metric);
  const auto colon = s.find(':');
  CHECK(colon != std::string::npos, "band '{}' must be CENTER:TOLERANCE (e.g. 96.5:0.5)", s);
  try {
    size_t u1 = 0, u2 = 0;
    const std::string a = s.substr(0, colon), t = s.substr(colon + 1);
    b.center = std::stod(a, &u1);
    b.tolerance = std::stod(t, &u2);
    CHECK(u1 == a.size() && u2 == t.size(), "band '{}' must be CENTER:TOLERANCE", s);
  } catch (const std::logic_error&) {
    DS_THROW("band '{}' must be CENTER:TOLERANCE (numbers, e.g. 96.5:0.5)", s);
  }
  CHECK(b.tolerance >= 0 && b.center >= 0 && b.center <= 100, "band '{}': center in [0, 100], tolerance >= 0", s);
  return b;
}

double EvalResult::accuracy(const std::string& metric) const {
  if (n == 0) return 0;
  return 100.0 * (metric == "strict-match" ? strict_correct : flexible_correct) / n;
}

double EvalResult::stderr_pct(const std::string& metric) const {
  if (n < 2) return 0;
  const double p = accuracy(metric) / 100.0;
  return 100.0 * std::sqrt(p * (1 - p) / (n - 1));
}

nlohmann::json build_gsm8k_prompt(const std::vector<GsmExample>& shots, const std::string& question, EndpointKind kind) {
  if (kind == EndpointKind::kChat) {
    nlohmann::json msgs = nlohmann::json::array();
    for (const auto& s : shots) {
      msgs.push_back({{"role", "user"}, {"content", "Question: " + s.question + "\nAnswer:"}});
      msgs.push_back({{"role", "assistant"}, {"content", s.answer}});
    }
    msgs.push_back({{"role", "user"}, {"content", "Question: " + question + "\nAnswer:"}});
    return msgs;
  }
  std::string p;
  for (const auto& s : shots) p += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  return p + "Question: " + question + "\nAnswer:";
}

void score_record(EvalRecord& r) {
  r.strict = normalize_answer(extract_strict(r.response));
  r.flexible = normalize_answer(extract_flexible(r.response));
  r.strict_ok = r.error.empty() && r.strict == r.reference;
  r.flexible_ok = r.error.empty() && r.flexible == r.reference;
}

EvalResult run_gsm8k(const EvalOptions& opt, Progress* progress) {
  CHECK_GE(opt.num_fewshot, 0);
  CHECK_GE(opt.concurrency, 1);
  std::vector<GsmExample> data = load_gsm8k(opt.dataset_path);
  std::vector<GsmExample> shots;
  EvalResult res;
  if (!opt.fewshot_path.empty()) {
    shots = load_gsm8k(opt.fewshot_path);
    CHECK_LE(static_cast<size_t>(opt.num_fewshot), shots.size());
    shots.resize(opt.num_fewshot);
  } else {
    // The shots come out of the dataset, so they are not scored: a model shown the answer is not tested.
    CHECK(static_cast<size_t>(opt.num_fewshot) < data.size(), "{} has {} examples: too few for {} shots plus one to score",
          opt.dataset_path, data.size(), opt.num_fewshot);
    shots.assign(data.begin(), data.begin() + opt.num_fewshot);
    data.erase(data.begin(), data.begin() + opt.num_fewshot);
    res.fewshot_from_dataset = true;
  }
  res.fewshot = opt.num_fewshot;
  if (opt.limit > 0 && static_cast<size_t>(opt.limit) < data.size()) data.resize(opt.limit);
  res.model = opt.model.empty() ? discover_model(opt.base_url, opt.api_key) : opt.model;
  if (res.model.empty()) res.model = "default";

  res.records.resize(data.size());
  std::atomic<size_t> next{0};
  std::atomic<int> done{0}, failed{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  const int nw = std::min<int>(opt.concurrency, static_cast<int>(data.size()));
  for (int w = 0; w < nw; ++w) {
    workers.emplace_back([&] {
      HttpClient client(opt.base_url, opt.timeout_s, opt.api_key);
      for (size_t i = next++; i < data.size(); i = next++) {
        EvalRecord& r = res.records[i];
        r.index = static_cast<int>(i);
        r.question = data[i].question;
        r.reference = normalize_answer(data[i].answer);
        r.prompt = build_gsm8k_prompt(shots, data[i].question, opt.endpoint);
        // Greedy and stopped where the next few-shot question would begin, as the harness does.
        nlohmann::json body = {{"model", res.model},
                               {"max_tokens", opt.max_tokens},
                               {"temperature", 0},
                               {"stream", false},
                               {"stop", {"Question:", "</s>", "<|im_end|>"}}};
        body[opt.endpoint == EndpointKind::kChat ? "messages" : "prompt"] = r.prompt;
        const HttpReply reply = client.post_json(endpoint_path(opt.endpoint), body);
        if (!reply.ok()) {
          r.error = reply.error.empty() ? fmt::format("HTTP {}: {}", reply.status, reply.body.substr(0, 300)) : reply.error;
        } else {
          try {
            r.response = response_text(nlohmann::json::parse(reply.body), opt.endpoint);
          } catch (const std::exception& e) {
            r.error = fmt::format("bad response: {}", e.what());
          }
        }
        score_record(r);
        if (!r.error.empty()) ++failed;
        ++done;
      }
    });
  }
  while (done.load() < static_cast<int>(data.size())) {
    if (progress) progress->update("gsm8k", done.load(), failed.load(), static_cast<int>(data.size()),
                                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : workers) t.join();
  res.n = static_cast<int>(res.records.size());
  for (const auto& r : res.records) {
    res.strict_correct += r.strict_ok;
    res.flexible_correct += r.flexible_ok;
    res.errors += !r.error.empty();
  }
  if (progress) progress->message(fmt::format("gsm8k: {} questions scored, {} request errors", res.n, res.errors));
  return res;
}

bool band_passes(const EvalResult& r, const Band& band, std::string* why) {
  const double s = r.accuracy(band.metric);
  const double lo = band.center - band.tolerance, hi = band.center + band.tolerance;
  if (s < lo) {
    if (why) *why = fmt::format("{} {:.2f}% is below the band [{:.2f}, {:.2f}]", band.metric, s, lo, hi);
    return false;
  }
  if (s > hi) {
    // Above the band is a failure too: the band pins a known model, and an unexplained jump means the
    // dataset, the prompt or the model is not the one the band was measured with.
    if (why) *why = fmt::format("{} {:.2f}% is above the band [{:.2f}, {:.2f}] (different model or data?)", band.metric, s, lo, hi);
    return false;
  }
  if (why) *why = fmt::format("{} {:.2f}% is within [{:.2f}, {:.2f}]", band.metric, s, lo, hi);
  return true;
}

std::string eval_markdown(const EvalResult& r, const EvalOptions& opt, const Band* band) {
  std::string s = fmt::format("## GSM8K: {}-shot chain of thought, {} endpoint, model '{}' at {}\n\n", r.fewshot,
                              endpoint_name(opt.endpoint), r.model, opt.base_url);
  s += fmt::format("Few-shot examples: {}. Greedy (temperature 0), max_tokens {}.\n\n",
                   r.fewshot_from_dataset ? "the dataset's first ones (not scored)" : opt.fewshot_path, opt.max_tokens);
  s += "| metric | correct | scored | accuracy | stderr |\n|---|---|---|---|---|\n";
  for (const char* m : {"strict-match", "flexible-extract"}) {
    s += fmt::format("| {} | {} | {} | {:.2f}% | ±{:.2f}% |\n", m,
                     std::string(m) == "strict-match" ? r.strict_correct : r.flexible_correct, r.n, r.accuracy(m),
                     r.stderr_pct(m));
  }
  s += "\nstrict-match: the number after the first `#### ` of the response; flexible-extract: the last number in "
       "the response; both normalised (`,` and `$` removed, one trailing `.` removed) and compared exactly with "
       "the reference after its `#### `.\n";
  if (r.errors) s += fmt::format("\n**{} request(s) failed** and are scored as wrong (see the saved records).\n", r.errors);
  if (band) {
    std::string why;
    const bool ok = band_passes(r, *band, &why);
    s += fmt::format("\nBand {:g}:{:g} on {}: **{}** ({})\n", band->center, band->tolerance, band->metric, ok ? "PASS" : "FAIL", why);
  }
  return s;
}

nlohmann::json record_to_json(const EvalRecord& r) {
  nlohmann::json j = {{"index", r.index},
                      {"question", r.question},
                      {"reference", r.reference},
                      {"prompt", r.prompt},
                      {"response", r.response},
                      {"strict_match", {{"extracted", r.strict}, {"correct", r.strict_ok}}},
                      {"flexible_extract", {{"extracted", r.flexible}, {"correct", r.flexible_ok}}}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

}  // namespace ds::tools
