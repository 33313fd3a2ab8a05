// GSM8K: answer extraction on crafted responses, normalisation, bands, prompts, and an eval against the fake
// server answering from the dataset (exact expected accuracy).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "tools/fake_server.h"
#include "tools/gsm8k.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

std::string sample() { return (ds::test::source_root() / "tests/tools/data/gsm8k_sample.jsonl").string(); }

std::string strict(const std::string& s) { return normalize_answer(extract_strict(s)); }
std::string flex(const std::string& s) { return normalize_answer(extract_flexible(s)); }

TEST(Gsm8kExtract, StrictTakesTheNumberAfterTheFirstMarker) {
  EXPECT_EQ(strict("so 3 + 4 = 7.\n#### 7"), "7");
  EXPECT_EQ(strict("#### -12"), "-12");
  EXPECT_EQ(strict("#### 1,234"), "1234");
  EXPECT_EQ(strict("#### 3.50"), "3.50");
  EXPECT_EQ(strict("#### 42.\nQuestion: next"), "42");
  EXPECT_EQ(strict("#### 5 and later #### 6"), "5");
  EXPECT_EQ(strict("the answer is 7"), "[invalid]");       // no marker
  EXPECT_EQ(strict("####7"), "[invalid]");                 // the marker needs its space
  EXPECT_EQ(strict("#### $5"), "[invalid]");               // '$' is not in the strict pattern
  EXPECT_EQ(strict(""), "[invalid]");
}

TEST(Gsm8kExtract, FlexibleTakesTheLastNumber) {
  EXPECT_EQ(flex("He has 3 apples and buys 4, so 7 apples."), "7");
  EXPECT_EQ(flex("It costs $1,200.50 in total."), "1200.50");
  EXPECT_EQ(flex("The temperature is -7 degrees"), "-7");
  EXPECT_EQ(flex("answer: 18."), "18");
  EXPECT_EQ(flex("#### 39"), "39");
  EXPECT_EQ(flex("9 then 10 then 11"), "11");
  EXPECT_EQ(flex("no digits at all"), "[invalid]");
  EXPECT_EQ(flex("x = 0.5"), "0.5");
  EXPECT_EQ(flex("I have 5"), "5");  // a single digit matches the second alternative
}

// The hand-written scanners equal the lm-eval-harness regexes (std::regex, safe on short strings) on random
// strings over the characters that matter, and survive what std::regex did not: a very long run of digits.
TEST(Gsm8kExtract, ScannersEqualTheRegexesAndSurviveLongRuns) {
  const std::regex strict(R"(#### (\-?[0-9\.\,]+))");
  const std::regex flexible(R"((-?[$0-9.,]{2,})|(-?[0-9]+))");
  auto want_strict = [&](const std::string& s) {
    std::smatch m;
    return std::regex_search(s, m, strict) ? m[1].str() : std::string("[invalid]");
  };
  auto want_flexible = [&](const std::string& s) {
    std::string last = "[invalid]";
    for (auto it = std::sregex_iterator(s.begin(), s.end(), flexible); it != std::sregex_iterator(); ++it)
      last = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    return last;
  };
  ASSERT_EQ(want_strict("no marker"), extract_strict("no marker"));  // the same spelling of "invalid"
  const std::string alphabet = "#### -$.,0123456789a";
  uint64_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int len = static_cast<int>((x >> 33) % 24);
    for (int k = 0; k < len; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s += alphabet[(x >> 33) % alphabet.size()];
    }
    ASSERT_EQ(extract_strict(s), want_strict(s)) << "'" << s << "'";
    ASSERT_EQ(extract_flexible(s), want_flexible(s)) << "'" << s << "'";
  }
  const std::string digits(1 << 20, '7');
  EXPECT_EQ(extract_flexible("x " + digits), digits);
  EXPECT_EQ(extract_strict("#### -" + digits), "-" + digits);
}

TEST(Gsm8kExtract, NormalisationMatchesReferences) {
  EXPECT_EQ(normalize_answer("Step one.\n#### 1,080"), "1080");
  EXPECT_EQ(normalize_answer("$45"), "45");
  EXPECT_EQ(normalize_answer("  72. "), "72");
  EXPECT_EQ(normalize_answer("a #### b #### 9"), "9");  // up to the last marker
}

TEST(Gsm8kBand, Parsing) {
  const Band b = parse_band("96.5:0.5", "flexible-extract");
  EXPECT_DOUBLE_EQ(b.center, 96.5);
  EXPECT_DOUBLE_EQ(b.tolerance, 0.5);
  for (const char* bad : {"96.5", "a:b", "96.5:-1", "101:1", "96.5:0.5x", ""}) {
    EXPECT_THROW(parse_band(bad, "flexible-extract"), std::exception) << bad;
  }
  EXPECT_THROW(parse_band("96:1", "exact"), std::exception);
}

TEST(Gsm8kData, LoadsAndRejectsBadLines) {
  const auto data = load_gsm8k(sample());
  EXPECT_GE(data.size(), 10u);
  for (const auto& e : data) EXPECT_NE(e.answer.find("#### "), std::string::npos);
  const auto dir = ds::test::scratch_dir("gsm8k-bad");
  const auto bad = (dir / "bad.jsonl").string();
  std::ofstream(bad) << R"({"question": "q", "answer": "no marker"})" "\n";
  try {
    load_gsm8k(bad);
    ADD_FAILURE();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(":1:"), std::string::npos) << e.what();
  }
  std::ofstream(bad) << R"({"question": "q"})" "\n";
  EXPECT_THROW(load_gsm8k(bad), std::exception);
}

TEST(Gsm8kPrompt, FewShotLayout) {
  const std::vector<GsmExample> shots = {{"Q1?", "A1\n#### 1"}, {"Q2?", "A2\n#### 2"}};
  const auto p = build_gsm8k_prompt(shots, "Q3?", EndpointKind::kCompletions);
  EXPECT_EQ(p.get<std::string>(), "Question: Q1?\nAnswer: A1\n#### 1\n\nQuestion: Q2?\nAnswer: A2\n#### 2\n\nQuestion: Q3?\nAnswer:");
  const auto m = build_gsm8k_prompt(shots, "Q3?", EndpointKind::kChat);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[4]["content"], "Question: Q3?\nAnswer:");
}

EvalResult eval_against_oracle(int wrong_every, EndpointKind kind, int fewshot, const std::string& fewshot_path) {
  FakeServerOptions o;
  o.ttft_ms = 1;
  o.itl_ms = 0;
  o.answer = make_gsm8k_oracle(sample(), wrong_every);
  FakeServer srv(o);
  srv.start();
  EvalOptions e;
  e.base_url = srv.base_url();
  e.endpoint = kind;
  e.dataset_path = sample();
  e.fewshot_path = fewshot_path;
  e.num_fewshot = fewshot;
  e.concurrency = 4;
  return run_gsm8k(e, nullptr);
}

TEST(Gsm8kEval, PerfectOracleScoresEverythingAndShotsAreNotScored) {
  const size_t total = load_gsm8k(sample()).size();
  const EvalResult r = eval_against_oracle(0, EndpointKind::kCompletions, 3, "");
  EXPECT_TRUE(r.fewshot_from_dataset);
  EXPECT_EQ(r.n, static_cast<int>(total) - 3);
  EXPECT_EQ(r.strict_correct, r.n);
  EXPECT_EQ(r.flexible_correct, r.n);
  EXPECT_EQ(r.errors, 0);
  EXPECT_DOUBLE_EQ(r.accuracy("flexible-extract"), 100.0);
  std::string why;
  EXPECT_TRUE(band_passes(r, parse_band("99.5:0.5", "flexible-extract"), &why)) << why;
  EXPECT_FALSE(band_passes(r, parse_band("96.5:0.5", "flexible-extract"), &why));
  EXPECT_NE(why.find("above"), std::string::npos);
  // The first scored question is the dataset's 4th, and its prompt holds the three shots.
  EXPECT_EQ(r.records[0].question, load_gsm8k(sample())[3].question);
  const std::string prompt = r.records[0].prompt.get<std::string>();
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), '#'), 12);
}

TEST(Gsm8kEval, WrongAnswersGiveTheExactAccuracyAndFailTheBand) {
  // Every 4th question of the file is answered wrong; with fewshot from a separate file all 16 are scored.
  const auto data = load_gsm8k(sample());
  const EvalResult r = eval_against_oracle(4, EndpointKind::kChat, 2, sample());
  EXPECT_FALSE(r.fewshot_from_dataset);
  ASSERT_EQ(r.n, static_cast<int>(data.size()));
  const int wrong = static_cast<int>(data.size()) / 4;
  EXPECT_EQ(r.flexible_correct, r.n - wrong);
  EXPECT_EQ(r.strict_correct, r.n - wrong);
  EXPECT_FALSE(r.records[3].flexible_ok);
  EXPECT_TRUE(r.records[2].flexible_ok);
  std::string why;
  EXPECT_FALSE(band_passes(r, parse_band("96.5:0.5", "flexible-extract"), &why));
  EXPECT_NE(why.find("below"), std::string::npos);
  const auto j = record_to_json(r.records[3]);
  EXPECT_EQ(j["flexible_extract"]["correct"], false);
  EXPECT_TRUE(j.contains("response"));
  EXPECT_NE(eval_markdown(r, EvalOptions{}, nullptr).find("| strict-match | 12 | 16 | 75.00% |"), std::string::npos);
}

TEST(Gsm8kEval, UnreachableServerCountsErrorsAsWrong) {
  FakeServer srv(FakeServerOptions{});
  srv.start();
  EvalOptions e;
  e.base_url = srv.base_url();
  srv.stop();
  e.dataset_path = sample();
  e.num_fewshot = 1;
  e.limit = 3;
  e.model = "m";
  const EvalResult r = run_gsm8k(e, nullptr);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.errors, 3);
  EXPECT_EQ(r.flexible_correct, 0);
}

}  // namespace
}  // namespace ds::tools
