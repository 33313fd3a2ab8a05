// Child servers: start, health, stop (SIGTERM, then SIGKILL), a child that dies before it is healthy, and a
// whole recipe run (A/B of two `deltaserve fake-server` children) that must leave no process behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tools/http_client.h"
#include "tools/process.h"
#include "tools/sweep.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

// Exists and is not a zombie (an orphan's zombie may linger if the container's init does not reap).
bool alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ServerLaunch fake_launch(std::vector<std::string> extra = {}) {
  ServerLaunch s;
  s.command = {ds::test::deltaserve_bin(), "fake-server", "--host", "{host}", "--port", "{port}"};
  s.command.insert(s.command.end(), extra.begin(), extra.end());
  s.health_timeout_s = 20;
  s.stop_grace_s = 5;
  return s;
}

TEST(SweepProcess, StartsHealthyAndStopsCleanly) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("start-stop");
  ServerLaunch l = fake_launch({"--health-delay-ms", "300"});
  l.env["DS_TEST_KNOB"] = "1";
  pid_t pid = -1;
  {
    ManagedServer s(l, "fake", (dir / "fake.log").string());
    pid = s.child().pid();
    EXPECT_TRUE(alive(pid));
    EXPECT_TRUE(health_ok(s.base_url()));
    EXPECT_NE(s.describe().find("DS_TEST_KNOB=1"), std::string::npos);
    EXPECT_EQ(s.stop(), 0);  // SIGTERM: the fake server drains and exits 0
    EXPECT_FALSE(alive(pid));
  }
  std::ifstream log(dir / "fake.log");
  std::string first;
  std::getline(log, first);
  EXPECT_NE(first.find("listening"), std::string::npos) << "child output goes to its log";
}

TEST(SweepProcess, ChildThatDiesBeforeHealthIsReportedAtOnce) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("dies");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ManagedServer s(fake_launch({"--health-delay-ms", "60000", "--exit-after-ms", "200", "--exit-code", "3"}), "dying",
                    (dir / "dying.log").string());
    ADD_FAILURE() << "a dead server was reported healthy";
  } catch (const ds::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("exited (exit status 3) before becoming healthy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--exit-after-ms"), std::string::npos) << "the log tail is in the error: " << msg;
  }
  EXPECT_LT(seconds_since(t0), 10.0) << "must not wait for the 20 s health timeout";
}

TEST(SweepProcess, UnhealthyChildTimesOutAndIsKilledEvenIfItIgnoresSigterm) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("stuck");
  ServerLaunch l = fake_launch({"--health-delay-ms", "60000", "--ignore-sigterm"});
  l.health_timeout_s = 1.0;
  l.stop_grace_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ManagedServer s(l, "stuck", (dir / "stuck.log").string());
    ADD_FAILURE();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not become healthy"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 8.0);
  // The child ignored SIGTERM, so only SIGKILL after the grace period can have ended it.
  ChildProcess c(ChildSpec{{ds::test::deltaserve_bin(), "fake-server", "--ignore-sigterm"}, {}, (dir / "c.log").string()});
  // The child prints its address only after it ignores SIGTERM; a fixed sleep raced with its start-up (~0.35 s of
  // shared-library loading on the 2-core CI machine: SIGTERM then ended it, 143).
  const auto t1 = std::chrono::steady_clock::now();
  while (c.log_tail().find("listening") == std::string::npos && seconds_since(t1) < 20.0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(c.log_tail().find("listening"), std::string::npos) << c.log_tail();
  const pid_t pid = c.pid();
  EXPECT_EQ(c.stop(0.5), 128 + SIGKILL);
  EXPECT_FALSE(alive(pid));
  EXPECT_NE(c.describe_status().find("signal 9"), std::string::npos);
}

TEST(SweepProcess, ExecFailureIsAnErrorAndEnvReachesTheChild) {
  EXPECT_THROW(ChildProcess(ChildSpec{{"/nonexistent/server"}, {}, ""}), ds::Error);
  EXPECT_THROW(ChildProcess(ChildSpec{{"no-such-program-deltaserve-test"}, {}, ""}), ds::Error);
  const auto dir = ds::test::scratch_dir("env");
  ChildProcess c(ChildSpec{{"sh", "-c", "echo \"knob=$DS_KNOB\"; exit 7"}, {{"DS_KNOB", "42"}}, (dir / "env.log").string()});
  EXPECT_EQ(c.wait(10), 7);
  EXPECT_NE(c.log_tail().find("knob=42"), std::string::npos) << c.log_tail();
}

TEST(SweepProcess, StopAlsoEndsTheChildsOwnChildren) {
  // A server that spawns helpers (one process per GPU) is stopped as a group.
  const auto dir = ds::test::scratch_dir("group");
  const auto pidfile = (dir / "grandchild.pid").string();
  ChildProcess c(ChildSpec{{"sh", "-c", "sleep 60 & echo $! > " + pidfile + "; wait"}, {}, ""});
  pid_t grandchild = -1;
  for (int i = 0; i < 100 && grandchild <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream(pidfile) >> grandchild;
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(alive(grandchild));
  c.stop(2);
  for (int i = 0; i < 100 && alive(grandchild); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(alive(grandchild));
}

TEST(SweepProcess, RecipeAbRunEndToEnd) {
  REQUIRE_DELTASERVE_BIN();
  const auto dir = ds::test::scratch_dir("recipe");
  const std::string bin = ds::test::deltaserve_bin();
  const nlohmann::json doc = {
      {"recipes",
       {{"fake-ab",
         {{"description", "two scripted servers, the candidate twice as fast per token"},
          {"server", {{"command", {bin, "fake-server", "--host", "{host}", "--port", "{port}", "--ttft-ms", "20"}},
                      {"health_timeout_s", 20}, {"stop_grace_s", 5}}},
          {"ab", {{"base", {{"command", {bin, "fake-server", "--port", "{port}", "--ttft-ms", "20", "--itl-ms", "20"}}}},
                  {"cand", {{"command", {bin, "fake-server", "--port", "{port}", "--ttft-ms", "20", "--itl-ms", "10"}}}}}},
          {"bench", {{"concurrency", {1, 2}}, {"input_len", 8}, {"output_len", 6}, {"requests_per_user", 1},
                     {"repeats", 2}, {"noise_floor_pct", 5}, {"max_noise_pct", 30}}}}}}}};
  const auto recipes = parse_recipes(doc, "test");
  Progress progress(stderr, false);
  SweepOptions opt;
  opt.log_prefix = (dir / "run").string();
  const BenchReport rep = run_recipe(recipes.at("fake-ab"), opt, progress);
  ASSERT_TRUE(rep.ab.has_value());
  ASSERT_EQ(rep.ab->size(), 2u);
  for (const auto& v : *rep.ab) EXPECT_EQ(v.verdict, Verdict::kBetter) << v.verdict_text();
  EXPECT_EQ(rep.runs.size(), 8u);  // 2 points x 2 repeats x 2 sides
  const std::string md = render_markdown(rep);
  EXPECT_NE(md.find("Paired A/B"), std::string::npos);
  EXPECT_NE(md.find("fake-server"), std::string::npos);  // the launch commands are in the report
  const auto j = render_json(rep);
  EXPECT_EQ(j["recipe"]["name"], "fake-ab");
  EXPECT_EQ(j["ab"]["points"].size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir / "run.base.log"));
  EXPECT_TRUE(std::filesystem::exists(dir / "run.cand.log"));
  // Both servers are gone: their ports refuse connections.
  for (const auto& r : rep.runs) EXPECT_FALSE(health_ok(r.base_url, 0.5)) << r.base_url;
  // --no-ab runs the single server's sweep instead.
  opt.run_ab = false;
  const BenchReport single = run_recipe(recipes.at("fake-ab"), opt, progress);
  EXPECT_FALSE(single.ab.has_value());
  EXPECT_EQ(single.runs.size(), 2u);
}

}  // namespace
}  // namespace ds::tools
