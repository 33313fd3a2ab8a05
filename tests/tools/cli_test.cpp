// The subcommands as a user runs them: flags, files written and exit codes (the binary runs as a child).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tools/fake_server.h"
#include "tools/process.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

int run(std::vector<std::string> args, const std::filesystem::path& log) {
  args.insert(args.begin(), ds::test::deltaserve_bin());
  ChildProcess c(ChildSpec{args, {}, log.string()});
  return c.wait(60).value_or(-1);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Cli, BenchWritesTableJsonAndPlot) {
  REQUIRE_DELTASERVE_BIN();
  FakeServerOptions o;
  o.ttft_ms = 10;
  o.itl_ms = 5;
  FakeServer srv(o);
  srv.start();
  const auto dir = ds::test::scratch_dir("cli-bench");
  const int rc = run({"bench", "--base-url", srv.base_url(), "--concurrency", "1,2", "--input-len", "8", "--output-len",
                      "5:6", "--requests-per-user", "1", "--ignore-eos", "--out-json", (dir / "b.json").string(),
                      "--out-plot", (dir / "b.svg").string()},
                     dir / "out.log");
  const std::string out = slurp(dir / "out.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("**tps/user**"), std::string::npos) << out;
  EXPECT_NE(out.find("Metric definitions"), std::string::npos);
  const auto j = nlohmann::json::parse(slurp(dir / "b.json"));
  EXPECT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(slurp(dir / "b.svg").rfind("<svg", 0), 0u);
  // A stored run compared with a new one is labelled cross-run.
  const int rc2 = run({"bench", "--base-url", srv.base_url(), "--concurrency", "1,2", "--input-len", "8", "--output-len", "6",
                       "--requests-per-user", "1", "--compare-stored", (dir / "b.json").string()},
                      dir / "out2.log");
  EXPECT_EQ(rc2, 0);
  EXPECT_NE(slurp(dir / "out2.log").find("CROSS-RUN"), std::string::npos);
  // Bad flags fail before any request.
  EXPECT_NE(run({"bench", "--base-url", srv.base_url(), "--ab", srv.base_url(), srv.base_url()}, dir / "both.log"), 0);
  EXPECT_NE(slurp(dir / "both.log").find("excludes"), std::string::npos) << slurp(dir / "both.log");
  EXPECT_NE(run({"bench", "--base-url", srv.base_url(), "--concurrency", "1,x"}, dir / "bad.log"), 0);
  EXPECT_NE(slurp(dir / "bad.log").find("not a positive integer"), std::string::npos);
}

TEST(Cli, BenchAgainstNothingFails) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("cli-none");
  const int port = pick_free_port();
  EXPECT_NE(run({"bench", "--base-url", "http://127.0.0.1:" + std::to_string(port)}, dir / "o.log"), 0);
  EXPECT_NE(slurp(dir / "o.log").find("warm-up"), std::string::npos);
}

TEST(Cli, EvalExitCodeFollowsTheBand) {
  REQUIRE_DELTASERVE_BIN();
  const std::string sample = (ds::test::source_root() / "tests/tools/data/gsm8k_sample.jsonl").string();
  FakeServerOptions o;
  o.ttft_ms = 1;
  o.itl_ms = 0;
  o.answer = make_gsm8k_oracle(sample, 4);
  FakeServer srv(o);
  srv.start();
  const auto dir = ds::test::scratch_dir("cli-eval");
  const std::vector<std::string> base = {"eval", "gsm8k", "--dataset-path", sample, "--fewshot-path", sample,
                                         "--num-fewshot", "2", "--base-url", srv.base_url()};
  auto with = [&](std::vector<std::string> extra) {
    auto v = base;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  EXPECT_EQ(run(with({"--band", "96.5:0.5"}), dir / "fail.log"), 1);
  EXPECT_NE(slurp(dir / "fail.log").find("**FAIL**"), std::string::npos);
  EXPECT_EQ(run(with({"--band", "75:0.5", "--out", (dir / "r.jsonl").string()}), dir / "pass.log"), 0) << slurp(dir / "pass.log");
  const std::string records = slurp(dir / "r.jsonl");
  EXPECT_EQ(std::count(records.begin(), records.end(), '\n'), 16);
  EXPECT_EQ(run(with({"--band", "75:0.5", "--band-metric", "strict-match", "--endpoint", "chat"}), dir / "chat.log"), 0);
  EXPECT_NE(run({"eval", "gsm8k", "--base-url", srv.base_url()}, dir / "noset.log"), 0);  // --dataset-path is required
}

TEST(Cli, ValidateExitCodeAndSweepList) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("cli-validate");
  const auto pass = dir / "pass.json", fail = dir / "fail.json";
  std::ofstream(pass) << R"({"stages": [{"id": 1, "mode": "tests", "command": ["true"]}]})";
  std::ofstream(fail) << R"({"stages": [{"id": 1, "mode": "tests", "command": ["false"]}]})";
  EXPECT_EQ(run({"validate", "--matrix", pass.string(), "--out", (dir / "p").string()}, dir / "p.log"), 0);
  EXPECT_TRUE(std::filesystem::exists(dir / "p.md"));
  EXPECT_TRUE(std::filesystem::exists(dir / "p.json"));
  EXPECT_EQ(run({"validate", "--matrix", fail.string(), "--out", (dir / "f").string()}, dir / "f.log"), 1);
  EXPECT_EQ(run({"validate", "--check", "--matrix", (ds::test::source_root() / "recipes/validate_embedded.json").string()},
                dir / "c.log"), 0) << slurp(dir / "c.log");
  const auto recipes = (ds::test::source_root() / "recipes/recipes.json").string();
  EXPECT_EQ(run({"sweep", "--list", "--recipes", recipes}, dir / "l.log"), 0);
  EXPECT_NE(slurp(dir / "l.log").find("dep16-hi"), std::string::npos);
  EXPECT_NE(run({"sweep", "--recipe", "nope", "--recipes", recipes}, dir / "n.log"), 0);
  EXPECT_NE(slurp(dir / "n.log").find("available:"), std::string::npos);
}

}  // namespace
}  // namespace ds::tools
