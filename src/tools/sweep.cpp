// Recipe runs with child servers (see sweep.h).
#include "tools/sweep.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"

namespace ds::tools {

ManagedServer::ManagedServer(const ServerLaunch& launch, const std::string& label, const std::string& log_path,
                             const std::vector<int>& gpus)
    : launch_(launch), label_(label) {
  const int port = launch.port > 0 ? launch.port : pick_free_port();
  argv_ = expand_command(launch, port);
  for (const auto& [k, v] : launch.env) env_[k] = expand_placeholders(v, launch.host, port);
  if (!gpus.empty()) env_["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(gpus, ","));
  base_url_ = fmt::format("http://{}:{}", launch.host, port);
  child_ = ChildProcess(ChildSpec{argv_, env_, log_path});
  try {
    wait_until_healthy(child_, base_url_, launch.health_timeout_s, fmt::format("server '{}' ({})", label_, argv_[0]));
  } catch (...) {
    child_.stop(launch_.stop_grace_s);
    throw;
  }
}

ManagedServer::~ManagedServer() { stop(); }

int ManagedServer::stop() { return child_.started() ? child_.stop(launch_.stop_grace_s) : -1; }

std::string ManagedServer::describe() const {
  std::string s;
  for (const auto& [k, v] : env_) s += k + "=" + v + " ";
  for (size_t i = 0; i < argv_.size(); ++i) s += (i ? " " : "") + argv_[i];
  return s;
}

BenchReport run_recipe(const Recipe& recipe, const SweepOptions& opt, Progress& progress) {
  const std::string prefix = opt.log_prefix.empty()
                                 ? (std::filesystem::temp_directory_path() / fmt::format("deltaserve-sweep-{}-{}", recipe.name, ::getpid())).string()
                                 : opt.log_prefix;
  BenchReport rep;
  rep.cfg = recipe.bench.bench;
  rep.ab_opts = recipe.bench.ab;
  rep.extra["recipe"] = {{"name", recipe.name}, {"definition", recipe.source}};
  const bool ab = opt.run_ab && recipe.base;
  if (ab) {
    rep.title = fmt::format("sweep '{}': paired A/B", recipe.name);
    // Both load at once (their start-up overlaps), then both are measured interleaved.
    // The base server takes the first of the GPUs handed out, the candidate the rest.
    const auto split = opt.gpus.begin() + std::min<size_t>(opt.gpus.size(), static_cast<size_t>(recipe.base->gpus));
    ManagedServer base(*recipe.base, "base", prefix + ".base.log", {opt.gpus.begin(), split});
    ManagedServer cand(*recipe.cand, "cand", prefix + ".cand.log", {split, opt.gpus.end()});
    rep.preamble = fmt::format("{}\n\n- base: `{}`\n- cand: `{}`\n", recipe.description, base.describe(), cand.describe());
    rep.extra["servers"] = {{"base", base.describe()}, {"cand", cand.describe()}};
    progress.message(fmt::format("servers healthy: base {} / cand {}", base.base_url(), cand.base_url()));
    add_ab_run(rep, run_ab(base.base_url(), cand.base_url(), rep.cfg, recipe.bench.repeats, rep.ab_opts, progress));
  } else {
    CHECK(recipe.server.has_value(), "recipe '{}' has only an A/B pair; run it without --no-ab", recipe.name);
    rep.title = fmt::format("sweep '{}'", recipe.name);
    ManagedServer server(*recipe.server, "server", prefix + ".server.log", opt.gpus);
    rep.preamble = fmt::format("{}\n\n- server: `{}`\n", recipe.description, server.describe());
    rep.extra["servers"] = {{"server", server.describe()}};
    progress.message(fmt::format("server healthy at {}", server.base_url()));
    rep.runs = run_sweep(server.base_url(), rep.cfg, progress, "run", opt.sweep_repeats);
  }
  return rep;
}

}  // namespace ds::tools
