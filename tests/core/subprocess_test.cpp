// spawn_process: exit codes and signals as one number, exec failures as errors, the environment overrides,
// the log redirection and the child's own process group.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/subprocess.h"

namespace ds {
namespace {

int wait_for(pid_t pid) {
  int raw = 0;
  EXPECT_EQ(::waitpid(pid, &raw, 0), pid);
  return decode_wait_status(raw);
}

TEST(Subprocess, ExitCodeSignalAndOwnProcessGroup) {
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "exit 3"};
  s.env = child_environment({});
  const pid_t a = spawn_process(s);
  EXPECT_EQ(::getpgid(a), a);  // its own group (set on both sides of fork)
  EXPECT_EQ(wait_for(a), 3);
  s.argv = {"sh", "-c", "kill -TERM $$"};  // a name: looked up in PATH
  s.default_signals = {SIGTERM};
  EXPECT_EQ(wait_for(spawn_process(s)), 128 + SIGTERM);
}

TEST(Subprocess, ExecFailureIsAnErrorNamingTheProgram) {
  SpawnSpec s;
  s.argv = {"/nonexistent/deltaserve-test-binary"};
  s.who = "unit";
  try {
    spawn_process(s);
    FAIL() << "started";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unit: cannot start '/nonexistent/deltaserve-test-binary'"), std::string::npos) << m;
  }
  s.argv.clear();
  EXPECT_THROW(spawn_process(s), Error);
}

TEST(Subprocess, EnvironmentOverridesAndLog) {
  ::setenv("DS_SUBPROCESS_TEST_A", "parent", 1);
  const auto env = child_environment({{"DS_SUBPROCESS_TEST_A", "child"}, {"DS_SUBPROCESS_TEST_B", "new"}});
  int a = 0;
  for (const auto& kv : env) a += kv.rfind("DS_SUBPROCESS_TEST_A=", 0) == 0;
  EXPECT_EQ(a, 1) << "an overridden name appears once";
  const std::string log = ::testing::TempDir() + "subprocess_test.log";
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "echo $DS_SUBPROCESS_TEST_A $DS_SUBPROCESS_TEST_B; echo err >&2"};
  s.env = env;
  s.log_path = log;
  EXPECT_EQ(wait_for(spawn_process(s)), 0);
  std::ifstream f(log);
  std::stringstream got;
  got << f.rdbuf();
  EXPECT_EQ(got.str(), "child new\nerr\n");
  std::remove(log.c_str());
  ::unsetenv("DS_SUBPROCESS_TEST_A");
}

}  // namespace
}  // namespace ds
