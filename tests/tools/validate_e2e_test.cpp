// A qualification matrix run end to end with `deltaserve fake-server` children: every mode, PASS, FAIL and
// NOT RUN, same-moment scheduling, and the report.
#include <gtest/gtest.h>

#include <filesystem>

#include "tools/validate.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

nlohmann::json fake(const std::string& itl, std::vector<std::string> extra = {}) {
  std::vector<std::string> cmd = {ds::test::deltaserve_bin(), "fake-server", "--port", "{port}", "--ttft-ms", "20", "--itl-ms", itl};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return {{"command", cmd}, {"health_timeout_s", 20}, {"stop_grace_s", 5}};
}

TEST(ValidateE2E, MatrixWithEveryModeAndStatus) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("validate");
  const std::string sample = (ds::test::source_root() / "tests/tools/data/gsm8k_sample.jsonl").string();
  using J = nlohmann::json;
  // Seven server stages share the CPU at once, so the noise settings are wide: this test checks the
  // mechanics (modes, statuses, scheduling, report); the A/B estimator has exact tests of its own.
  const J doc = {
      {"name", "fake qualification"},
      {"jobs", 4},
      {"servers", {{"slow", fake("40")}, {"fast", fake("10")}, {"slow2", fake("40")},
                   {"oracle", fake("0", {"--answers", sample, "--wrong-every", "4"})}}},
      {"bench", {{"concurrency", {1, 2}}, {"input_len", 8}, {"output_len", 6}, {"requests_per_user", 1},
                 {"repeats", 2}, {"noise_floor_pct", 25}, {"max_noise_pct", 200}}},
      {"stages",
       {{{"id", 1}, {"name", "ok command"}, {"mode", "tests"}, {"command", {"true"}}},
        {{"id", 2}, {"name", "failing command"}, {"mode", "tests"}, {"command", {"sh", "-c", "echo broken; exit 3"}}},
        {{"id", 3}, {"name", "after the failure"}, {"mode", "tests"}, {"command", {"true"}}, {"requires", {2}}},
        {{"id", 4}, {"name", "baseline sweep"}, {"mode", "sweep"}, {"server", "slow"}, {"requires", {1}}},
        {{"id", 5}, {"name", "faster candidate"}, {"mode", "sweep"}, {"server", "fast"}, {"requires", {1}},
         {"criterion", ">= +100% vs stage 4"}},
        {{"id", 6}, {"mode", "ab"}, {"base", "slow"}, {"cand", "fast"}, {"criterion", "better"}, {"requires", {1}}},
        {{"id", 7}, {"mode", "ab"}, {"base", "slow"}, {"cand", "slow2"}, {"criterion", "parity at c>=1"}, {"requires", {1}}},
        {{"id", 8}, {"mode", "negative-control"}, {"server", "slow2"}, {"env", {{"DS_SOME_KNOB", "0"}}},
         {"criterion", "equals stage 7 base"}, {"requires", {1}}},
        {{"id", 9}, {"mode", "gsm8k"}, {"server", "oracle"}, {"dataset", sample}, {"fewshot", sample}, {"num_fewshot", 2},
         {"band", "75:1"}, {"requires", {1}}},
        {{"id", 10}, {"name", "impossible target"}, {"mode", "sweep"}, {"server", "fast"}, {"requires", {1}},
         {"criterion", ">= 1000 tps/user at c1"}}}}};
  const Matrix m = parse_matrix(doc, "fake.json");
  ds::test::with_retry(3, [&](ds::test::Complaints& c) {
    ValidateOptions opt;
    opt.out_prefix = (dir / "q").string();
    opt.progress_lines = false;
    const ValidateReport rep = run_matrix(m, opt);
    ASSERT_EQ(rep.results.size(), 10u);
    const StageStatus expect[] = {StageStatus::kPass, StageStatus::kFail, StageStatus::kNotRun, StageStatus::kPass,
                                  StageStatus::kPass, StageStatus::kPass, StageStatus::kPass,  StageStatus::kPass,
                                  StageStatus::kPass, StageStatus::kFail};
    for (size_t i = 0; i < 10; ++i) {
      c.check(rep.results[i].status == expect[i], "stage " + std::to_string(rep.results[i].id) + " is " +
                                                      stage_status_name(rep.results[i].status) + ": " +
                                                      rep.results[i].result + "\n" + rep.results[i].detail);
    }
    if (!c.list.empty()) return;
    EXPECT_TRUE(rep.any_fail);
    EXPECT_EQ(rep.json["overall"], "FAIL");
    EXPECT_NE(rep.results[2].result.find("requires stage 2 (FAIL)"), std::string::npos);
    EXPECT_NE(rep.results[1].detail.find("broken"), std::string::npos) << "a failing command's log tail is shown";
    EXPECT_NE(rep.results[8].result.find("flexible 75.00%"), std::string::npos) << rep.results[8].result;
    // Stages 4 and 5 started together (jobs = 4), so their comparison is same-moment; the tests ran alone first.
    EXPECT_NE(rep.results[4].detail.find("same moment as stage 4"), std::string::npos) << rep.results[4].detail;
    EXPECT_GE(rep.results[3].start_s, rep.results[1].end_s);
    EXPECT_NE(rep.markdown.find("| # | stage | mode | env | concurrencies | criterion | result | status |"), std::string::npos);
    EXPECT_NE(rep.markdown.find("| 3 | after the failure | tests |"), std::string::npos);
    EXPECT_NE(rep.markdown.find("**NOT RUN**"), std::string::npos);
    EXPECT_NE(rep.markdown.find("DS_SOME_KNOB=0"), std::string::npos);
    EXPECT_NE(rep.markdown.find("Overall: **FAIL** (7 PASS, 2 FAIL, 1 NOT RUN)"), std::string::npos) << rep.markdown;
    EXPECT_TRUE(std::filesystem::exists(dir / "q.stage9.gsm8k.jsonl"));
    EXPECT_TRUE(std::filesystem::exists(dir / "q.stage6.json"));
    EXPECT_TRUE(std::filesystem::exists(dir / "q.stage6.svg"));
  });
}

TEST(ValidateE2E, ServerThatNeverStartsFailsItsStageOnly) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("validate-dead");
  const nlohmann::json doc = {
      {"servers", {{"dead", fake("10", {"--health-delay-ms", "60000", "--exit-after-ms", "100"})}, {"ok", fake("10")}}},
      {"bench", {{"concurrency", {1}}, {"input_len", 4}, {"output_len", 4}, {"requests_per_user", 1}, {"repeats", 1}}},
      {"stages", {{{"id", 1}, {"mode", "sweep"}, {"server", "dead"}},
                  {{"id", 2}, {"mode", "sweep"}, {"server", "ok"}, {"criterion", "equals stage 1"}},
                  {{"id", 3}, {"mode", "sweep"}, {"server", "ok"}}}}};
  ValidateOptions opt;
  opt.out_prefix = (dir / "q").string();
  opt.progress_lines = false;
  const ValidateReport rep = run_matrix(parse_matrix(doc, "dead.json"), opt);
  EXPECT_EQ(rep.results[0].status, StageStatus::kFail);
  EXPECT_NE(rep.results[0].result.find("before becoming healthy"), std::string::npos) << rep.results[0].result;
  EXPECT_EQ(rep.results[1].status, StageStatus::kFail);  // its reference has no data
  EXPECT_EQ(rep.results[2].status, StageStatus::kPass);
}

}  // namespace
}  // namespace ds::tools
