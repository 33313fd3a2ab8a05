// The parallel flags, the launch of the rank processes and a rank's start-up (parallel_cli.h).
#include "app/parallel_cli.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "app/commands.h"
#include "core/device.h"
#include "core/error.h"

namespace ds::app {

void add_parallel_options(CLI::App* cmd, ParallelArgs& a) {
  const char* group = "Parallelism (one process per GPU; docs/parallel.md)";
  cmd->add_option("--tp", a.tp, "Attention tensor-parallel ranks (--mode tep); 1 = no tensor parallelism")
      ->default_val(1)
      ->group(group);
  cmd->add_option("--ep", a.ep,
                  "Expert-parallel ranks: tep: --tp (experts split) or 1 (replicated); dep: the rank count")
      ->default_val(1)
      ->group(group);
  cmd->add_option("--mode", a.mode,
                  "tep: attention tensor-parallel + MoE expert-parallel, every rank the same batch; dep: attention "
                  "data-parallel (each rank its own requests) + MoE expert-parallel")
      ->default_val("tep")
      ->group(group);
  cmd->add_option("--devices", a.devices, "GPUs of this host's ranks, in rank order (default 0,1,...)")
      ->delimiter(',')
      ->group(group);
  cmd->add_option("--nodes", a.nodes,
                  "Several hosts: the rank list host:count,host:count,... (run the command once per host)")
      ->group(group);
  cmd->add_option("--node-index", a.node_index, "This host's position in --nodes")->default_val(0)->group(group);
  cmd->add_option("--rendezvous", a.rendezvous,
                  "File for the NCCL id, on a filesystem every host sees (several hosts); default: a fresh "
                  "temporary file")
      ->group(group);
}

namespace {

std::vector<std::string> self_command() {
  std::vector<std::string> argv = process_args();
  if (argv.empty()) DS_THROW("the command line of this process is unknown (process_args() is empty)");
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) argv[0] = exe.string();  // re-run exactly this binary, whatever PATH says
  return argv;
}

std::optional<ParallelRole> launch(const std::string& command, const ParallelArgs& a, const ParallelRole& role,
                                   const LaunchOptions& options) {
  const int world = role.spec.world();
  parallel::NodeSlice slice{"", world, 0, world};
  if (!a.nodes.empty()) {
    try {
      slice = parallel::parse_rank_list(a.nodes, a.node_index);
    } catch (const Error& e) {
      DS_THROW("{}: --nodes '{}' --node-index {}: {}", command, a.nodes, a.node_index, e.what());
    }
    if (slice.world != world)
      DS_THROW("{}: --nodes '{}' lists {} ranks, but --tp {} --ep {} --mode {} asks for {}", command, a.nodes,
               slice.world, a.tp, a.ep, a.mode, world);
    if (slice.nprocs < world && a.rendezvous.empty())
      DS_THROW("{}: --nodes with several hosts needs --rendezvous PATH on a filesystem every host sees (it "
               "carries the NCCL id from rank 0's host to the others)",
               command);
  } else if (a.node_index != 0) {
    DS_THROW("{}: --node-index needs --nodes", command);
  }
  const int visible = cuda_device_count();
  if (slice.nprocs > visible)
    DS_THROW("{}: --tp {} --ep {} --mode {} runs {} rank(s) on this host, one per GPU, but {} GPU(s) {} visible{}",
             command, a.tp, a.ep, a.mode, slice.nprocs, visible, visible == 1 ? "is" : "are",
             cuda_device_available() ? "" : " (no CUDA device found; the CUDA engine is required)");
  if (!a.devices.empty()) {
    if (static_cast<int>(a.devices.size()) != slice.nprocs)
      DS_THROW("{}: --devices lists {} GPU(s) for {} rank(s) on this host", command, a.devices.size(), slice.nprocs);
    std::set<int> seen;
    for (int d : a.devices) {
      if (d < 0 || d >= visible) DS_THROW("{}: --devices: GPU {} does not exist ({} visible)", command, d, visible);
      if (!seen.insert(d).second) DS_THROW("{}: --devices: GPU {} is listed twice (one rank per GPU)", command, d);
    }
  }
  parallel::LaunchSpec ls;
  ls.argv = self_command();
  ls.nprocs = slice.nprocs;
  ls.world = world;
  ls.first_rank = slice.first_rank;
  ls.devices = a.devices;
  ls.rendezvous = a.rendezvous;
  ls.grace_s = options.grace_s;
  std::fprintf(stderr, "deltaserve %s: launching ranks %d..%d of %d (--mode %s, tp %d, ep %d)\n", command.c_str(),
               slice.first_rank, slice.first_rank + slice.nprocs - 1, world, a.mode.c_str(), role.spec.tp,
               role.spec.ep);
  std::fflush(stderr);
  const parallel::LaunchResult r = parallel::launch_ranks(ls);
  if (r.exit_code != 0) std::fprintf(stderr, "deltaserve %s: %s\n", command.c_str(), r.message.c_str());
  exit_status() = r.exit_code;
  return std::nullopt;
}

}  // namespace

std::optional<ParallelRole> start_parallel(const std::string& command, const ParallelArgs& a,
                                           const std::string& device, LaunchOptions options) {
  ParallelRole role;
  try {
    role.spec = parallel::parse_parallel_spec(a.tp, a.ep, a.mode);
  } catch (const Error& e) {
    DS_THROW("{}: {}", command, e.what());
  }
  const int world = role.spec.world();
  if (world == 1) {
    if (!a.devices.empty() || !a.nodes.empty() || !a.rendezvous.empty() || a.node_index != 0)
      DS_THROW("{}: --devices, --nodes, --node-index and --rendezvous place the ranks of a parallel run; they "
               "need --tp or --ep above 1",
               command);
    return role;
  }
  if (device == "cpu")
    DS_THROW("{}: --device cpu runs the CPU reference engine, which has no tensor or expert parallelism; "
             "--tp {} --ep {} --mode {} needs the CUDA engine, one GPU per rank (drop --device cpu, or run with "
             "--tp 1 --ep 1)",
             command, a.tp, a.ep, a.mode);
  role.env = parallel::rank_env_from_environment();
  if (!role.env) return launch(command, a, role, options);

  // A rank process.
  const parallel::RankEnv& env = *role.env;
  if (env.world != world)
    DS_THROW("{} (rank {}): launched into a world of {} ranks, but --tp {} --ep {} --mode {} asks for {}", command,
             env.rank, env.world, a.tp, a.ep, a.mode, world);
  return role;
}

void join_group(const std::string& command, ParallelRole& role, const ModelConfig& config) {
  if (!role.parallel()) return;
  CHECK(role.env.has_value(), "join_group outside a rank process");
  const parallel::RankEnv& env = *role.env;
  const int world = role.spec.world();
  try {
    cuda_select_device(env.device);
  } catch (const Error& e) {
    DS_THROW("{} (rank {}): {}", command, env.rank, e.what());
  }
  role.group = make_rank_group(env, role.spec, config);
  if (!role.group || role.group->rank() != env.rank || role.group->world() != world ||
      role.group->mode() != role.spec.mode)
    DS_THROW("{} (rank {}): the rank's group does not match its environment (rank {}, world {}, mode {})", command,
             env.rank, role.group ? role.group->rank() : -1, role.group ? role.group->world() : 0,
             role.group ? parallel::to_string(role.group->mode()) : "none");
  std::fprintf(stderr, "deltaserve %s: rank %d of %d on GPU %d (%s group, --mode %s)\n", command.c_str(), env.rank,
               world, env.device, role.group->name().c_str(), parallel::to_string(role.spec.mode).c_str());
}

}  // namespace ds::app
