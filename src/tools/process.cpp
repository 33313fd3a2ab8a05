// fork/exec child management (see process.h).
#include "tools/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <string_view>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/http_client.h"

extern char** environ;

namespace ds::tools {

namespace {
using Clock = std::chrono::steady_clock;

// Process groups of live children, so SIGINT/SIGTERM to us (Ctrl-C during a sweep) is forwarded to them
// instead of leaving servers running. Fixed slots: the handler may only touch lock-free data.
std::array<std::atomic<pid_t>, 128> g_children{};

void forward_and_die(int sig) {
  for (auto& slot : g_children) {
    const pid_t p = slot.load();
    if (p > 0) ::kill(-p, SIGTERM);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_forwarding_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = forward_and_die;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

void track(pid_t p) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, p)) return;
  }
}
void untrack(pid_t p) {
  for (auto& slot : g_children) {
    pid_t expected = p;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

std::string resolve_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  const std::string_view dirs = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    const auto colon = dirs.find(':', pos);
    std::string_view dir = dirs.substr(pos, colon == std::string_view::npos ? std::string_view::npos : colon - pos);
    if (dir.empty()) dir = ".";  // an empty PATH entry means the working directory
    const std::string cand = fmt::format("{}/{}", dir, prog);
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    if (colon == std::string_view::npos) break;
    pos = colon + 1;
  }
  DS_THROW("cannot start '{}': not found in PATH", prog);
}

int decode_status(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}
}  // namespace

ChildProcess::ChildProcess(const ChildSpec& spec) {
  CHECK(!spec.argv.empty(), "empty command");
  install_forwarding_once();
  name_ = spec.argv[0];
  log_path_ = spec.log_path;
  // Everything the child needs is built before fork: after fork only async-signal-safe calls are allowed.
  const std::string program = resolve_program(spec.argv[0]);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos && spec.env.count(kv.substr(0, eq))) continue;
    env_strings.push_back(kv);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(log_fd >= 0, "cannot open log {}: {}", spec.log_path, std::strerror(errno));
  }
  int pipefd[2];
  CHECK(::pipe2(pipefd, O_CLOEXEC) == 0, "pipe: {}", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // If we die without stopping it (SIGKILL), the child gets SIGTERM. Tied to the forking thread: owners
    // stop their children before their thread ends.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    ::execve(program.c_str(), argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] auto n = ::write(pipefd[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(pipefd[1]);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(pipefd[0]);
    DS_THROW("fork failed: {}", std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also from the parent: no window where a signal to the group misses it
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(pipefd[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(pipefd[0]);
  pid_ = pid;
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int raw = 0;
    ::waitpid(pid, &raw, 0);
    pid_ = -1;
    DS_THROW("cannot execute {}: {}", program, std::strerror(child_errno));
  }
  track(pid_);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !status_) stop(5);
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !status_) stop(5);
    pid_ = o.pid_;
    status_ = o.status_;
    killed_by_us_ = o.killed_by_us_;
    log_path_ = std::move(o.log_path_);
    name_ = std::move(o.name_);
    o.pid_ = -1;
    o.status_.reset();
  }
  return *this;
}

void ChildProcess::reap(int raw) {
  status_ = decode_status(raw);
  untrack(pid_);
  // Helpers the server spawned in its group go with it.
  ::kill(-pid_, SIGKILL);
}

bool ChildProcess::running() {
  if (pid_ <= 0 || status_) return false;
  int raw = 0;
  const pid_t r = ::waitpid(pid_, &raw, WNOHANG);
  if (r == pid_) {
    reap(raw);
    return false;
  }
  return true;
}

std::optional<int> ChildProcess::wait(double timeout_s) {
  if (pid_ <= 0) return status_;
  const auto t0 = Clock::now();
  while (running()) {
    if (timeout_s >= 0 && std::chrono::duration<double>(Clock::now() - t0).count() >= timeout_s) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status_;
}

int ChildProcess::stop(double grace_s) {
  if (pid_ <= 0) return -1;
  if (!running()) return *status_;
  killed_by_us_ = true;
  ::kill(-pid_, SIGTERM);
  if (!wait(grace_s)) {
    ::kill(-pid_, SIGKILL);
    wait();
  }
  return status_.value_or(-1);
}

std::string ChildProcess::describe_status() const {
  if (!status_) return "running";
  const int s = *status_;
  if (s > 128 && s < 128 + 65) return fmt::format("killed by signal {} ({})", s - 128, strsignal(s - 128));
  return fmt::format("exit status {}", s);
}

std::string ChildProcess::log_tail(size_t lines) const {
  if (log_path_.empty()) return "";
  std::ifstream f(log_path_);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(f, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string s;
  for (const auto& l : tail) s += "  | " + l + "\n";
  return s;
}

void wait_until_healthy(ChildProcess& child, const std::string& base_url, double timeout_s, const std::string& what) {
  const auto t0 = Clock::now();
  for (;;) {
    if (!child.running()) {
      DS_THROW("{} exited ({}) before becoming healthy at {}/health{}{}", what, child.describe_status(), base_url,
               child.log_path().empty() ? "" : "; last lines of " + child.log_path() + ":\n", child.log_tail());
    }
    if (health_ok(base_url, 1.0)) return;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      DS_THROW("{} did not become healthy at {}/health within {:.0f} s{}{}", what, base_url, timeout_s,
               child.log_path().empty() ? "" : "; last lines of " + child.log_path() + ":\n", child.log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0, "socket: {}", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  CHECK(ok, "cannot find a free port: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  CHECK(n > 0, "readlink /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace ds::tools
