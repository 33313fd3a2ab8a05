// The rank-0 side of a TEP or DEP group: an Engine decorator the HTTP server (or generate / bench-engine) drives
// as if it were one engine. Every step() first sends rank 0's recorded commands (new requests, cancels) to the
// worker ranks through Group::exchange, so every rank steps together; the workers run worker_loop()
// (worker_loop.h). docs/parallel.md, "Process layer", is the description; rank_protocol.h the messages.
//
// TEP: every rank holds a full engine replica with the same requests in the same order (the engine broadcasts
//      rank 0's sampled tokens internally, so the replicas cannot drift); rank 0's outputs are the answer.
// DEP: each request runs on one rank (attention data-parallel), chosen least-loaded by rank 0; every rank steps
//      at every step, idle or not (the MoE all-to-all needs all of them), and the outputs of every rank come back
//      to rank 0 through a second exchange after the step.
//
// Failure: a worker's error (reported through the exchange), a failed exchange, or rank 0's own step failure
// makes the group unusable: every rank stops with an error naming the rank, `on_fatal` is called once, every
// later add_request/step throws that error, has_work() is false and cancel() returns false (callers tearing down
// must not throw or spin). No wait is unbounded beyond the Group's own exchange timeout.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"
#include "runtime/parallel/group.h"
#include "runtime/parallel/rank_protocol.h"

namespace ds::parallel {

struct DriverOptions {
  // The engines' seed: a request without a seed gets derive_seed(engine_seed, group-wide id), written into the
  // request before it is sent, so it draws what a single engine would have drawn for it.
  uint64_t engine_seed = 0;
  // Called once, on the calling (engine) thread, when the group failed; the argument is the error.
  std::function<void(const std::string&)> on_fatal;
};

class DriverEngine : public Engine {
 public:
  // `local` is rank 0's own engine and `group` rank 0's group (rank 0, world >= 2, the subclass's mode); both
  // outlive this.
  DriverEngine(Engine& local, Group& group, DriverOptions options, Mode mode);
  // Not shut down (an exception ended the command): tells the workers to abort, best effort.
  ~DriverEngine() override;
  DriverEngine(const DriverEngine&) = delete;
  DriverEngine& operator=(const DriverEngine&) = delete;

  const ModelConfig& config() const override { return local_.config(); }

  // While idle (no work anywhere): one empty exchange, so the workers' wait in their exchange stays under the
  // group's collective timeout and a dead worker is noticed. No-op while there is work or after shutdown.
  void heartbeat();
  // Tells every worker to return from worker_loop (after rank 0 drained). Idempotent; throws a worker's error
  // reported in that last exchange. Commands recorded since the last step are dropped.
  void shutdown();
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }
  int world() const { return world_; }

 protected:
  // One exchange carrying `frame`; checks the workers' reports in it (every rank sees the same messages, so
  // every rank stops on the same error). Returns every rank's message.
  std::vector<std::string> send_frame(const Frame& frame);
  // group_.exchange(msg) with one message per rank, or fail() naming `what` ("control", "report").
  std::vector<std::string> exchange_or_fail(const std::string& msg, const char* what);
  // Marks the group failed, calls on_fatal, throws. tell_workers: the workers wait for a frame (rank 0 itself
  // failed), so send them kAbort first.
  [[noreturn]] void fail(const std::string& why, bool tell_workers);
  void check_usable() const;

  Engine& local_;
  Group& group_;
  DriverOptions options_;
  int world_ = 1;
  bool failed_ = false;
  bool done_ = false;
  std::string failure_;
};

// TEP: rank 0 adds to its own engine first (validation errors reach the client at once) and forwards what its
// engine accepted; workers map rank 0's ids to their own.
class TepDriverEngine final : public DriverEngine {
 public:
  TepDriverEngine(Engine& local, Group& group, DriverOptions options);
  RequestId add_request(Request request) override;
  bool cancel(RequestId id) override;
  std::vector<RequestOutput> step() override;
  bool has_work() const override;
  EngineStats stats() const override { return local_.stats(); }

 private:
  std::vector<AddCommand> adds_;
  std::vector<CancelCommand> cancels_;
};

// DEP: group-wide ids 1, 2, ... in add order (a single engine's numbering); a request goes to the rank with the
// fewest unfinished requests (ties: the lowest rank). A request for rank 0 is added at once (validation errors
// reach the client at once); a worker's refusal comes back as a finished output carrying `error`.
class DepDriverEngine final : public DriverEngine {
 public:
  DepDriverEngine(Engine& local, Group& group, DriverOptions options);
  RequestId add_request(Request request) override;
  bool cancel(RequestId id) override;
  std::vector<RequestOutput> step() override;
  bool has_work() const override;
  // Summed over the ranks (workers as of their last step); steps: rank 0's.
  EngineStats stats() const override;

  // Unfinished requests per rank (tests, logs).
  const std::vector<int>& load() const { return load_; }

 private:
  RequestId next_id_ = 1;
  std::vector<int> load_;
  std::unordered_map<RequestId, int> rank_of_;  // unfinished requests -> rank
  std::unordered_map<RequestId, RequestId> to_local_, to_group_;  // rank 0's engine ids <-> group ids
  std::vector<AddCommand> adds_;
  std::vector<CancelCommand> cancels_;
  std::vector<EngineStats> stats_;  // per rank, from the last reports
  bool any_work_ = false;           // some rank had work after the last step
};

// The driver for group.mode().
std::unique_ptr<DriverEngine> make_driver_engine(Engine& local, Group& group, DriverOptions options);

}  // namespace ds::parallel
