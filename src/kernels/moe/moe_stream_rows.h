// Which permuted rows each grid row of the stream GEMM covers (moe_stream.cuh), as host/device arithmetic so
// the CPU tests check the mapping the kernels use (MoeHost.StreamSlotRowsCoverEveryRowOnce).
// Grid rows: the plan's active groups in order, the shared expert last (moe_plan.cu), then the shared expert's
// further chunks: it sees all T tokens, and each pass of `pass` rows (8 x token tiles) runs on a grid row of its
// own instead of one after another on one CTA.
#pragma once

#include <algorithm>
#include <climits>

#include "kernels/moe/moe_bits.h"  // MOE_HD

namespace ds::moe::detail {

// Chunks of `pass` rows the shared expert's T rows take (0 without a shared expert).
MOE_HD int stream_shared_chunks(bool has_shared, int T, int pass) { return has_shared ? (T + pass - 1) / pass : 0; }

// Grid rows with work on the dispatched plan: num_active groups (the shared expert counted once), plus its other
// chunks.
MOE_HD int stream_grid_slots(int num_active, bool has_shared, int T, int pass) {
  return num_active + stream_shared_chunks(has_shared, T, pass) - (has_shared ? 1 : 0);
}

struct StreamRows {
  int rb, cnt;  // permuted rows [rb, rb + cnt)
};

// Rows of grid row `slot` (< stream_grid_slots) on the dispatched plan. begin / count: those of its group,
// P.active[min(slot, num_active - 1)]; shared: that group is the shared expert. Branch-free: narrowing under an
// `if` made the MX/NVFP4 instances, capped at 128 registers, spill (docs/perf-moe.md run 20).
MOE_HD StreamRows stream_slot_rows(int slot, int num_active, int begin, int count, bool shared, int pass) {
#if defined(__CUDA_ARCH__)
  const int pb = max(slot - (num_active - 1), 0) * pass;  // the shared expert's chunk: its first row (else 0)
  return {begin + pb, min(count - pb, shared ? pass : INT_MAX)};
#else
  const int pb = std::max(slot - (num_active - 1), 0) * pass;
  return {begin + pb, std::min(count - pb, shared ? pass : INT_MAX)};
#endif
}

}  // namespace ds::moe::detail
