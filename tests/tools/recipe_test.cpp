// Recipe files: the shipped recipes parse; malformed ones fail with errors that name the place.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tools/recipe.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

void expect_error(const std::string& json, const std::string& needle) {
  try {
    parse_recipes(nlohmann::json::parse(json), "r.json");
    ADD_FAILURE() << "no error for " << json;
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Recipes, ShippedFileParses) {
  const auto recipes = load_recipes((ds::test::source_root() / "recipes/recipes.json").string());
  for (const char* name : {"tep8", "tep16", "dep16-lo", "dep16-hi", "embedded-smoke", "embedded-ab", "tep8-fused-ar-ab"}) {
    ASSERT_TRUE(recipes.count(name)) << name;
  }
  const Recipe& lo = recipes.at("dep16-lo");
  EXPECT_EQ(lo.bench.bench.concurrencies.front(), 16);
  EXPECT_EQ(lo.bench.bench.concurrencies.back(), 256);
  EXPECT_EQ(recipes.at("dep16-hi").bench.bench.concurrencies, (std::vector<int>{512, 1024}));
  EXPECT_EQ(recipes.at("tep8").server->gpus, 8);
  EXPECT_TRUE(recipes.at("tep8").bench.bench.request.ignore_eos);
  // A/B sides inherit the server's command and add their knob.
  const Recipe& ab = recipes.at("tep8-fused-ar-ab");
  ASSERT_TRUE(ab.base && ab.cand);
  EXPECT_EQ(ab.base->command, ab.server->command);
  EXPECT_EQ(ab.base->env.at("DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS"), "0");
  EXPECT_EQ(ab.cand->env.at("DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS"), "2");
  EXPECT_EQ(ab.cand->env.at("NCCL_NVLS_ENABLE"), "0");
  EXPECT_EQ(recipes.at("embedded-smoke").bench.bench.dataset.prompt_mode, PromptMode::kText);
}

TEST(Recipes, ErrorsNameTheProblem) {
  expect_error(R"({"recipes": {}})", "non-empty");
  expect_error(R"({"recipez": {}})", "missing \"recipes\"");
  expect_error(R"({"recipes": {"a": {"bench": {}}}})", "needs \"server\" or \"ab\"");
  expect_error(R"({"recipes": {"a": {"server": {"command": []}}}})", "non-empty array");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x", 3]}}}})", "must hold strings");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "prot": 1}}}})", "unknown key(s) \"prot\"");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"concurency": [1]}}}})", "\"concurency\"");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"concurrency": [0]}}}})", "positive integers");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"concurrency": "1,2"}}}})", "array");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"input_len": "9:3"}}}})", "input_len");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"endpoint": "embeddings"}}}})", "unknown endpoint");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"]}, "bench": {"repeats": 0}}}})", "repeats");
  expect_error(R"({"recipes": {"a": {"ab": {"base": {"command": ["x"]}}}}})", "missing \"cand\"");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "env": {"K": [1]}}}}})", "must be a string");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "port": 70000}}}})", "out of range");
  // Numbers past int are refused, not narrowed (4294967376 read as port 80; fuzz findings), and gpus is bounded
  // so a stage's sum of three cannot overflow.
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "port": 4294967376}}}})",
               "\"port\" = 4294967376 is out of range");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "port": 18446744073709551615}}}})", "out of range");
  expect_error(R"({"recipes": {"a": {"server": {"command": ["x"], "gpus": 2147483647}}}})", "gpus must be in [0, 4096]");
  // The error names the recipe.
  expect_error(R"({"recipes": {"my-recipe": {"server": {"command": []}}}})", "recipe 'my-recipe'");
}

TEST(Recipes, UnknownNameListsTheAvailableOnes) {
  const auto r = parse_recipes(nlohmann::json::parse(R"({"recipes": {"a": {"server": {"command": ["x"]}}, "b": {"server": {"command": ["y"]}}}})"), "r.json");
  try {
    find_recipe(r, "c", "r.json");
    ADD_FAILURE();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("available: a, b"), std::string::npos) << e.what();
  }
}

TEST(Recipes, Placeholders) {
  ServerLaunch s;
  s.command = {"{deltaserve}", "serve", "--host", "{host}", "--port", "{port}", "x{port}y"};
  const auto argv = expand_command(s, 4321);
  EXPECT_EQ(argv[0].front(), '/');  // the absolute path of this (test) binary
  EXPECT_EQ(argv[3], "127.0.0.1");
  EXPECT_EQ(argv[5], "4321");
  EXPECT_EQ(argv[6], "x4321y");
  ::setenv("DS_TEST_MODEL_PATH", "/models/kimi", 1);
  EXPECT_EQ(expand_placeholders("--model={env:DS_TEST_MODEL_PATH}", "h", 1), "--model=/models/kimi");
  ::unsetenv("DS_TEST_UNSET_VAR");
  EXPECT_THROW(expand_placeholders("{env:DS_TEST_UNSET_VAR}", "h", 1), ds::Error);
  EXPECT_THROW(expand_placeholders("{gpu}", "h", 1), ds::Error);
  EXPECT_THROW(expand_placeholders("{port", "h", 1), ds::Error);
}

}  // namespace
}  // namespace ds::tools
