// Ranks simulated by threads of one process on one GPU (tests, single-GPU benchmarks): one shared state creates
// `world` Groups. Device collectives are stream-ordered between the ranks' streams: each rank records an event
// when its data is ready, a host barrier publishes pointers and events, each rank's stream waits for the data it
// reads, copies it, and the owner's stream waits until every reader is done before it may overwrite it. The sum
// is the one-shot peer all-reduce over PeerBuffers::create_simulated (capturable in a CUDA graph, rank-ordered:
// the same bits on every rank), whose buffers also give the fused MoE finalize + all-reduce + RMSNorm its view.
// device < 0 builds host-only groups (exchange, barrier: the CPU tests); their device collectives throw.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/parallel/group.h"

namespace ds::parallel {

struct SimulatedOptions {
  int world = 2;
  Mode mode = Mode::kTep;
  int device = 0;               // the one GPU every rank runs on; < 0: host-only (no CUDA call)
  size_t sum_elems = 0;         // largest all_reduce_sum count (elements of a 2-byte dtype); 0: no peer buffers
  double timeout_s = 120;       // a host barrier waiting longer fails every rank (a rank died or diverged)
};

// The world's groups, rank r at index r. Each is driven by its own thread; they share the state.
std::vector<std::shared_ptr<Group>> create_simulated_groups(const SimulatedOptions& o);

}  // namespace ds::parallel
