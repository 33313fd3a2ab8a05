// MoE dispatch kernels: group the routes by local expert (stable order), build the per-expert offsets,
// expanded_to_permuted, the active-group list and the wgmma tile schedule, all on the device (graph-safe).
#include <algorithm>

#include "kernels/moe/moe_common.cuh"
#include "kernels/moe/moe_kernels.h"

namespace ds::moe::detail {
namespace {

// Exclusive scan over a 1024-thread block, one value per thread. `tmp` holds 32 ints of shared memory.
__device__ int block_exclusive_scan(int v, int* tmp, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) tmp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = tmp[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    tmp[lane] = w;
  }
  __syncthreads();
  const int ex = (warp > 0 ? tmp[warp - 1] : 0) + inc - v;
  *total = tmp[31];
  __syncthreads();
  return ex;
}

// From the per-expert counts in cnt[EL] (shared): group offsets, counts, active list, tile prefix; leaves each
// group's first row in cursor[EL]. 1024 threads, thread g owns expert g.
__device__ void finish_plan(const Plan& P, int tile_m, const int* cnt, int* cursor, int* tmp) {
  const int g = threadIdx.x, EL = P.EL;
  const int Ts = P.has_shared ? P.T : 0;
  const int c = g < EL ? cnt[g] : 0;
  int total;
  const int ex = block_exclusive_scan(c, tmp, &total);
  if (g < EL) {
    P.grp_begin[g] = Ts + ex;
    P.grp_count[g] = c;
    cursor[g] = Ts + ex;
  }
  const int tiles = tile_m > 0 ? (c + tile_m - 1) / tile_m : 0;
  int tiles_total;
  const int tex = block_exclusive_scan(tiles, tmp, &tiles_total);
  if (g < EL) P.tile_prefix[g] = tex;
  const int live = c > 0 ? 1 : 0;
  int live_total;
  const int lex = block_exclusive_scan(live, tmp, &live_total);
  if (live) P.active[lex] = g;
  if (g == 0) {
    int shared_tiles = 0;
    if (P.has_shared) {
      P.grp_begin[EL] = 0;
      P.grp_count[EL] = P.T;
      P.active[live_total] = EL;
      shared_tiles = tile_m > 0 ? (P.T + tile_m - 1) / tile_m : 0;
    }
    P.tile_prefix[EL] = tiles_total;
    if (P.has_shared) P.tile_prefix[EL + 1] = tiles_total + shared_tiles;
    *P.num_active = live_total + (P.has_shared ? 1 : 0);
  }
}

// Stable ranks of routes [r0, r1) by one warp, 32 at a time: routes of one expert get consecutive rows in
// ascending route order; routes outside the local range get e2p = -1.
__device__ void assign_rows(const Plan& P, const int32_t* ids, int r0, int r1, int* cursor) {
  const int lane = threadIdx.x % 32;
  for (int base = r0; base < r1; base += 32) {
    const int r = base + lane;
    const int e = r < r1 ? ids[r] - P.expert_begin : -1;
    const bool valid = r < r1 && static_cast<unsigned>(e) < static_cast<unsigned>(P.EL);
    const unsigned mask = __match_any_sync(0xffffffffu, valid ? e : -1 - lane);
    const int rank = __popc(mask & ((1u << lane) - 1u));
    const int p = valid ? cursor[e] + rank : -1;
    __syncwarp();
    if (valid && rank == 0) cursor[e] += __popc(mask);
    __syncwarp();
    if (r < r1) P.e2p[r] = p;
    if (valid) {
      P.row_token[p] = r / P.TOPK;
      P.row_dest[p] = r;
    }
  }
}

// Rows of the shared expert (token t at row t) and the quantisation counters, grid-stride over one block.
__device__ void plan_fixed_rows(const Plan& P, int num_qcounters, int worker, int workers) {
  if (P.has_shared)
    for (int t = worker; t < P.T; t += workers) {
      P.row_token[t] = t;
      P.row_dest[t] = -1 - t;
    }
  for (int i = worker; i < num_qcounters; i += workers) P.qcounters[i] = 0;
}

// Deferred finalize returns y[t, k] for every route: rows of dropped routes are zeros.
__device__ void zero_dropped_rows(const DispatchArgs& a, int r0, int r1, int worker, int workers) {
  const int per_row = a.D / 8;
  for (int64_t i = worker; i < static_cast<int64_t>(r1 - r0) * per_row; i += workers) {
    const int r = r0 + static_cast<int>(i / per_row);
    const int e = a.topk_ids[r] - a.plan.expert_begin;
    if (static_cast<unsigned>(e) < static_cast<unsigned>(a.plan.EL)) continue;
    reinterpret_cast<uint4*>(a.zero_dropped + static_cast<size_t>(r) * a.D)[i % per_row] = make_uint4(0, 0, 0, 0);
  }
}

// Decode: one CTA builds the whole plan; CTAs 1.. zero the rows of dropped routes (deferred mode only).
__global__ void __launch_bounds__(1024) dispatch_single_kernel(DispatchArgs a) {
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int R = P.T * P.TOPK;
  if (blockIdx.x > 0) {
    zero_dropped_rows(a, 0, R, (blockIdx.x - 1) * blockDim.x + threadIdx.x, (gridDim.x - 1) * blockDim.x);
    return;
  }
  __shared__ int cnt[kMaxExperts], cursor[kMaxExperts], tmp[32];
  for (int g = threadIdx.x; g < P.EL; g += blockDim.x) cnt[g] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const int e = a.topk_ids[r] - P.expert_begin;
    if (static_cast<unsigned>(e) < static_cast<unsigned>(P.EL)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  finish_plan(P, a.tile_m, cnt, cursor, tmp);
  __syncthreads();
  if (threadIdx.x < 32)
    assign_rows(P, a.topk_ids, 0, R, cursor);
  else
    plan_fixed_rows(P, a.num_qcounters, threadIdx.x - 32, blockDim.x - 32);
}

// Prefill, 1/3: per-chunk expert histograms (chunk_hist[c][g]).
__global__ void __launch_bounds__(256) dispatch_count_kernel(DispatchArgs a) {
  __shared__ int cnt[kMaxExperts];
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int R = P.T * P.TOPK, r0 = blockIdx.x * kDispatchChunk, r1 = min(R, r0 + kDispatchChunk);
  for (int g = threadIdx.x; g < P.EL; g += blockDim.x) cnt[g] = 0;
  __syncthreads();
  for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    const int e = a.topk_ids[r] - P.expert_begin;
    if (static_cast<unsigned>(e) < static_cast<unsigned>(P.EL)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int g = threadIdx.x; g < P.EL; g += blockDim.x) P.chunk_hist[static_cast<size_t>(blockIdx.x) * P.EL + g] = cnt[g];
}

// Prefill, 2/3: one CTA scans the histograms into per-chunk row bases and finishes the plan.
__global__ void __launch_bounds__(1024) dispatch_scan_kernel(DispatchArgs a, int nchunks) {
  __shared__ int cnt[kMaxExperts], cursor[kMaxExperts], tmp[32];
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int g = threadIdx.x;
  if (g < P.EL) {
    int run = 0;
    for (int c = 0; c < nchunks; ++c) {
      int* h = P.chunk_hist + static_cast<size_t>(c) * P.EL + g;
      const int v = *h;
      *h = run;
      run += v;
    }
    cnt[g] = run;
  }
  __syncthreads();
  finish_plan(P, a.tile_m, cnt, cursor, tmp);
  __syncthreads();
  if (g < P.EL)
    for (int c = 0; c < nchunks; ++c) P.chunk_hist[static_cast<size_t>(c) * P.EL + g] += cursor[g];
  plan_fixed_rows(P, a.num_qcounters, threadIdx.x, blockDim.x);
}

// Prefill, 3/3: each chunk's routes get their rows (one warp, in route order); all threads zero dropped rows.
__global__ void __launch_bounds__(256) dispatch_scatter_kernel(DispatchArgs a) {
  __shared__ int cursor[kMaxExperts];
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int R = P.T * P.TOPK, r0 = blockIdx.x * kDispatchChunk, r1 = min(R, r0 + kDispatchChunk);
  for (int g = threadIdx.x; g < P.EL; g += blockDim.x)
    cursor[g] = P.chunk_hist[static_cast<size_t>(blockIdx.x) * P.EL + g];
  __syncthreads();
  if (threadIdx.x < 32) assign_rows(P, a.topk_ids, r0, r1, cursor);
  if (a.zero_dropped) zero_dropped_rows(a, r0, r1, threadIdx.x, blockDim.x);
}

}  // namespace

void launch_dispatch(const DispatchArgs& a) {
  const int R = a.plan.T * a.plan.TOPK;
  if (R <= kSingleCtaMaxRoutes) {
    // Aux CTAs for zeroing: about 64 KB of rows each.
    const int aux = a.zero_dropped ? std::min(132, std::max(1, R * a.D * 2 / 65536)) : 0;
    launch(a.pdl, dispatch_single_kernel, 1 + aux, 1024, 0, a.stream, a);
    return;
  }
  const int nchunks = (R + kDispatchChunk - 1) / kDispatchChunk;
  launch(a.pdl, dispatch_count_kernel, nchunks, 256, 0, a.stream, a);
  launch(a.pdl, dispatch_scan_kernel, 1, 1024, 0, a.stream, a, nchunks);
  launch(a.pdl, dispatch_scatter_kernel, nchunks, 256, 0, a.stream, a);
}

}  // namespace ds::moe::detail
