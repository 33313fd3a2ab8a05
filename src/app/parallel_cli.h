// `--tp N --ep M --mode tep|dep` (and the rank placement flags) for serve, generate and bench-engine: the parent
// process launches one rank process per GPU running the same command line (runtime/parallel/launcher.h); each
// rank builds its group and its engine and runs its role: rank 0 the command on a DriverEngine, the others
// worker_loop (runtime/parallel/driver_engine.h, worker_loop.h). docs/parallel.md, "Process layer".
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/cuda_engine.h"
#include "runtime/cuda_model.h"
#include "runtime/parallel/group.h"
#include "runtime/parallel/launcher.h"

namespace ds::app {

struct ParallelArgs {
  int tp = 1;
  int ep = 1;
  std::string mode = "tep";
  std::vector<int> devices;  // GPU of local rank i; empty: i
  std::string nodes;         // "hostA:8,hostB:8" (several hosts)
  int node_index = 0;        // this host's position in nodes
  std::string rendezvous;    // file every host sees (several hosts); "" = a fresh temporary file
};

void add_parallel_options(CLI::App* cmd, ParallelArgs& a);

// What this process is in the run.
struct ParallelRole {
  parallel::ParallelSpec spec;                // world() == 1: no parallelism, nothing below is set
  std::optional<parallel::RankEnv> env;       // set in a rank process
  std::shared_ptr<parallel::Group> group;     // this rank's group
  bool parallel() const { return spec.world() > 1; }
  bool driver() const { return !parallel() || group->rank() == 0; }
};

struct LaunchOptions {
  double grace_s = 10;  // after a failure or a forwarded SIGTERM: how long ranks may take before SIGKILL
};

// world 1: a role with nothing set (the single-process path, unchanged). World > 1 in the parent process (no
// rank environment): launches the ranks on this host (this binary, the same arguments), waits for them, sets
// exit_status() and returns nullopt. World > 1 in a rank process: checks its environment and returns the role
// (join_group() then builds the group). Throws ds::Error starting with `command` for what it refuses: bad
// --tp/--ep/--mode, --device cpu (the CPU reference engine has no parallelism), more ranks on this host than
// visible GPUs, bad --devices/--nodes, placement flags without parallelism.
std::optional<ParallelRole> start_parallel(const std::string& command, const ParallelArgs& a,
                                           const std::string& device, LaunchOptions options = {});
// A rank process: selects its GPU and builds its group (make_rank_group; collective: every rank calls it).
// Separate from start_parallel so a command can block signals before the group's threads start and read the
// model's config first. No-op without parallelism.
void join_group(const std::string& command, ParallelRole& role, const ModelConfig& config);

// ---- the engine side's hooks (rank_group.cpp: where the tp-engine branch is wired in)
// The group of a launched rank (NCCL across the ranks' GPUs, peer buffers sized from the config).
std::shared_ptr<parallel::Group> make_rank_group(const parallel::RankEnv& env, const parallel::ParallelSpec& spec,
                                                 const ModelConfig& config);
// A rank's engine: its group (CudaEngineOptions::group) and its slice of the model (DeviceModelOptions' rank
// fields) for spec.
void configure_rank_engine(CudaEngineOptions& engine, DeviceModelOptions& model,
                           std::shared_ptr<parallel::Group> group, const parallel::ParallelSpec& spec);

}  // namespace ds::app
