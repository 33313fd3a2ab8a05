// Multi-process launch: spawns the rank processes of one host (the same command for every rank, told its rank,
// world size and device through the environment), forwards SIGINT/SIGTERM/SIGHUP to them, and when one rank
// fails stops every other rank and reports which one failed. Also the rank side: reading that environment and
// the rendezvous file that carries the NCCL unique id.
//
// Several hosts: run the launcher once per host with the same rank list ("hostA:8,hostB:8"), this host's index
// in it, and a rendezvous path on a filesystem every host sees (docs/parallel.md).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ds::parallel {

// Environment variables the launcher sets in every rank.
inline constexpr const char* kEnvRank = "DELTASERVE_RANK";                  // global rank
inline constexpr const char* kEnvWorld = "DELTASERVE_WORLD_SIZE";
inline constexpr const char* kEnvLocalRank = "DELTASERVE_LOCAL_RANK";      // rank on this host
inline constexpr const char* kEnvLocalWorld = "DELTASERVE_LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvDevice = "DELTASERVE_DEVICE";              // CUDA device ordinal
inline constexpr const char* kEnvRendezvous = "DELTASERVE_RENDEZVOUS";      // file carrying the NCCL id

struct RankEnv {
  int rank = 0, world = 1, local_rank = 0, local_world = 1, device = 0;
  std::string rendezvous;
};
// nullopt when DELTASERVE_RANK is unset (not started by the launcher); ds::Error on a malformed value.
std::optional<RankEnv> rank_env_from_environment();

// This host's part of a rank list "host:count,host:count,...": global ranks [first_rank, first_rank + nprocs).
struct NodeSlice {
  std::string host;
  int world = 0;
  int first_rank = 0;
  int nprocs = 0;
};
NodeSlice parse_rank_list(const std::string& list, int node_index);

struct LaunchSpec {
  std::vector<std::string> argv;            // the rank command (argv[0] without '/' is looked up in PATH)
  int nprocs = 1;                           // ranks on this host
  int world = 0;                            // all ranks (0: nprocs)
  int first_rank = 0;                       // global rank of this host's local rank 0
  std::vector<int> devices;                 // device of local rank i (empty: i)
  std::map<std::string, std::string> env;   // set in every rank, on top of ours
  std::string rendezvous;                   // "" = a fresh file in the temp folder, removed afterwards
  std::string log_dir;                      // "" = ranks share our stdout/stderr; else <log_dir>/rank_<r>.log
  double grace_s = 10;                      // SIGTERM to SIGKILL
  double poll_s = 0.02;
};

struct LaunchResult {
  int exit_code = 0;         // 0 when every rank exited 0; else the first failure's (128 + signal if killed)
  std::string message;       // what happened, naming the rank that failed first
  std::vector<int> statuses; // per local rank: exit code, 128 + signal, or -1 if never started
};

// Runs the ranks to completion (blocking). Ranks run in their own process groups and get SIGKILL if the launcher
// itself dies. Throws ds::Error only when the command cannot be started at all.
LaunchResult launch_ranks(const LaunchSpec& spec);

// Rendezvous file: written once (temporary file + rename, so a reader never sees half of it), read by polling.
void publish_rendezvous(const std::string& path, const std::string& text);
std::string wait_rendezvous(const std::string& path, double timeout_s);

}  // namespace ds::parallel
