// The worker ranks' loop (worker_loop.h).
#include "runtime/parallel/worker_loop.h"

#include <unordered_map>

#include "core/error.h"
#include "runtime/parallel/rank_protocol.h"

namespace ds::parallel {

WorkerStats worker_loop(Engine& engine, Group& group) {
  const int me = group.rank();
  const int world = group.world();
  const bool dep = group.mode() == Mode::kDep;
  if (me == 0) DS_THROW("worker_loop runs on ranks 1..{}, not on rank 0 (the driver)", world - 1);
  WorkerStats ws;
  std::unordered_map<RequestId, RequestId> to_local, to_group;  // rank 0's ids <-> this engine's
  std::string pending_error;  // TEP: this rank's failure, reported in the next exchange
  auto exchange = [&](const std::string& mine) {
    std::vector<std::string> msgs = group.exchange(mine);
    if (static_cast<int>(msgs.size()) != world)
      DS_THROW("rank {}: the control exchange returned {} messages for {} ranks", me, msgs.size(), world);
    return msgs;
  };
  for (;;) {
    Report before;
    before.error = pending_error;
    const std::vector<std::string> msgs = exchange(encode(before));
    const Frame f = decode_frame(msgs[0], 0);
    const std::string err = first_rank_error(msgs, 1);  // ours included: we stop on it like every other rank
    if (!err.empty()) throw Error(err);
    if (f.kind == FrameKind::kShutdown) return ws;
    if (f.kind == FrameKind::kAbort) throw Error(f.message);  // names rank 0 and why
    if (f.kind == FrameKind::kIdle) continue;

    Report after;
    try {
      for (const AddCommand& a : f.adds) {
        if (a.rank != -1 && a.rank != me) continue;
        RequestId lid = 0;
        try {
          lid = engine.add_request(a.request);
        } catch (const std::exception& e) {
          if (!dep)
            DS_THROW("rank {} refused request {} that rank 0 accepted (the replicas would diverge): {}", me, a.id,
                     e.what());
          after.refused.push_back({a.id, e.what()});
          continue;
        }
        ++ws.requests;
        to_local[a.id] = lid;
        to_group[lid] = a.id;
      }
      for (const CancelCommand& c : f.cancels) {
        if (c.rank != -1 && c.rank != me) continue;
        const auto it = to_local.find(c.id);
        if (it != to_local.end()) engine.cancel(it->second);  // false: it finished meanwhile
      }
      std::vector<RequestOutput> outs = engine.step();
      ++ws.steps;
      for (RequestOutput& o : outs) {
        const auto it = to_group.find(o.id);
        if (it == to_group.end()) DS_THROW("rank {}: the engine reported request {} that it was never given", me, o.id);
        const RequestId lid = o.id;
        o.id = it->second;
        if (o.finished) {
          to_local.erase(o.id);
          to_group.erase(lid);
        }
        if (dep) after.outputs.push_back(std::move(o));
      }
      after.has_work = engine.has_work();
      after.stats = engine.stats();
    } catch (const std::exception& e) {
      after.error = e.what();
    }
    if (!dep) {
      pending_error = after.error;
      continue;
    }
    // DEP: every rank's outputs to every rank (rank 0 delivers them); every rank stops on any rank's error.
    const std::vector<std::string> reports = exchange(encode(after));
    const std::string rerr = first_rank_error(reports, 0);
    if (!rerr.empty()) throw Error(rerr);
  }
}

}  // namespace ds::parallel
