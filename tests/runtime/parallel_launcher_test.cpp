// The multi-process launcher with dummy rank commands (/bin/sh scripts that exit 0, exit 1, hang, ignore
// SIGTERM or die of a signal): every rank gets its environment, one rank's failure ends the others with that
// rank named, signals to the launcher reach the ranks. Plus the rank-side environment, the rank list for several
// hosts and the rendezvous file.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/launcher.h"
#include "tests/test_util.h"

namespace ds::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

LaunchSpec sh(const std::string& script, int n) {
  LaunchSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.nprocs = n;
  s.grace_s = 1.0;
  return s;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Every rank writes its pid into <dir>/pid_<rank> first, so the test can check nobody outlived the launch.
std::string record_pid(const test::TempDir& dir) { return "echo $$ > " + dir.file("pid_") + "$DELTASERVE_RANK; "; }
void expect_all_gone(const test::TempDir& dir, int n) {
  for (int r = 0; r < n; ++r) {
    const std::string p = slurp(dir.file("pid_" + std::to_string(r)));
    if (p.empty()) continue;
    EXPECT_FALSE(alive(std::stoi(p))) << "rank " << r << " (pid " << p << ") still runs";
  }
}

TEST(ParallelLauncher, EveryRankGetsItsEnvironment) {
  test::TempDir dir;
  auto spec = sh("echo \"$DELTASERVE_RANK $DELTASERVE_WORLD_SIZE $DELTASERVE_LOCAL_RANK $DELTASERVE_LOCAL_WORLD_SIZE "
                 "$DELTASERVE_DEVICE $NCCL_NVLS_ENABLE $EXTRA\" > " + dir.file("env_") + "$DELTASERVE_RANK; "
                 "test -n \"$DELTASERVE_RENDEZVOUS\"",
                 4);
  spec.world = 8;
  spec.first_rank = 4;  // the second host of "a:4,b:4"
  spec.devices = {3, 2, 1, 0};
  spec.env = {{"EXTRA", "x"}};
  const auto res = launch_ranks(spec);
  EXPECT_EQ(res.exit_code, 0) << res.message;
  ASSERT_EQ(res.statuses.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(res.statuses[i], 0);
    const int g = 4 + i;
    EXPECT_EQ(slurp(dir.file("env_" + std::to_string(g))), fmt::format("{} 8 {} 4 {} 0 x\n", g, i, 3 - i)) << g;
  }
}

TEST(ParallelLauncher, FailingRankStopsTheOthers) {
  test::TempDir dir;
  const auto t0 = Clock::now();
  const auto res = launch_ranks(sh(record_pid(dir) + "if [ \"$DELTASERVE_RANK\" = 2 ]; then sleep 0.3; exit 3; fi; sleep 60", 4));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(res.exit_code, 3);
  EXPECT_NE(res.message.find("rank 2"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("exited with status 3"), std::string::npos) << res.message;
  EXPECT_LT(s, 20.0) << "the other ranks were not stopped";
  EXPECT_EQ(res.statuses[2], 3);
  for (int r : {0, 1, 3}) EXPECT_EQ(res.statuses[r], 128 + SIGTERM) << r;
  expect_all_gone(dir, 4);
}

TEST(ParallelLauncher, RankIgnoringSigtermIsKilled) {
  test::TempDir dir;
  // Rank 0 fails only once rank 1 ignores SIGTERM (else SIGTERM could still end it normally).
  const std::string ready = dir.file("ready");
  const auto res = launch_ranks(sh(record_pid(dir) + "if [ \"$DELTASERVE_RANK\" = 0 ]; then while [ ! -f " + ready +
                                   " ]; do sleep 0.01; done; exit 1; fi; trap '' TERM; touch " + ready +
                                   "; i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done", 2));  // bounded: 60 s
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.message.find("did not stop within"), std::string::npos) << res.message;
  EXPECT_EQ(res.statuses[1], 128 + SIGKILL);
  expect_all_gone(dir, 2);
}

TEST(ParallelLauncher, RankKilledBySignalIsReported) {
  const auto res = launch_ranks(sh("if [ \"$DELTASERVE_RANK\" = 1 ]; then kill -9 $$; fi; sleep 60", 3));
  EXPECT_EQ(res.exit_code, 128 + SIGKILL);
  EXPECT_NE(res.message.find("rank 1"), std::string::npos) << res.message;
  EXPECT_NE(res.message.find("signal 9"), std::string::npos) << res.message;
}

TEST(ParallelLauncher, SignalToTheLauncherReachesEveryRank) {
  test::TempDir dir;
  std::thread sender([&] {
    // Once both ranks are up, SIGTERM the launcher (this process); its handler forwards it.
    for (int i = 0; i < 500; ++i) {
      if (std::filesystem::exists(dir.file("pid_0")) && std::filesystem::exists(dir.file("pid_1"))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(::getpid(), SIGTERM);
  });
  const auto res = launch_ranks(sh(record_pid(dir) + "sleep 60", 2));
  sender.join();
  EXPECT_EQ(res.exit_code, 128 + SIGTERM);
  EXPECT_NE(res.message.find("received signal"), std::string::npos) << res.message;
  expect_all_gone(dir, 2);
}

TEST(ParallelLauncher, MissingProgramIsAnError) {
  LaunchSpec s;
  s.argv = {"/nonexistent/deltaserve-rank"};
  s.nprocs = 2;
  try {
    launch_ranks(s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start"), std::string::npos) << e.what();
  }
}

TEST(ParallelLauncher, PerRankLogs) {
  test::TempDir dir;
  auto spec = sh("echo hello from $DELTASERVE_RANK", 2);
  std::filesystem::create_directories(dir.file("logs"));
  spec.log_dir = dir.file("logs");
  EXPECT_EQ(launch_ranks(spec).exit_code, 0);
  EXPECT_EQ(slurp(dir.file("logs/rank_1.log")), "hello from 1\n");
}

TEST(ParallelLauncher, RankEnvironment) {
  ::unsetenv(kEnvRank);
  EXPECT_FALSE(rank_env_from_environment().has_value());
  ::setenv(kEnvRank, "3", 1);
  ::setenv(kEnvWorld, "8", 1);
  ::setenv(kEnvLocalRank, "1", 1);
  ::setenv(kEnvLocalWorld, "4", 1);
  ::setenv(kEnvDevice, "1", 1);
  ::setenv(kEnvRendezvous, "/tmp/x", 1);
  auto e = rank_env_from_environment();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->device, 1);
  EXPECT_EQ(e->rendezvous, "/tmp/x");
  ::setenv(kEnvRank, "8", 1);
  EXPECT_THROW(rank_env_from_environment(), Error);
  ::setenv(kEnvRank, "two", 1);
  EXPECT_THROW(rank_env_from_environment(), Error);
  for (const char* k : {kEnvRank, kEnvWorld, kEnvLocalRank, kEnvLocalWorld, kEnvDevice, kEnvRendezvous}) ::unsetenv(k);
}

TEST(ParallelLauncher, RankListForSeveralHosts) {
  auto s = parse_rank_list("gpu-a:8,gpu-b:8", 1);
  EXPECT_EQ(s.host, "gpu-b");
  EXPECT_EQ(s.world, 16);
  EXPECT_EQ(s.first_rank, 8);
  EXPECT_EQ(s.nprocs, 8);
  s = parse_rank_list("10.0.0.1:4", 0);
  EXPECT_EQ(s.world, 4);
  EXPECT_EQ(s.first_rank, 0);
  EXPECT_THROW(parse_rank_list("a:8,b:8", 2), Error);
  EXPECT_THROW(parse_rank_list("a:8,b", 0), Error);
  EXPECT_THROW(parse_rank_list("a:0", 0), Error);
}

TEST(ParallelLauncher, RendezvousFile) {
  test::TempDir dir;
  const std::string path = dir.file("id");
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    publish_rendezvous(path, "abc123");
  });
  EXPECT_EQ(wait_rendezvous(path, 10), "abc123");
  writer.join();
  EXPECT_THROW(wait_rendezvous(dir.file("never"), 0.1), Error);
}

TEST(ParallelComm, HexRoundTripAndNcclAvailability) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(from_hex(to_hex(bytes)), bytes);
  EXPECT_EQ(to_hex("\x01\xab"), "01ab");
  EXPECT_THROW(from_hex("0g"), Error);
  EXPECT_THROW(from_hex("abc"), Error);
  std::printf("[nccl] available in this build: %s\n", nccl_available() ? "yes" : "no");
  if (!nccl_available()) {
    EXPECT_THROW(Communicator("00", 0, 1, 0), Error);
  }
}

}  // namespace
}  // namespace ds::parallel
