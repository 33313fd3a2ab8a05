// Qualification criteria and matrices: parsing, static checks and evaluation on synthetic points.
#include <gtest/gtest.h>

#include "tools/criterion.h"
#include "tools/matrix.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

TEST(Criterion, Parses) {
  auto c = parse_criterion("parity at c>=3");
  ASSERT_EQ(c.clauses.size(), 1u);
  EXPECT_EQ(c.clauses[0].kind, Clause::Kind::kParity);
  EXPECT_EQ(c.clauses[0].at.op, Selector::Op::kGe);
  EXPECT_EQ(c.clauses[0].at.value, 3);
  c = parse_criterion(">= +5% at c1 and parity at c>=3");
  ASSERT_EQ(c.clauses.size(), 2u);
  EXPECT_EQ(c.clauses[0].kind, Clause::Kind::kDelta);
  EXPECT_EQ(c.clauses[0].op, ">=");
  EXPECT_DOUBLE_EQ(c.clauses[0].value, 5);
  EXPECT_EQ(c.clauses[0].at.op, Selector::Op::kEq);
  c = parse_criterion(">= -3% vs stage 4 cand");
  EXPECT_EQ(c.clauses[0].kind, Clause::Kind::kDeltaVsStage);
  EXPECT_EQ(c.clauses[0].stage, 4);
  EXPECT_EQ(c.clauses[0].side, "cand");
  EXPECT_EQ(c.clauses[0].at.op, Selector::Op::kAll);
  c = parse_criterion("equals stage 6 at c>=3");
  EXPECT_EQ(c.clauses[0].kind, Clause::Kind::kEquals);
  EXPECT_EQ(c.clauses[0].stage, 6);
  c = parse_criterion(">= 120 tps/user at c<=2 and no failures");
  EXPECT_EQ(c.clauses[0].kind, Clause::Kind::kAbsolute);
  EXPECT_EQ(c.clauses[0].at.op, Selector::Op::kLe);
  EXPECT_EQ(c.clauses[1].kind, Clause::Kind::kNoFailures);
  for (const char* bad : {"", "fast", "parity at c>=x", "parity at q3", ">= 5 at c1", "equals stage", "parity and",
                          ">= 5% vs stage x"}) {
    EXPECT_THROW(parse_criterion(bad), ds::Error) << bad;
  }
}

StagePoints ab_points(std::map<int, std::pair<std::vector<double>, std::vector<double>>> data, AbOptions o = {}) {
  StagePoints p;
  p.is_ab = true;
  for (auto& [c, bc] : data) {
    p.base[c] = bc.first;
    p.cand[c] = bc.second;
    p.verdicts[c] = judge_ab_point({c, bc.first, bc.second}, o);
  }
  return p;
}

TEST(Criterion, AbVerdictsPerSelectedPoint) {
  // c1: +10 % (better), c3 and c8: parity.
  const StagePoints p = ab_points({{1, {{100, 100, 100}, {110, 110, 110}}},
                                   {3, {{100, 101, 100}, {100, 100, 101}}},
                                   {8, {{50, 50, 50}, {50.2, 50, 50.1}}}});
  const AbOptions o;
  EXPECT_TRUE(evaluate_criterion(parse_criterion("parity at c>=3"), p, {}, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion("parity"), p, {}, o).pass);
  EXPECT_TRUE(evaluate_criterion(parse_criterion(">= +5% at c1 and parity at c>=3"), p, {}, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion(">= +15% at c1"), p, {}, o).pass);
  EXPECT_TRUE(evaluate_criterion(parse_criterion("better at c1 and not worse"), p, {}, o).pass);
  const auto none = evaluate_criterion(parse_criterion("parity at c>=16"), p, {}, o);
  EXPECT_FALSE(none.pass);
  EXPECT_NE(none.detail.find("no measured concurrency"), std::string::npos);
}

TEST(Criterion, AnomalyFailsButIsNotCalledARegression) {
  const StagePoints p = ab_points({{4, {{100, 100, 100}, {80, 80, 105}}}});
  const auto out = evaluate_criterion(parse_criterion("not worse"), p, {}, AbOptions{});
  EXPECT_FALSE(out.pass);
  EXPECT_NE(out.detail.find("ANOMALY"), std::string::npos);
  EXPECT_NE(out.detail.find("not a regression"), std::string::npos);
}

TEST(Criterion, CrossStageComparisons) {
  StagePoints base;
  base.tps_user = {{1, {100, 101}}, {4, {50, 50}}};
  StagePoints cand;
  cand.tps_user = {{1, {96, 97}}, {4, {50, 51}}};
  const StagePoints ab = ab_points({{4, {{50, 50}, {60, 60}}}});
  const std::map<int, StagePoints> others = {{3, base}, {7, ab}};
  AbOptions o;
  o.noise_floor_pct = 2;
  // c1: 96.5 vs 100.5 = -3.98 %; c4: +1 %.
  EXPECT_TRUE(evaluate_criterion(parse_criterion(">= -5% vs stage 3"), cand, others, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion(">= -3% vs stage 3"), cand, others, o).pass);
  EXPECT_TRUE(evaluate_criterion(parse_criterion(">= -3% vs stage 3 at c4"), cand, others, o).pass);
  EXPECT_TRUE(evaluate_criterion(parse_criterion("equals stage 3 at c4"), cand, others, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion("equals stage 3 at c1"), cand, others, o).pass);
  EXPECT_TRUE(evaluate_criterion(parse_criterion("equals stage 7 base at c4"), cand, others, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion("equals stage 7 cand at c4"), cand, others, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion("equals stage 9"), cand, others, o).pass);  // no data
  EXPECT_TRUE(evaluate_criterion(parse_criterion(">= 90 tps/user at c1"), cand, others, o).pass);
  EXPECT_FALSE(evaluate_criterion(parse_criterion(">= 97 tps/user at c1"), cand, others, o).pass);
  cand.failed_requests = 2;
  EXPECT_FALSE(evaluate_criterion(parse_criterion("no failures"), cand, others, o).pass);
}

nlohmann::json matrix_with(nlohmann::json stages) {
  return {{"servers", {{"a", {{"command", {"x"}}}}, {"b", {{"command", {"y"}}, {"gpus", 2}}}}},
          {"resources", {{"gpus", 2}}},
          {"stages", std::move(stages)}};
}

void expect_matrix_error(const nlohmann::json& stages, const std::string& needle) {
  try {
    parse_matrix(matrix_with(stages), "m.json");
    ADD_FAILURE() << "no error for " << stages.dump();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Matrix, ShippedExampleParses) {
  const Matrix m = load_matrix((ds::test::source_root() / "recipes/validate_embedded.json").string());
  ASSERT_GE(m.stages.size(), 6u);
  bool modes[5] = {};
  for (const auto& s : m.stages) modes[static_cast<int>(s.mode)] = true;
  for (const bool b : modes) EXPECT_TRUE(b) << "the example should show every mode";
  EXPECT_EQ(m.stages[0].id, 1);
  EXPECT_TRUE(m.stages[0].exclusive);
}

TEST(Matrix, StaticChecks) {
  using J = nlohmann::json;
  const J tests = {{"id", 1}, {"mode", "tests"}, {"command", {"true"}}};
  const J sweep = {{"id", 2}, {"mode", "sweep"}, {"server", "a"}};
  EXPECT_NO_THROW(parse_matrix(matrix_with({tests, sweep}), "m.json"));
  expect_matrix_error({tests, tests}, "used twice");
  expect_matrix_error({{{"id", 1}, {"mode", "bench"}}}, "unknown mode 'bench'");
  expect_matrix_error({{{"mode", "tests"}, {"command", {"true"}}}}, "\"id\"");
  expect_matrix_error({{{"id", 1}, {"mode", "tests"}}}, "non-empty \"command\"");
  expect_matrix_error({{{"id", 1}, {"mode", "sweep"}, {"server", "zz"}}}, "unknown server 'zz'");
  expect_matrix_error({{{"id", 1}, {"mode", "ab"}, {"base", "a"}, {"cand", "a"}}}, "needs a criterion");
  expect_matrix_error({{{"id", 1}, {"mode", "negative-control"}, {"server", "a"}}}, "needs a criterion");
  expect_matrix_error({{{"id", 1}, {"mode", "sweep"}, {"server", "a"}, {"criterion", "parity"}}}, "ab stage");
  expect_matrix_error({tests, {{"id", 2}, {"mode", "sweep"}, {"server", "a"}, {"criterion", "equals stage 1"}}},
                      "no tps/user");
  expect_matrix_error({sweep, {{"id", 3}, {"mode", "sweep"}, {"server", "a"}, {"criterion", "equals stage 5"}}},
                      "unknown stage 5");
  expect_matrix_error({{{"id", 1}, {"mode", "ab"}, {"base", "a"}, {"cand", "a"}, {"criterion", "parity"}},
                       {{"id", 2}, {"mode", "sweep"}, {"server", "a"}, {"criterion", "equals stage 1"}}},
                      "say which side");
  expect_matrix_error({{{"id", 1}, {"mode", "tests"}, {"command", {"true"}}, {"requires", {2}}},
                       {{"id", 2}, {"mode", "tests"}, {"command", {"true"}}, {"requires", {1}}}},
                      "cycle");
  expect_matrix_error({{{"id", 1}, {"mode", "tests"}, {"command", {"true"}}, {"requires", {9}}}}, "unknown stage 9");
  expect_matrix_error({{{"id", 1}, {"mode", "ab"}, {"base", "b"}, {"cand", "b"}, {"criterion", "parity"}}}, "needs 4 GPUs");
  expect_matrix_error({{{"id", 1}, {"mode", "gsm8k"}, {"server", "a"}, {"dataset", "d"}, {"band", "96.5"}}}, "CENTER:TOLERANCE");
  expect_matrix_error({{{"id", 1}, {"mode", "sweep"}, {"server", "a"}, {"critrion", "x"}}}, "\"critrion\"");
  expect_matrix_error({{{"id", 1}, {"mode", "tests"}, {"command", {"true"}}, {"criterion", "parity"}}}, "exit code");
  // Fuzz findings: an id past int was narrowed (4294967297 became stage 1), and numbers in criteria past int or
  // double threw std::out_of_range instead of naming the criterion.
  expect_matrix_error({{{"id", 4294967297LL}, {"mode", "tests"}, {"command", {"true"}}}},
                      "\"id\" = 4294967297 is out of range");
  auto ab = [](const std::string& criterion) {
    return nlohmann::json{{"id", 1}, {"mode", "ab"}, {"base", "a"}, {"cand", "a"}, {"criterion", criterion}};
  };
  expect_matrix_error(nlohmann::json::array({ab("parity at c99999999999")}),
                      "criterion 'parity at c99999999999': 99999999999 is out of range");
  expect_matrix_error(nlohmann::json::array({ab(">= 1" + std::string(400, '0') + "%")}), "is out of range");
}

TEST(Matrix, StageEnvOverridesServerEnvAndIsShown) {
  const nlohmann::json doc = {
      {"servers", {{"a", {{"command", {"x"}}, {"env", {{"K", "1"}, {"J", "0"}}}}}}},
      {"bench", {{"concurrency", {1, 2}}, {"repeats", 2}}},
      {"stages", {{{"id", 1}, {"mode", "sweep"}, {"server", "a"}, {"env", {{"K", "2"}}}, {"concurrency", {4}}}}}};
  const Matrix m = parse_matrix(doc, "m.json");
  const Stage& s = m.stages[0];
  EXPECT_EQ(s.server->env.at("K"), "2");
  EXPECT_EQ(s.server->env.at("J"), "0");
  EXPECT_EQ(s.bench.bench.concurrencies, std::vector<int>{4});
  EXPECT_EQ(s.bench.repeats, 2);
  EXPECT_EQ(s.env_text(), "server=a; K=2");
  EXPECT_EQ(s.criterion_text(), "no failures");
}

}  // namespace
}  // namespace ds::tools
