// fork/exec child management (see process.h).
#include "tools/process.h"

#include <netinet/in.h>
#include <signal.h>
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
#include "core/subprocess.h"
#include "tools/http_client.h"

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

}  // namespace

ChildProcess::ChildProcess(const ChildSpec& spec) {
  CHECK(!spec.argv.empty(), "empty command");
  install_forwarding_once();
  name_ = spec.argv[0];
  log_path_ = spec.log_path;
  SpawnSpec sp;
  sp.argv = spec.argv;
  sp.argv[0] = resolve_program(spec.argv[0]);  // a clear "not found in PATH" before any fork
  sp.env = child_environment(spec.env);
  sp.log_path = spec.log_path;
  // If we die without stopping it (SIGKILL), the child gets SIGTERM. Tied to the forking thread: owners stop
  // their children before their thread ends.
  sp.parent_death_signal = SIGTERM;
  sp.default_signals = {SIGINT, SIGTERM};
  sp.who = "process";
  pid_ = spawn_process(sp);
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
  status_ = decode_wait_status(raw);
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
