// Rank processes: spawn, supervise, stop together (see launcher.h).
#include "runtime/parallel/launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/subprocess.h"

namespace ds::parallel {

namespace {

using Clock = std::chrono::steady_clock;

int parse_int(const std::string& s, const char* what) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) DS_THROW("{}='{}' is not an integer", what, s);
  return v;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? parse_int(v, name) : fallback;
}

// Signals the launcher forwards to its ranks; the handler only records the number (async-signal-safe).
std::atomic<int> g_signal{0};
void record_signal(int sig) { g_signal.store(sig); }

class SignalForwarding {
 public:
  SignalForwarding() {
    g_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = record_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

std::string describe_status(int status) {
  if (status > 128 && status < 128 + 65) return fmt::format("was killed by signal {} ({})", status - 128, strsignal(status - 128));
  return fmt::format("exited with status {}", status);
}

struct Rank {
  int global = 0;
  pid_t pid = -1;
  int status = -1;
  bool done = true;
};

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks)
    if (!r.done) ::kill(-r.pid, sig);
}

}  // namespace

std::optional<RankEnv> rank_env_from_environment() {
  if (!std::getenv(kEnvRank)) return std::nullopt;
  RankEnv e;
  e.rank = env_int(kEnvRank, 0);
  e.world = env_int(kEnvWorld, 1);
  e.local_rank = env_int(kEnvLocalRank, e.rank);
  e.local_world = env_int(kEnvLocalWorld, e.world);
  e.device = env_int(kEnvDevice, e.local_rank);
  if (const char* r = std::getenv(kEnvRendezvous)) e.rendezvous = r;
  CHECK(e.world >= 1 && e.rank >= 0 && e.rank < e.world, "{}={} is outside [0, {}={})", kEnvRank, e.rank, kEnvWorld,
        e.world);
  CHECK(e.local_rank >= 0 && e.local_rank < e.local_world && e.local_world <= e.world && e.device >= 0,
        "inconsistent rank environment: local rank {} of {}, device {}", e.local_rank, e.local_world, e.device);
  return e;
}

NodeSlice parse_rank_list(const std::string& list, int node_index) {
  NodeSlice out;
  int index = 0;
  std::stringstream ss(list);
  std::string item;
  bool found = false;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.rfind(':');
    CHECK(colon != std::string::npos && colon > 0, "rank list '{}': entry '{}' is not host:count", list, item);
    const int count = parse_int(item.substr(colon + 1), "rank list count");
    CHECK(count >= 1, "rank list '{}': host {} has {} ranks", list, item.substr(0, colon), count);
    if (index == node_index) {
      out.host = item.substr(0, colon);
      out.first_rank = out.world;
      out.nprocs = count;
      found = true;
    }
    out.world += count;
    ++index;
  }
  CHECK(found, "rank list '{}' has {} hosts; no host with index {}", list, index, node_index);
  return out;
}

void publish_rendezvous(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.close();
    CHECK(f, "rendezvous: cannot write {}", tmp);
  }
  CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rendezvous: rename to {} failed: {}", path, std::strerror(errno));
}

std::string wait_rendezvous(const std::string& path, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      std::string s = ss.str();
      if (!s.empty()) return s;
    }
    if (Clock::now() > deadline)
      DS_THROW("rendezvous: {} did not appear within {} s (is rank 0 running and the path shared by every host?)",
               path, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

LaunchResult launch_ranks(const LaunchSpec& spec) {
  CHECK(!spec.argv.empty(), "launcher: empty rank command");
  const int n = spec.nprocs;
  const int world = spec.world > 0 ? spec.world : n;
  CHECK(n >= 1 && spec.first_rank >= 0 && spec.first_rank + n <= world, "launcher: ranks [{}, {}) of {}",
        spec.first_rank, spec.first_rank + n, world);
  CHECK(spec.devices.empty() || static_cast<int>(spec.devices.size()) == n, "launcher: {} devices for {} ranks",
        spec.devices.size(), n);

  static std::atomic<int> launches{0};
  std::string rendezvous = spec.rendezvous;
  const bool own_rendezvous = rendezvous.empty();
  if (own_rendezvous)
    rendezvous = (std::filesystem::temp_directory_path() /
                  fmt::format("deltaserve_rendezvous_{}_{}", ::getpid(), launches.fetch_add(1)))
                     .string();
  std::filesystem::remove(rendezvous);  // a stale id from an earlier run would join the wrong communicator

  std::vector<SpawnSpec> args(n);
  for (int i = 0; i < n; ++i) {
    std::map<std::string, std::string> env = spec.env;
    env[kEnvRank] = std::to_string(spec.first_rank + i);
    env[kEnvWorld] = std::to_string(world);
    env[kEnvLocalRank] = std::to_string(i);
    env[kEnvLocalWorld] = std::to_string(n);
    env[kEnvDevice] = std::to_string(spec.devices.empty() ? i : spec.devices[i]);
    env[kEnvRendezvous] = rendezvous;
    if (!std::getenv("NCCL_NVLS_ENABLE") && !env.count("NCCL_NVLS_ENABLE")) env["NCCL_NVLS_ENABLE"] = "0";
    args[i].env = child_environment(env);
    args[i].argv = spec.argv;
    if (!spec.log_dir.empty()) args[i].log_path = fmt::format("{}/rank_{}.log", spec.log_dir, spec.first_rank + i);
    args[i].parent_death_signal = SIGKILL;  // the launcher died without stopping us
    // Forwarded signals stay blocked across fork: the child must not run the launcher's handler (which would
    // swallow a SIGTERM) before it has reset them to the default.
    args[i].default_signals = {SIGINT, SIGTERM, SIGHUP};
    args[i].who = "launcher";
  }

  SignalForwarding forwarding;
  std::vector<Rank> ranks(n);
  for (int i = 0; i < n; ++i) {
    ranks[i].global = spec.first_rank + i;
    try {
      ranks[i].pid = spawn_process(args[i]);
      ranks[i].done = false;
    } catch (...) {
      signal_all(ranks, SIGKILL);
      for (auto& r : ranks)
        if (!r.done) ::waitpid(r.pid, nullptr, 0);
      throw;
    }
  }

  LaunchResult res;
  bool stopping = false, killed = false;
  Clock::time_point kill_at;
  int alive = n;
  auto begin_stop = [&](int sig) {
    stopping = true;
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.grace_s));
    signal_all(ranks, sig);
  };
  while (alive > 0) {
    for (auto& r : ranks) {
      if (r.done) continue;
      int raw = 0;
      const pid_t got = ::waitpid(r.pid, &raw, WNOHANG);
      if (got != r.pid) continue;
      r.done = true;
      r.status = decode_wait_status(raw);
      --alive;
      if (r.status != 0 && !stopping) {
        res.exit_code = r.status;
        res.message = fmt::format("rank {} (pid {}) {}; stopping the other {} rank(s)", r.global, r.pid,
                                  describe_status(r.status), alive);
        LOG_ERROR("launcher: {}", res.message);
        begin_stop(SIGTERM);
      }
    }
    if (const int sig = g_signal.exchange(0); sig != 0 && alive > 0) {
      if (!stopping) {
        res.exit_code = 128 + sig;
        res.message = fmt::format("launcher received signal {} ({}); forwarded to every rank", sig, strsignal(sig));
        LOG_WARN("launcher: {}", res.message);
        begin_stop(sig);
      } else {
        signal_all(ranks, sig);
      }
    }
    if (stopping && !killed && alive > 0 && Clock::now() > kill_at) {
      killed = true;
      std::string late;
      for (const auto& r : ranks)
        if (!r.done) late += fmt::format("{}{}", late.empty() ? "" : ", ", r.global);
      res.message += fmt::format("; rank(s) {} did not stop within {} s and were killed", late, spec.grace_s);
      signal_all(ranks, SIGKILL);
    }
    if (alive > 0) std::this_thread::sleep_for(std::chrono::duration<double>(spec.poll_s));
  }
  for (const auto& r : ranks) res.statuses.push_back(r.status);
  if (res.message.empty()) res.message = fmt::format("all {} rank(s) exited with status 0", n);
  if (own_rendezvous) std::filesystem::remove(rendezvous);
  return res;
}

}  // namespace ds::parallel
