// MoE workspace layout: byte offsets of every internal buffer, a pure function of the set-up fields (sized
// before any launch, so a forward never allocates and can be captured in a CUDA graph).
#pragma once

#include <cstddef>

#include "kernels/moe/moe.h"

namespace ds::moe::detail {

// P = T*TOPK + (has_shared ? T : 0) permuted rows, G = EL + has_shared groups, all at T = max_tokens.
struct WorkspaceLayout {
  size_t logits = 0;      // f32 [T, E]             in-kernel routing
  size_t topk_ids = 0;    // i32 [T, TOPK]           when the caller passes no output buffer
  size_t topk_w = 0;      // f32 [T, TOPK]
  size_t e2p = 0;         // i32 [T*TOPK]
  size_t grp_begin = 0;   // i32 [G]
  size_t grp_count = 0;   // i32 [G]
  size_t active = 0;      // i32 [G]
  size_t num_active = 0;  // i32 [1]
  size_t tile_prefix = 0; // i32 [G + 1]
  size_t row_token = 0;   // i32 [P]
  size_t row_dest = 0;    // i32 [P]
  size_t qcounters = 0;   // i32 [G * I/128]
  size_t chunk_hist = 0;  // i32 [ceil(T*TOPK / 1024) * G]
  size_t fcounters = 0;   // i32 [min(T, 512), D/32]  fused decode finalize arrival counters
  size_t xq = 0;          // e4m3 [T, D]             quantised activations (FP8 / MXFP8)
  size_t xscale = 0;      // f32 [T, D/128] | e8m0 [T, D/32]
  size_t h = 0;           // bf16 | e4m3 [P, I]      down-projection input
  size_t hscale = 0;      // f32 [P, I/128] | e8m0 [P, I/32]
  size_t h32 = 0;         // f32 [P, I]              stream path staging for the fused quantisation
  size_t expert_out = 0;  // bf16 [T*TOPK, D]        fused finalize only
  size_t shared_out = 0;  // bf16 [T, D]             fused finalize with a shared expert
  size_t total = 0;
};

WorkspaceLayout workspace_layout(const MoeParams& p);

}  // namespace ds::moe::detail
