// fork + exec (see subprocess.h).
#include "core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace ds {

pid_t spawn_process(const SpawnSpec& spec) {
  CHECK(!spec.argv.empty(), "{}: empty command", spec.who);
  // Everything the child needs is built before fork: after fork only async-signal-safe calls are made.
  std::vector<std::string> argv_s = spec.argv, env_s = spec.env;
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(log_fd >= 0, "{}: cannot open {}: {}", spec.who, spec.log_path, std::strerror(errno));
  }
  int pipefd[2];  // exec's errno comes back through it; closed on a successful exec (O_CLOEXEC)
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    const int e = errno;
    if (log_fd >= 0) ::close(log_fd);
    DS_THROW("{}: pipe: {}", spec.who, std::strerror(e));
  }
  sigset_t reset, saved;
  sigemptyset(&reset);
  for (int s : spec.default_signals) sigaddset(&reset, s);
  ::sigprocmask(SIG_BLOCK, &reset, &saved);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (spec.parent_death_signal != 0) ::prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
    if (::getppid() != parent) ::_exit(127);  // the parent already died before the death signal was armed
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : spec.default_signals) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] const auto n = ::write(pipefd[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &saved, nullptr);
  ::close(pipefd[1]);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(pipefd[0]);
    DS_THROW("{}: fork failed: {}", spec.who, std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);
  int err = 0;
  ssize_t got;
  do {
    got = ::read(pipefd[0], &err, sizeof err);
  } while (got < 0 && errno == EINTR);
  ::close(pipefd[0]);
  if (got == static_cast<ssize_t>(sizeof err)) {
    int raw = 0;
    ::waitpid(pid, &raw, 0);
    DS_THROW("{}: cannot start '{}': {}", spec.who, spec.argv[0], std::strerror(err));
  }
  return pid;
}

std::vector<std::string> child_environment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos && overrides.count(kv.substr(0, eq))) continue;
    env.push_back(kv);
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

int decode_wait_status(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}

}  // namespace ds
