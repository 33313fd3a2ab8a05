// Starting child processes (fork + exec), shared by the rank launcher and the tools' server/client children:
// one place for the steps that must happen in a fixed order around fork.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace ds {

struct SpawnSpec {
  std::vector<std::string> argv;      // argv[0] is the program: a path, or a name looked up in PATH
  std::vector<std::string> env;       // the child's whole environment, "NAME=value" (child_environment())
  std::string log_path;               // stdout and stderr go to this file (truncated); empty: inherited
  int parent_death_signal = 0;        // sent to the child if the forking thread ends first (PR_SET_PDEATHSIG)
  std::vector<int> default_signals;   // reset to SIG_DFL in the child; blocked in the parent across fork, so
                                      // the child never runs the parent's handlers for them
  const char* who = "spawn";          // prefix of error messages
};

// Starts the child in its own process group (set on both sides of fork: no window in which a signal to the
// group misses it). Returns its pid once exec succeeded; throws ds::Error naming the program and errno's text if
// the log cannot be opened, fork fails, or exec fails (the failed child is reaped).
pid_t spawn_process(const SpawnSpec& spec);

// This process's environment with `overrides` replacing (or adding) their names.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& overrides);

// A waitpid() status as one number: the exit code, or 128 + the signal that killed it (-1 otherwise).
int decode_wait_status(int raw);

}  // namespace ds
