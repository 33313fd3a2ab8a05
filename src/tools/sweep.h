// `deltaserve sweep`: start a recipe's server(s) as children, wait for health, run the sweep or the paired
// A/B, stop them (always: RAII), and build one report.
#pragma once

#include <string>

#include "tools/process.h"
#include "tools/recipe.h"
#include "tools/report.h"

namespace ds::tools {

// A server child that is healthy from construction to stop()/destruction.
class ManagedServer {
 public:
  // Picks the port (launch.port or a free one), starts the command with the launch's env (plus
  // CUDA_VISIBLE_DEVICES when gpus is not empty), and waits for /health. Throws (after stopping the child)
  // when it exits first or stays unhealthy past launch.health_timeout_s.
  ManagedServer(const ServerLaunch& launch, const std::string& label, const std::string& log_path,
                const std::vector<int>& gpus = {});
  ~ManagedServer();
  ManagedServer(const ManagedServer&) = delete;
  ManagedServer& operator=(const ManagedServer&) = delete;

  const std::string& base_url() const { return base_url_; }
  // The command and knobs, for the report: "DELTASERVE_X=1 /path/deltaserve serve --port 1234".
  std::string describe() const;
  int stop();
  ChildProcess& child() { return child_; }

 private:
  ServerLaunch launch_;
  std::string label_;
  std::vector<std::string> argv_;
  std::map<std::string, std::string> env_;
  std::string base_url_;
  ChildProcess child_;
};

struct SweepOptions {
  bool run_ab = true;           // a recipe with an "ab" pair runs it unless false
  std::string log_prefix;       // server logs go to <log_prefix>.<label>.log ("" = a temporary path)
  int sweep_repeats = 1;        // measured passes per point of a single-server sweep
  std::vector<int> gpus;        // GPU ids to hand out (A/B: the base server's count first); empty = no
                                // CUDA_VISIBLE_DEVICES
};

// Runs a recipe end to end. Servers are stopped before this returns, also when it throws.
BenchReport run_recipe(const Recipe& recipe, const SweepOptions& opt, Progress& progress);

}  // namespace ds::tools
