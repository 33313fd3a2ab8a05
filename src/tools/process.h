// Child processes for sweeps and qualification runs: fork/exec with extra environment, its own process
// group (a server may spawn one process per GPU), SIGTERM then SIGKILL after a grace period, and a
// health wait that notices a child dying instead of waiting out the timeout.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ds::tools {

struct ChildSpec {
  std::vector<std::string> argv;            // argv[0] without '/' is looked up in PATH
  std::map<std::string, std::string> env;   // set on top of this process's environment
  std::string log_path;                     // stdout and stderr go here ("" = inherit ours)
};

class ChildProcess {
 public:
  ChildProcess() = default;
  // Starts the child; throws ds::Error if the program cannot be executed (the exec error is reported back
  // through a close-on-exec pipe, so "no such file" is an error here, not a silent exit 127).
  explicit ChildProcess(const ChildSpec& spec);
  ~ChildProcess();  // stop(): a ChildProcess never outlives its owner's scope
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  // Non-blocking: reaps the child if it has exited.
  bool running();
  // Blocks until it exits (or timeout_s passes; then nullopt). Returns the decoded status.
  std::optional<int> wait(double timeout_s = -1);
  // SIGTERM to the whole process group, wait up to grace_s, then SIGKILL. Returns the decoded status.
  int stop(double grace_s = 10);
  // Exit code, or 128 + signal number for a child killed by a signal; nullopt while running.
  std::optional<int> status() const { return status_; }
  std::string describe_status() const;
  const std::string& log_path() const { return log_path_; }
  std::string log_tail(size_t lines = 20) const;

 private:
  void reap(int raw_status);
  pid_t pid_ = -1;
  std::optional<int> status_;
  bool killed_by_us_ = false;
  std::string log_path_;
  std::string name_;
};

// Polls GET base_url/health until it answers 200. Throws ds::Error naming `what` if the child exits first
// (with its status and the tail of its log) or after timeout_s.
void wait_until_healthy(ChildProcess& child, const std::string& base_url, double timeout_s, const std::string& what);

// A port free on 127.0.0.1 right now (bound to 0 and released; another process could take it meanwhile).
int pick_free_port();
// Absolute path of the running executable.
std::string self_exe();

}  // namespace ds::tools
