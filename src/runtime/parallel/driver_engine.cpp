// Rank 0's engine decorators for TEP and DEP groups (driver_engine.h).
#include "runtime/parallel/driver_engine.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "runtime/cpu_engine.h"  // derive_seed

namespace ds::parallel {

// ---- DriverEngine: the frame exchange, failure and shutdown shared by both modes

DriverEngine::DriverEngine(Engine& local, Group& group, DriverOptions options, Mode mode)
    : local_(local), group_(group), options_(std::move(options)), world_(group.world()) {
  if (group.rank() != 0) DS_THROW("the driver engine runs on rank 0, not on rank {}", group.rank());
  if (world_ < 2) DS_THROW("a driver engine needs a group of at least 2 ranks (world {})", world_);
  if (group.mode() != mode)
    DS_THROW("the {} driver engine was given a {} group", to_string(mode), to_string(group.mode()));
}

DriverEngine::~DriverEngine() {
  if (done_ || failed_) return;
  try {
    Frame f;
    f.kind = FrameKind::kAbort;
    f.message = "rank 0 failed: it ended without shutting the group down (its command failed)";
    group_.exchange(encode(f));
  } catch (const std::exception& e) {
    LOG_WARN("could not tell the worker ranks to abort: {}", e.what());
  }
}

void DriverEngine::check_usable() const {
  if (failed_) throw Error(failure_);
  if (done_) DS_THROW("the parallel group was shut down");
}

void DriverEngine::fail(const std::string& why, bool tell_workers) {
  if (!failed_) {
    failed_ = true;
    failure_ = why;
    LOG_ERROR("parallel group ({}, {} ranks) failed: {}", to_string(group_.mode()), world_, why);
    if (tell_workers) {
      try {
        Frame f;
        f.kind = FrameKind::kAbort;
        f.message = why;
        group_.exchange(encode(f));
      } catch (const std::exception& e) {
        LOG_WARN("could not tell the worker ranks to abort: {}", e.what());
      }
    }
    if (options_.on_fatal) options_.on_fatal(why);
  }
  throw Error(failure_);
}

std::vector<std::string> DriverEngine::exchange_or_fail(const std::string& msg, const char* what) {
  std::vector<std::string> msgs;
  try {
    msgs = group_.exchange(msg);
  } catch (const std::exception& e) {
    fail(fmt::format("the {} exchange failed: {}", what, e.what()), false);
  }
  if (static_cast<int>(msgs.size()) != world_)
    fail(fmt::format("the {} exchange returned {} messages for {} ranks", what, msgs.size(), world_), false);
  return msgs;
}

std::vector<std::string> DriverEngine::send_frame(const Frame& frame) {
  std::vector<std::string> msgs = exchange_or_fail(encode(frame), "control");
  std::string err;
  try {
    err = first_rank_error(msgs, 1);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (!err.empty()) fail(err, false);  // the workers saw the same messages and stop on their own
  return msgs;
}

void DriverEngine::heartbeat() {
  if (failed_ || done_ || has_work()) return;
  Frame f;
  f.kind = FrameKind::kIdle;
  send_frame(f);
}

void DriverEngine::shutdown() {
  if (done_) return;
  check_usable();
  Frame f;
  f.kind = FrameKind::kShutdown;
  send_frame(f);  // on failure: failed_ is set and the error thrown
  done_ = true;
}

// ---- TEP

TepDriverEngine::TepDriverEngine(Engine& local, Group& group, DriverOptions options)
    : DriverEngine(local, group, std::move(options), Mode::kTep) {}

RequestId TepDriverEngine::add_request(Request request) {
  check_usable();
  Request copy = request;
  const RequestId id = local_.add_request(std::move(request));  // throws: refused, nothing recorded
  if (!copy.sampling.seed) copy.sampling.seed = derive_seed(options_.engine_seed, id);
  adds_.push_back({-1, id, std::move(copy)});
  return id;
}

bool TepDriverEngine::cancel(RequestId id) {
  if (failed_ || done_) return false;  // nothing runs any more (callers cancel while tearing down)
  const bool ok = local_.cancel(id);
  if (ok) cancels_.push_back({-1, id});
  return ok;
}

bool TepDriverEngine::has_work() const {
  if (failed_ || done_) return false;  // a failed group never steps again: no caller may wait or spin on it
  return local_.has_work() || !adds_.empty() || !cancels_.empty();
}

std::vector<RequestOutput> TepDriverEngine::step() {
  check_usable();
  Frame f;
  f.kind = FrameKind::kStep;
  f.adds.swap(adds_);
  f.cancels.swap(cancels_);
  send_frame(f);
  try {
    return local_.step();
  } catch (const std::exception& e) {
    fail(fmt::format("rank 0 failed: {}", e.what()), true);
  }
}

// ---- DEP

DepDriverEngine::DepDriverEngine(Engine& local, Group& group, DriverOptions options)
    : DriverEngine(local, group, std::move(options), Mode::kDep), load_(world_, 0), stats_(world_, local.stats()) {}

RequestId DepDriverEngine::add_request(Request request) {
  check_usable();
  const RequestId id = next_id_;
  if (!request.sampling.seed) request.sampling.seed = derive_seed(options_.engine_seed, id);
  const int rank = static_cast<int>(std::min_element(load_.begin(), load_.end()) - load_.begin());
  if (rank == 0) {
    const RequestId lid = local_.add_request(std::move(request));  // throws: refused, id not used
    to_local_[id] = lid;
    to_group_[lid] = id;
  } else {
    adds_.push_back({rank, id, std::move(request)});
  }
  ++next_id_;
  ++load_[rank];
  rank_of_[id] = rank;
  return id;
}

bool DepDriverEngine::cancel(RequestId id) {
  if (failed_ || done_) return false;
  const auto it = rank_of_.find(id);
  if (it == rank_of_.end()) return false;
  if (it->second == 0) return local_.cancel(to_local_.at(id));
  cancels_.push_back({it->second, id});
  return true;
}

bool DepDriverEngine::has_work() const {
  if (failed_ || done_) return false;
  return any_work_ || local_.has_work() || !adds_.empty() || !cancels_.empty();
}

EngineStats DepDriverEngine::stats() const {
  EngineStats s = local_.stats();
  for (int r = 1; r < world_; ++r) {
    const EngineStats& w = stats_[r];
    s.running += w.running;
    s.waiting += w.waiting;
    s.slots_in_use += w.slots_in_use;
    s.free_slots += w.free_slots;
    s.max_seqs += w.max_seqs;
    s.prompt_tokens += w.prompt_tokens;
    s.generated_tokens += w.generated_tokens;
  }
  return s;
}

std::vector<RequestOutput> DepDriverEngine::step() {
  check_usable();
  Frame f;
  f.kind = FrameKind::kStep;
  f.adds.swap(adds_);
  f.cancels.swap(cancels_);
  send_frame(f);

  // Every rank steps now, ours included; then every rank's report goes to every rank.
  Report mine;
  try {
    for (RequestOutput& o : local_.step()) {
      const RequestId lid = o.id;
      o.id = to_group_.at(lid);
      if (o.finished) {
        to_group_.erase(lid);
        to_local_.erase(o.id);
      }
      mine.outputs.push_back(std::move(o));
    }
    mine.has_work = local_.has_work();
    mine.stats = local_.stats();
  } catch (const std::exception& e) {
    mine.error = e.what();  // reported through the exchange: every rank stops on it
  }
  const std::vector<std::string> all = exchange_or_fail(encode(mine), "report");
  std::vector<Report> reps;
  try {
    for (int r = 0; r < world_; ++r) reps.push_back(decode_report(all[r], r));
  } catch (const std::exception& e) {
    fail(e.what(), false);
  }
  for (int r = 0; r < world_; ++r)
    if (!reps[r].error.empty()) fail(fmt::format("rank {} failed: {}", r, reps[r].error), false);

  std::vector<RequestOutput> outs;
  any_work_ = false;
  for (int r = 0; r < world_; ++r) {
    Report& rep = reps[r];
    any_work_ = any_work_ || rep.has_work;
    stats_[r] = rep.stats;
    for (RequestOutput& o : rep.outputs) {
      if (o.finished && rank_of_.erase(o.id)) --load_[r];
      outs.push_back(std::move(o));
    }
    for (Refusal& x : rep.refused) {
      if (rank_of_.erase(x.id)) --load_[r];
      RequestOutput o;
      o.id = x.id;
      o.finished = true;
      o.error = std::move(x.message);
      outs.push_back(std::move(o));
    }
  }
  return outs;
}

std::unique_ptr<DriverEngine> make_driver_engine(Engine& local, Group& group, DriverOptions options) {
  if (group.mode() == Mode::kTep) return std::make_unique<TepDriverEngine>(local, group, std::move(options));
  return std::make_unique<DepDriverEngine>(local, group, std::move(options));
}

}  // namespace ds::parallel
