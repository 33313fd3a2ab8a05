// Fused decode's per-CTA routing plan: a stream GEMM CTA derives its group, the group's first permuted row
// and its routes straight from topk_ids (R <= kFusedMaxRoutes), so no dispatch kernel (and no launch
// boundary) precedes GEMM1. Included only by moe_stream.cuh.
//
// The plan equals the dispatch kernels' (moe_plan.cu) by construction: groups are the local experts hit by at
// least one route in ascending id order, then the shared expert (rows [0, T)); a group's rows follow the
// shared rows and the rows of all lower experts; inside a group the routes keep their ascending route order.
#pragma once

#include "kernels/moe/moe_common.cuh"
#include "kernels/moe/moe_kernels.h"
#include "kernels/moe/moe_stream_rows.h"

namespace ds::moe::detail {

// CTAs (grid rows) of the stream GEMM that share the shared expert's T tokens, one pass of `pass` tokens each.
__host__ __device__ inline int stream_shared_chunks(const Plan& P, int pass) {
  return stream_shared_chunks(P.has_shared, P.T, pass);
}

struct SmallPlan {
  int g, rb, cnt;                    // group of this CTA (EL = shared), its first permuted row, its rows
  int route[kFusedMaxRoutes];        // routed group: route index t*TOPK+k of row rb + n, ascending
  int last[64];                      // fused finalize: token finalized by this CTA per row of a pass, or -1
  unsigned bits[kMaxExperts / 32];   // local experts hit by a route
  int warp_tot[32];
};

// Fills sp for grid row `slot`: the slot-th non-empty routed group, then the shared expert's chunks of `pass`
// tokens (stream_shared_chunks; sp.rb and sp.cnt are the chunk's rows); false (uniform over the CTA) when the
// slot has no group. Every thread of the CTA must call it.
__device__ inline bool small_plan(SmallPlan& sp, const Plan& P, const int32_t* ids, int slot, int pass) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const int R = P.T * P.TOPK;
  if (tid < kMaxExperts / 32) sp.bits[tid] = 0;
  __syncthreads();
  for (int r = tid; r < R; r += blockDim.x) {
    const int e = ids[r] - P.expert_begin;
    if (static_cast<unsigned>(e) < static_cast<unsigned>(P.EL)) atomicOr(&sp.bits[e / 32], 1u << (e % 32));
  }
  __syncthreads();
  if (warp == 0) {
    const unsigned w = sp.bits[lane];
    int inc = __popc(w);
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += n;
    }
    const int ex = inc - __popc(w), total = __shfl_sync(0xffffffffu, inc, 31);
    int mine = -1;
    if (slot >= ex && slot < inc) {  // the (slot - ex)-th set bit of w, counting from bit 0
      unsigned m = w;
      for (int i = ex; i < slot; ++i) m &= m - 1u;
      mine = lane * 32 + __ffs(m) - 1;
    }
    const unsigned owner = __ballot_sync(0xffffffffu, mine >= 0);
    int g = owner ? __shfl_sync(0xffffffffu, mine, __ffs(owner) - 1) : -1;
    if (!owner && P.has_shared && slot >= total && slot < total + stream_shared_chunks(P, pass)) g = P.EL;
    if (lane == 0) {
      sp.g = g;
      sp.rb = (slot - total) * pass;  // the shared expert's chunk (row t = token t)
    }
  }
  __syncthreads();
  const int g = sp.g;
  if (g < 0) return false;
  if (g == P.EL) {  // shared expert: row t = token t; this CTA's chunk
    if (tid == 0) sp.cnt = min(P.T - sp.rb, pass);
    __syncthreads();
    return true;
  }
  // Rows below the group (shared rows + routes of lower experts) and the group's routes in route order.
  int below = 0, base = 0;
  for (int r0 = 0; r0 < R; r0 += blockDim.x) {
    const int r = r0 + tid;
    const int e = r < R ? ids[r] - P.expert_begin : -1;
    const bool valid = r < R && static_cast<unsigned>(e) < static_cast<unsigned>(P.EL);
    below += __syncthreads_count(valid && e < g);
    const bool mine = valid && e == g;
    const unsigned m = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) sp.warp_tot[warp] = __popc(m);
    __syncthreads();
    int off = base, tot = 0;
    for (int w = 0; w < nwarps; ++w) {
      off += w < warp ? sp.warp_tot[w] : 0;
      tot += sp.warp_tot[w];
    }
    if (mine) sp.route[off + __popc(m & ((1u << lane) - 1u))] = r;
    base += tot;
    __syncthreads();  // warp_tot is rewritten by the next chunk
  }
  if (tid == 0) {
    sp.rb = (P.has_shared ? P.T : 0) + below;
    sp.cnt = base;
  }
  __syncthreads();
  return true;
}

}  // namespace ds::moe::detail
