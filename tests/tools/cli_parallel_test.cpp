// `--tp/--ep/--mode` as a user meets them on a machine without GPUs (the binary runs as a child): every refusal
// is fast and says why (no GPUs visible, --device cpu, bad sizes, placement flags without parallelism, a rank
// launched into another world). The launch -> rank -> NCCL path itself needs GPUs (docs/parallel.md).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/device.h"
#include "tools/process.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

struct CliRun {
  int rc = -1;
  std::string out;
  double seconds = 0;
};

CliRun run(std::vector<std::string> args, const std::string& name, std::map<std::string, std::string> env = {}) {
  const auto dir = ds::test::scratch_dir("cli-parallel");
  const auto log = dir / (name + ".log");
  args.insert(args.begin(), ds::test::deltaserve_bin());
  const auto t0 = std::chrono::steady_clock::now();
  ChildProcess c(ChildSpec{args, env, log.string()});
  CliRun r;
  r.rc = c.wait(60).value_or(-1);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream f(log);
  r.out.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

#define EXPECT_REFUSED(r, text)                                              \
  do {                                                                       \
    EXPECT_EQ((r).rc, 1) << (r).out;                                         \
    EXPECT_NE((r).out.find(text), std::string::npos) << (r).out;             \
    EXPECT_LT((r).seconds, 30.0) << "a refusal must come before any work";   \
  } while (0)

TEST(Cli, ParallelWithoutGpusFailsFast) {
  REQUIRE_DELTASERVE_BIN();
  if (ds::cuda_device_count() >= 2) GTEST_SKIP() << "this machine has GPUs: the launch would start";
  const CliRun s = run({"serve", "--port", "0", "--tp", "2"}, "serve_tp2");
  EXPECT_REFUSED(s, "serve: --tp 2 --ep 1 --mode tep runs 2 rank(s) on this host, one per GPU");
  EXPECT_NE(s.out.find("visible"), std::string::npos) << s.out;
  const CliRun g = run({"generate", "--prompt", "hi", "--ep", "3", "--mode", "dep"}, "generate_dep3");
  EXPECT_REFUSED(g, "generate: --tp 1 --ep 3 --mode dep runs 3 rank(s)");
  const CliRun b = run({"bench-engine", "--tp", "4", "--ep", "4", "--concurrency", "1"}, "bench_tp4");
  EXPECT_REFUSED(b, "bench-engine: --tp 4 --ep 4 --mode tep runs 4 rank(s)");
}

TEST(Cli, ParallelRefusesTheCpuEngine) {
  REQUIRE_DELTASERVE_BIN();
  const CliRun g = run({"generate", "--prompt", "hi", "--device", "cpu", "--tp", "2"}, "generate_cpu");
  EXPECT_REFUSED(g, "generate: --device cpu runs the CPU reference engine, which has no tensor or expert parallelism");
  const CliRun s = run({"serve", "--port", "0", "--device", "cpu", "--ep", "2", "--mode", "dep"}, "serve_cpu");
  EXPECT_REFUSED(s, "serve: --device cpu");
  const CliRun b = run({"bench-engine", "--device", "cpu", "--tp", "2", "--concurrency", "1"}, "bench_cpu");
  EXPECT_REFUSED(b, "bench-engine: --device cpu");
}

TEST(Cli, ParallelFlagErrorsNameTheFlag) {
  REQUIRE_DELTASERVE_BIN();
  // (flags and values, not wording: parse_parallel_spec may come from either branch at the merge)
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "0"}, "tp0"), "generate: --tp 0");
  const CliRun ep2 = run({"generate", "--prompt", "hi", "--tp", "4", "--ep", "2"}, "ep2");
  EXPECT_REFUSED(ep2, "--ep 2");
  EXPECT_NE(ep2.out.find("--tp 4"), std::string::npos) << ep2.out;
  const CliRun deptp = run({"serve", "--port", "0", "--tp", "2", "--ep", "2", "--mode", "dep"}, "deptp");
  EXPECT_REFUSED(deptp, "--tp 2");
  EXPECT_NE(deptp.out.find("dep"), std::string::npos) << deptp.out;
  EXPECT_REFUSED(run({"serve", "--port", "0", "--tp", "2", "--mode", "pp"}, "mode"), "serve: --mode 'pp'");
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--devices", "0,1"}, "devices1"),
                 "need --tp or --ep above 1");
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "2", "--node-index", "1"}, "nodeidx"),
                 "--node-index needs --nodes");
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "4", "--nodes", "a:2,b:2", "--node-index", "0"}, "rdv"),
                 "needs --rendezvous");
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "4", "--nodes", "a:2", "--node-index", "0"}, "count"),
                 "--nodes 'a:2' lists 2 ranks, but --tp 4 --ep 1 --mode tep asks for 4");
}

TEST(Cli, ParallelRankChecksItsEnvironment) {
  REQUIRE_DELTASERVE_BIN();
  // A rank process (as the launcher starts it) whose world disagrees with its flags.
  const std::map<std::string, std::string> env = {{"DELTASERVE_RANK", "1"},       {"DELTASERVE_WORLD_SIZE", "4"},
                                                  {"DELTASERVE_LOCAL_RANK", "1"}, {"DELTASERVE_LOCAL_WORLD_SIZE", "4"},
                                                  {"DELTASERVE_DEVICE", "1"},     {"DELTASERVE_RENDEZVOUS", "/tmp/x"}};
  EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "2"}, "rank_world", env),
                 "generate (rank 1): launched into a world of 4 ranks, but --tp 2 --ep 1 --mode tep asks for 2");
  if (ds::cuda_device_count() < 2) {
    // Its world agrees, but its GPU is not there.
    auto env2 = env;
    env2["DELTASERVE_WORLD_SIZE"] = "2";
    env2["DELTASERVE_LOCAL_WORLD_SIZE"] = "2";
    EXPECT_REFUSED(run({"generate", "--prompt", "hi", "--tp", "2"}, "rank_gpu", env2),
                   "generate (rank 1): CUDA device 1 does not exist");
  }
}

TEST(Cli, ParallelHelpListsTheFlags) {
  REQUIRE_DELTASERVE_BIN();
  for (const char* cmd : {"serve", "generate", "bench-engine"}) {
    const CliRun h = run({cmd, "--help"}, std::string("help_") + cmd);
    EXPECT_EQ(h.rc, 0) << h.out;
    for (const char* flag : {"--tp", "--ep", "--mode", "--devices", "--nodes", "--node-index", "--rendezvous"})
      EXPECT_NE(h.out.find(flag), std::string::npos) << cmd << " --help lacks " << flag;
  }
}

// The token budget per step has one name in serve and bench-engine (--max-batch-tokens); serve's old name
// --max-prefill-tokens still reaches the same option, with the same range check.
TEST(Cli, TokenBudgetFlagHasOneName) {
  REQUIRE_DELTASERVE_BIN();
  for (const char* cmd : {"serve", "bench-engine"}) {
    const CliRun h = run({cmd, "--help"}, std::string("budget_help_") + cmd);
    EXPECT_EQ(h.rc, 0) << h.out;
    EXPECT_NE(h.out.find("--max-batch-tokens"), std::string::npos) << cmd << " --help lacks --max-batch-tokens";
  }
  for (const char* flag : {"--max-batch-tokens", "--max-prefill-tokens"}) {
    const CliRun r = run({"serve", flag, "0"}, std::string("budget_zero") + flag);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("--max-batch-tokens: Value 0 not in range 1 to 1048576"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace ds::tools
