// One token's routing on one warp (the rules of moe_ref.h): used by the top-k kernel, the cluster routing kernel
// and the one-token gemv decode's fused routing (moe_gemv.cu), so every path selects the same experts with the
// same weights, bit for bit.
#pragma once

#include <climits>

#include "kernels/moe/moe_common.cuh"
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

// Routes of the token whose E logits are `l`: lane k < rp.topk gets route k's expert id and final weight.
// J * 32 >= E. Grouped selection (topk_group < num_expert_group) needs this warp's shared scratch: E floats
// (sb_s), G floats (gs_s) and G bytes (kept_s); ungrouped routing never touches them (may be null).
template <int J>
__device__ __forceinline__ void warp_topk(const float* l, const float* __restrict__ bias, const RouterParams& rp,
                                          float* sb_s, float* gs_s, uint8_t* kept_s, int& my_id, float& my_w) {
  const int lane = threadIdx.x % 32;
  const int E = rp.E, G = rp.num_expert_group, per = E / G;
  float s[J], sb[J];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = 32 * j + lane;
    s[j] = e < E ? l[e] : -INFINITY;
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
  for (int j = 0; j < J; ++j) {
    const int e = 32 * j + lane;
    sb[j] = s[j] + ((bias && e < E) ? bias[e] : 0.0f);
  }

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

  uint32_t taken = 0;
  my_id = -1;
  my_w = 0.0f;
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
  float sum = 0.0f;  // route order, as the reference
  for (int k = 0; k < rp.topk; ++k) sum += __shfl_sync(0xffffffffu, my_w, k);
  const float norm = rp.renormalize ? 1.0f / (sum + kRenormEps) : 1.0f;
  my_w = my_w * norm * rp.routed_scaling_factor;
}

}  // namespace ds::moe::detail
