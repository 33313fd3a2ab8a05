// The host side of a DEP MoE layer (docs/parallel.md, "DEP flow"): which of a rank's tokens go to which rank,
// the message the ranks exchange (counts + route rows), what a rank receives, and where each partial output
// comes back. Pure host code (CPU-tested); cuda_forward_dep.cpp moves the rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds::dep {

struct Dispatch {
  std::vector<std::vector<int32_t>> to;  // [W] tokens sent to rank p (ascending), each once with its whole route row
  std::vector<size_t> send_rows, send_off;  // [W] rows to rank p and their first row in the send buffer
  std::vector<int32_t> send_idx;         // [sum send_rows] token of each send row (ranks in order)
  std::vector<int32_t> comb_idx;         // [T * W] row of token t's partial from rank p among the returned rows
                                         // (the send order), -1 when t sent nothing to p
  std::string message;                   // per rank p: uint32 count, int32 ids [count, K], f32 weights [count, K]
};

// ids / weights [T, K]: this rank's routes (global expert ids); experts [p * EL, (p + 1) * EL) live on rank p.
// Throws ds::Error for an expert id outside [0, W * EL).
Dispatch plan_dispatch(const int32_t* ids, const float* weights, int T, int K, int W, int EL);

struct Received {
  std::vector<size_t> rows, off;  // [W] rows from source s and their first row in the receive buffer
  size_t total = 0;
  std::vector<int32_t> ids;       // [total, K] route rows in receive order
  std::vector<float> weights;     // [total, K]
};

// Every rank's message (group->exchange, rank order) -> what rank `me` receives.
Received parse_received(const std::vector<std::string>& all, int me, int W, int K);

}  // namespace ds::dep
