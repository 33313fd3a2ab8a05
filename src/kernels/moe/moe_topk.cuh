// The top-k of one token on one warp (the rules of moe_ref.h), shared by the top-k kernels (moe_route.cu) and the
// one-token MoE decode, which recomputes the routes in its prologues (moe_gemv.cu): the same function, the same bits.
#pragma once

#include <cfloat>
#include <climits>

#include "kernels/moe/moe_common.cuh"
#include "kernels/moe/moe_kernels.h"
#include "kernels/moe/moe_ref.h"

namespace ds::moe::detail {

// Grouped top-k of one token on one warp. Lane l holds experts e = 32 j + l. Rules of moe_ref.h: NaN ranks as
// -inf, equal scores go to the lower index (experts and groups), group score = top-2 sum (top-1 for one-expert
// groups), weights from s (or sb with hf_biased_weights), renormalised with +1e-20 in route order, then scaled.
__device__ __forceinline__ float rank_key(float s) { return isnan(s) ? -INFINITY : s; }
// (ka, ia) ranks before (kb, ib); ib == INT_MAX means "no candidate yet".
__device__ __forceinline__ bool ranks_before(float ka, int ia, float kb, int ib) {
  return ib == INT_MAX || ka > kb || (ka == kb && ia < ib);
}
// A rank key (never NaN) as an unsigned integer of the same order, equal keys equal (-0 as +0); above 0, so 0
// can stand for "no candidate".
__device__ __forceinline__ uint32_t order_key(float k) {
  const uint32_t u = __float_as_uint(k == 0.0f ? 0.0f : k);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The lane's bias values for experts 32 j + lane (0 past E or without a bias). A weight, not the previous kernel's
// output: the top-k kernel loads it before its PDL wait, so the DRAM round trip of a bias evicted since the last
// step overlaps the router GEMM instead of following it.
template <int J>
__device__ __forceinline__ void load_bias(const float* __restrict__ bias, int E, float (&b)[J]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < J; ++j) b[j] = (bias && 32 * j + lane < E) ? __ldg(bias + 32 * j + lane) : 0.0f;
}

// Ungrouped selection of rp.topk routes from the lane's J scores (s: unbiased, sb: biased, experts 32 j + lane),
// the rule of the scan in warp_topk (higher rank key first, then the lower expert), with a short chain per route:
// each lane first sorts its J candidates in registers (Batcher's network, 19 compare-exchanges for 8), then each
// route is the best of the 32 heads (two warp reductions) and the winner's lane pops its head. The scan instead
// walks all J candidates per route (~8 dependent compare/selects), which made the top-k kernel ~5 us
// (docs/perf-moe.md, run 6). Lane k gets route k (id, unscaled weight); `sum` adds the kept weights in route order.
template <int J>
__device__ __forceinline__ void sorted_select(const float (&s)[J], const float (&sb)[J], int E, const RouterParams& rp,
                                              int& my_id, float& my_w, float& sum) {
  const int lane = threadIdx.x % 32;
  uint32_t hk[J], ne[J];  // order key (0: no candidate) and ~expert (a larger value is a lower expert)
  float wv[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = 32 * j + lane;
    hk[j] = e < E ? order_key(rank_key(sb[j])) : 0u;
    ne[j] = e < E ? ~static_cast<uint32_t>(e) : 0u;
    wv[j] = rp.hf_biased_weights ? sb[j] : s[j];
  }
  auto cx = [&](int a, int b) {  // best first
    const bool swap = hk[b] > hk[a] || (hk[b] == hk[a] && ne[b] > ne[a]);
    const uint32_t ha = hk[a], na = ne[a];
    const float wa = wv[a];
    hk[a] = swap ? hk[b] : ha, ne[a] = swap ? ne[b] : na, wv[a] = swap ? wv[b] : wa;
    hk[b] = swap ? ha : hk[b], ne[b] = swap ? na : ne[b], wv[b] = swap ? wa : wv[b];
  };
  static_assert(J == 8, "the network below sorts 8");
  cx(0, 1), cx(2, 3), cx(4, 5), cx(6, 7);
  cx(0, 2), cx(1, 3), cx(4, 6), cx(5, 7);
  cx(1, 2), cx(5, 6);
  cx(0, 4), cx(1, 5), cx(2, 6), cx(3, 7);
  cx(2, 4), cx(3, 5);
  cx(1, 2), cx(3, 4), cx(5, 6);
  for (int k = 0; k < rp.topk; ++k) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, hk[0]);
    const uint32_t best = __reduce_max_sync(0xffffffffu, hk[0] == top ? ne[0] : 0u);
    const int win = top != 0u ? static_cast<int>(~best) : INT_MAX;
    const float ww = __shfl_sync(0xffffffffu, wv[0], win & 31);  // the winner's lane holds its weight
    if (win != INT_MAX && lane == (win & 31)) {  // pop the head
#pragma unroll
      for (int j = 0; j + 1 < J; ++j) hk[j] = hk[j + 1], ne[j] = ne[j + 1], wv[j] = wv[j + 1];
      hk[J - 1] = 0u, ne[J - 1] = 0u;
    }
    const float kept = win != INT_MAX ? ww : 0.0f;
    if (lane == k) my_id = win, my_w = kept;
    sum += kept;
  }
}

// Routes of the token whose E logits are `l`: lane k < rp.topk gets route k's expert id and final weight.
// J * 32 >= E; bv: load_bias's values. Grouped selection (topk_group < num_expert_group) needs this warp's shared
// scratch: E floats (sb_s), G floats (gs_s) and G bytes (kept_s); ungrouped routing never touches them (may be
// null).
// Where the logits are: shared memory, an earlier kernel's output (pdl::load_prior), or written by other blocks of
// the running kernel (read through L2).
enum class LogitsIn { kShared, kPrior, kL2 };
template <int J, LogitsIn kIn>
__device__ __forceinline__ void warp_topk(const float* l, const float (&bv)[J], const RouterParams& rp,
                                          float* sb_s, float* gs_s, uint8_t* kept_s, int& my_id, float& my_w) {
  const int lane = threadIdx.x % 32;
  const int E = rp.E, G = rp.num_expert_group, per = E / G;
  float s[J], sb[J];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = 32 * j + lane;
    if (e >= E) {
      s[j] = -INFINITY;
    } else if constexpr (kIn == LogitsIn::kL2) {
      s[j] = __ldcg(l + e);
    } else if constexpr (kIn == LogitsIn::kPrior) {
      s[j] = ::ds::pdl::load_prior(l + e);
    } else {
      s[j] = l[e];
    }
    m = fmaxf(m, s[j]);
  }
  if (rp.scoring == ScoringFunc::kSigmoid) {
#pragma unroll
    for (int j = 0; j < J; ++j) s[j] = 1.0f / (1.0f + expf(-s[j]));
  } else {
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      s[j] = 32 * j + lane < E ? expf(s[j] - m) : 0.0f;
      sum += s[j];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int j = 0; j < J; ++j) s[j] /= sum;
  }
#pragma unroll
  for (int j = 0; j < J; ++j) sb[j] = s[j] + bv[j];

  // Group selection (skipped for topk_group == G, e.g. Kimi-Linear's single group).
  const bool grouped = rp.topk_group < G;
  if (grouped) {
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (32 * j + lane < E) sb_s[32 * j + lane] = sb[j];
    __syncwarp();
    for (int g = lane; g < G; g += 32) {
      const float* v = sb_s + g * per;
      int b1 = 0;
      for (int e = 1; e < per; ++e)
        if (ranks_before(rank_key(v[e]), e, rank_key(v[b1]), b1)) b1 = e;
      float score = rank_key(v[b1]);
      if (per > 1) {
        float k2 = 0.0f;
        int b2 = INT_MAX;
        for (int e = 0; e < per; ++e)
          if (e != b1 && ranks_before(rank_key(v[e]), e, k2, b2)) { k2 = rank_key(v[e]); b2 = e; }
        score += k2;
      }
      gs_s[g] = score;
      kept_s[g] = 0;
    }
    __syncwarp();
    for (int i = 0; i < rp.topk_group; ++i) {
      float bk = 0.0f;
      int bg = INT_MAX;
      for (int g = lane; g < G; g += 32)
        if (!kept_s[g] && ranks_before(gs_s[g], g, bk, bg)) { bk = gs_s[g]; bg = g; }
      for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
        const int og = __shfl_xor_sync(0xffffffffu, bg, o);
        if (og != INT_MAX && ranks_before(ok, og, bk, bg)) { bk = ok; bg = og; }
      }
      if (lane == 0) kept_s[bg] = 1;
      __syncwarp();
    }
  }

  my_id = -1;
  my_w = 0.0f;
  float sum = 0.0f;  // the kept weights in route order, as the reference
  if constexpr (J == 8) {
    if (!grouped) {
      sorted_select<J>(s, sb, E, rp, my_id, my_w, sum);
      const float norm = rp.renormalize ? 1.0f / (sum + kRenormEps) : 1.0f;
      my_w = my_w * norm * rp.routed_scaling_factor;
      return;
    }
  }
  uint32_t taken = 0;
  for (int k = 0; k < rp.topk; ++k) {
    float bk = 0.0f, bw = 0.0f;
    int be = INT_MAX;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int e = 32 * j + lane;
      if (e < E && !(taken >> j & 1u) && (!grouped || kept_s[e / per])) {
        const float key = rank_key(sb[j]);
        if (ranks_before(key, e, bk, be)) {
          bk = key;
          be = e;
          bw = rp.hf_biased_weights ? sb[j] : s[j];
        }
      }
    }
    // The warp's winner under the same rule in two reductions: the highest key, then the lowest expert holding
    // it (five rounds of three shuffles before; top-k ran ~2 us per token at T = 1).
    const uint32_t key = be == INT_MAX ? 0u : order_key(bk);
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    const int win = __reduce_min_sync(0xffffffffu, be != INT_MAX && key == top ? be : INT_MAX);
    const float ww = __shfl_sync(0xffffffffu, bw, win & 31);  // the winner's lane holds its weight
    if (win != INT_MAX && lane == (win & 31)) taken |= 1u << (win >> 5);
    if (lane == k) {
      my_id = win;
      my_w = win != INT_MAX ? ww : 0.0f;
    }
  }
  for (int k = 0; k < rp.topk; ++k) sum += __shfl_sync(0xffffffffu, my_w, k);
  const float norm = rp.renormalize ? 1.0f / (sum + kRenormEps) : 1.0f;
  my_w = my_w * norm * rp.routed_scaling_factor;
}

}  // namespace ds::moe::detail
