// The worker ranks (1..world-1) of a TEP or DEP group: receive rank 0's commands, apply them, step, repeat,
// until rank 0 says shutdown (driver_engine.h is the other side, rank_protocol.h the messages).
#pragma once

#include <cstdint>

#include "runtime/engine.h"
#include "runtime/parallel/group.h"

namespace ds::parallel {

struct WorkerStats {
  int64_t steps = 0;     // step() calls (DEP: with or without own work)
  int64_t requests = 0;  // requests this rank's engine accepted
};

// Runs until rank 0 sends shutdown (returns) or the group fails: any rank's error, rank 0's abort, a failed or
// malformed exchange, or this engine's own failure throw ds::Error naming the rank that failed (this rank's
// own error is first reported to the others through the exchange, so every rank stops on it).
// A TEP worker's engine refusing a request rank 0 accepted is a failure (the replicas would diverge); a DEP
// worker's refusal goes back to rank 0 for the client.
WorkerStats worker_loop(Engine& engine, Group& group);

}  // namespace ds::parallel
