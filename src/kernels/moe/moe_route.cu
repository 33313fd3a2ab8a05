// MoE routing kernels: router logits (bf16 mma, fp32 out), grouped top-k, activation quantisation, finalize.
#include <cfloat>
#include <climits>

#include <cooperative_groups.h>

#include "kernels/common/arrival.cuh"
#include "kernels/common/per_device.h"
#include "kernels/moe/moe_common.cuh"
#include "kernels/moe/moe_kernels.h"
#include "kernels/moe/moe_ref.h"
#include "kernels/norm/rmsnorm_row.cuh"

namespace ds::moe::detail {

namespace cg = cooperative_groups;

int device_sm_count() {
  int sms = 0;
  MOE_CUDA_CHECK(current_device_sms(sms));
  return sms;
}

namespace {

// ------------------------------------------------------------------------------------------------ logits
// logits[T, E] = x[T, D] . W[E, D]^T in fp32 (bf16 products are exact in fp32, as HF's x.float() @ W.float()).
// A CTA computes (16*MT tokens) x (8*NT experts); its 8 warps split D in 32-wide chunks (round robin) and are
// reduced in a fixed order (deterministic logits -> deterministic routing). Fragments come straight from
// global memory with the K order permuted identically on both operands: lane (r = l/4, c = l%4) loads 8
// consecutive k of its row at 8c, which serve the mma k-slots {2c, 2c+1, 2c+8, 2c+9} of two k16 steps.
// Every (token, expert) sum takes the same chunks in the same order whatever the tile shape, so a token's
// logits (and routes) do not depend on how many tokens share the call.
//
// Decode (kPrefetch > 0): the router weights do not depend on the previous kernel, so each warp issues its
// first kPrefetch chunks of W before waiting for x, all at once, instead of one chunk per round trip (routing at
// T = 1 on the H200: 9.4 -> 8.0 us, of which the top-k kernel is 5.2; docs/perf-moe.md run 4).
constexpr int kLogitWarps = 8;

// The CTA's tile of tokens [tok0, tok0 + 16 MT) x experts [e0, e0 + 8 NT); every value with t < T and e < E goes
// to store(t, e, value) from warp 0. `red`: [kLogitWarps][MT * NT * 4][32] floats of shared memory.
// The general form: after the PDL wait `prologue()` runs (every thread), and A's 16-byte chunks come from
// load_a(token row, element offset) instead of x in global memory (the pre-norm router reads its own normed row
// from shared memory).
template <int MT, int NT, int kPrefetch, class Store, class Prologue, class LoadA>
__device__ __forceinline__ void logits_tile_src(const bf16_t* __restrict__ w, int T, int D, int E, int tok0, int e0,
                                                float (*red)[MT * NT * 4][32], Store&& store, Prologue&& prologue,
                                                LoadA&& load_a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, c = lane % 4;
  const int nch = D / 32;
  const bf16_t* brow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) brow[nt] = w + static_cast<size_t>(min(e0 + nt * 8 + r, E - 1)) * D + 8 * c;
  uint4 bp[kPrefetch > 0 ? kPrefetch : 1][NT];
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      if (warp + i * kLogitWarps < nch) bp[i][nt] = ld_stream(brow[nt] + (warp + i * kLogitWarps) * 32);
  pdl_wait();
  pdl_trigger();
  prologue();
  int arow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) arow[mt][h] = min(tok0 + mt * 16 + h * 8 + r, T - 1);
  float acc[MT][NT][4] = {};
  auto step = [&](int ch, const uint4 (&b)[NT]) {
    uint4 a[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) a[mt][h] = load_a(arow[mt][h], ch * 32 + 8 * c);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_bf16(acc[mt][nt], a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b[nt].x, b[nt].y);
        mma_bf16(acc[mt][nt], a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w, b[nt].z, b[nt].w);
      }
  };
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i)
    if (warp + i * kLogitWarps < nch) step(warp + i * kLogitWarps, bp[i]);
  for (int ch = warp + kPrefetch * kLogitWarps; ch < nch; ch += kLogitWarps) {
    uint4 b[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) b[nt] = ld_stream(brow[nt] + ch * 32);
    step(ch, b);
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][(mt * NT + nt) * 4 + i][lane] = acc[mt][nt][i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float s = 0.0f;
        for (int wi = 0; wi < kLogitWarps; ++wi) s += red[wi][(mt * NT + nt) * 4 + i][lane];
        const int t = tok0 + mt * 16 + r + (i >= 2 ? 8 : 0), e = e0 + nt * 8 + 2 * c + (i & 1);
        if (t < T && e < E) store(t, e, s);
      }
}

template <int MT, int NT, int kPrefetch, class Store>
__device__ __forceinline__ void logits_tile(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int T,
                                            int D, int E, int tok0, int e0, float (*red)[MT * NT * 4][32],
                                            Store&& store) {
  logits_tile_src<MT, NT, kPrefetch>(
      w, T, D, E, tok0, e0, red, store, [] {},
      [&](int t, int k) { return ld_act(x + static_cast<size_t>(t) * D + k); });
}

// The one-token router with the layer boundary before it (MoeParams::pre_norm_w): after the PDL wait every CTA
// computes bf16(residual + add) and its RMSNorm in norm::add_rmsnorm's row code (the same bits) into shared
// memory and routes from there; CTA 0 also stores the new residual and the normed row (x, read by `up`). One
// launch (the norm kernel's) less per MoE layer. The new residual goes to another buffer (residual_out): every
// CTA reads the old one, and none may see it half updated.
__global__ void __launch_bounds__(256) router_prenorm_kernel(const bf16_t* __restrict__ w, int D, int E,
                                                            float* __restrict__ logits, PreNormArgs pn) {
  __shared__ float red[kLogitWarps][4][32];
  __shared__ float part[32];
  extern __shared__ uint4 xs[];  // the normed row, D / 8 chunks
  const bool writer = blockIdx.x == 0;
  auto prologue = [&] {
    const uint4* ar = reinterpret_cast<const uint4*>(pn.add);
    const uint4* rin = reinterpret_cast<const uint4*>(pn.residual);
    auto load = [&](int i) { return norm::dev::add8(__ldcg(ar + i), __ldcg(rin + i)); };  // the new residual
    norm::dev::rmsnorm_row(load, reinterpret_cast<const __nv_bfloat16*>(pn.norm_w),
                           reinterpret_cast<__nv_bfloat16*>(xs), D, pn.eps, part);
    __syncthreads();  // xs is complete for every warp
    if (writer)
      for (int i = threadIdx.x; i < D / 8; i += blockDim.x) {
        reinterpret_cast<uint4*>(pn.out)[i] = xs[i];
        reinterpret_cast<uint4*>(pn.residual_out)[i] = load(i);  // recomputed: the bits the norm used
      }
  };
  logits_tile_src<1, 1, 12>(
      w, 1, D, E, 0, blockIdx.x * 8, red, [&](int, int e, float v) { logits[e] = v; }, prologue,
      [&](int, int k) { return xs[k / 8]; });
}

template <int MT, int NT, int kPrefetch>
__global__ void __launch_bounds__(256) router_logits_kernel(const bf16_t* __restrict__ x,
                                                            const bf16_t* __restrict__ w, int T, int D, int E,
                                                            float* __restrict__ logits) {
  __shared__ float red[kLogitWarps][MT * NT * 4][32];
  logits_tile<MT, NT, kPrefetch>(x, w, T, D, E, blockIdx.y * 16 * MT, blockIdx.x * 8 * NT, red,
                                 [&](int t, int e, float v) { logits[static_cast<size_t>(t) * E + e] = v; });
}

// ------------------------------------------------------------------------------------------------ top-k
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

// One warp per token. The grouped selection's scratch is dynamic shared memory, asked for only when the routing
// is grouped: the kernel otherwise needs none, like its neighbours in the decode chain (36 KB of static scratch
// made the one-token top-k cost 5.2 us on the H200, most of it outside the selection).
constexpr int kTopkWarps = 4;
constexpr size_t kTopkScratch = kMaxExperts * (2 * sizeof(float) + 1);  // per warp: sb_s, gs_s, kept_s

template <int J>
__global__ void __launch_bounds__(kTopkWarps * 32) topk_kernel(const float* __restrict__ logits,
                                                              const float* __restrict__ bias, int T,
                                                              RouterParams rp, int32_t* __restrict__ ids,
                                                              float* __restrict__ weights) {
  extern __shared__ float scratch[];  // grouped routing only: [kTopkWarps][sb_s | gs_s | kept_s]
  float bv[J];
  load_bias(bias, rp.E, bv);
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kTopkWarps + warp;
  if (t >= T) return;
  float* sb_s = scratch + warp * (kTopkScratch / sizeof(float) + 1);
  float* gs_s = sb_s + kMaxExperts;
  auto* kept_s = reinterpret_cast<uint8_t*>(gs_s + kMaxExperts);
  int my_id;
  float my_w;
  warp_topk<J, LogitsIn::kPrior>(logits + static_cast<size_t>(t) * rp.E, bv, rp, sb_s, gs_s, kept_s, my_id, my_w);
  if (lane < rp.topk) {
    ids[static_cast<size_t>(t) * rp.topk + lane] = my_id;
    weights[static_cast<size_t>(t) * rp.topk + lane] = my_w;
  }
}

// ------------------------------------------------------------------------------------------------ fused route
// Decode routing in one kernel (MoeParams / RouteParams::route_counter): the decode router GEMM's CTAs as
// router_logits_kernel<1, 1, 12> (E/8 of them, the same tiles: the same logits), each arriving on a counter once
// its logits are stored; the last to arrive runs topk_kernel's selection for the T tokens, a warp per token,
// from the logits in L2. The same logits through the same selection give the same routes, and the top-k's own
// launch and its wait for the GEMM's completion (~3 us on the H200) go. The cluster kernel below gathers the
// logits in one CTA instead, but it streams the router weights on 8 SMs only.
constexpr int kFusedRouteMaxTokens = 16;  // one m16 tile: the decode GEMM's grid has a single row of CTAs

__global__ void __launch_bounds__(256) route_fused_kernel(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                                         const float* __restrict__ bias, int T, int D, RouterParams rp,
                                                         float* __restrict__ logits, int32_t* __restrict__ ids,
                                                         float* __restrict__ weights, int32_t* __restrict__ counter) {
  __shared__ float red[kLogitWarps][4][32];
  constexpr int J = 8;  // E <= 256
  float bv[J];
  load_bias(bias, rp.E, bv);  // a weight: before the wait inside logits_tile
  logits_tile<1, 1, 12>(x, w, T, D, rp.E, 0, blockIdx.x * 8, red,
                        [&](int t, int e, float v) { logits[static_cast<size_t>(t) * rp.E + e] = v; });
  if (!arrival::last_to_arrive(counter, static_cast<int>(gridDim.x))) return;  // after warp 0's logits
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < T; t += kLogitWarps) {
    int my_id;
    float my_w;
    warp_topk<J, LogitsIn::kL2>(logits + static_cast<size_t>(t) * rp.E, bv, rp, nullptr, nullptr, nullptr, my_id, my_w);
    if (lane < rp.topk) {
      ids[static_cast<size_t>(t) * rp.topk + lane] = my_id;
      weights[static_cast<size_t>(t) * rp.topk + lane] = my_w;
    }
  }
}

// ------------------------------------------------------------------------------------------------ cluster route
// Decode routing in one kernel (T <= 16, E <= 256; RouteParams::cluster / MoeParams::cluster_route): a cluster of
// 8 CTAs, CTA c computing the logits of experts [32 c, 32 c + 32) for every token with the tile code above (the
// same bits as the two-kernel path), kept in its shared memory. After a cluster barrier CTA 0 gathers all E
// logits over distributed shared memory and runs the top-k of warp_topk for the T tokens: no kernel boundary and
// no global round trip between the router GEMM and the selection. (The two-kernel path pays 5.2 us for its
// top-k kernel alone at every T <= 64 on the H200, docs/perf-moe.md run 4.)
constexpr int kClusterCtas = 8, kClusterExperts = 32;  // NT = 4 n8-tiles per CTA
constexpr int kClusterMaxTokens = 16;                  // one m16 tile

__global__ void __launch_bounds__(256, 1) route_cluster_kernel(const bf16_t* __restrict__ x,
                                                               const bf16_t* __restrict__ w,
                                                               const float* __restrict__ bias, int T, int D,
                                                               RouterParams rp, float* __restrict__ logits,
                                                               int32_t* __restrict__ ids,
                                                               float* __restrict__ weights) {
  __shared__ float red[kLogitWarps][16][32];  // the tile's warp partials; in CTA 0 then all logits [16][256]
  __shared__ float mine[kClusterMaxTokens][kClusterExperts];
  __shared__ float scratch[kLogitWarps][2 * kClusterCtas * kClusterExperts + 64];  // grouped: sb_s, gs_s, kept_s
  cg::cluster_group cluster = cg::this_cluster();
  const int cta = static_cast<int>(cluster.block_rank()), E = rp.E;
  logits_tile<1, 4, 9>(x, w, T, D, E, 0, cta * kClusterExperts, red, [&](int t, int e, float v) {
    logits[static_cast<size_t>(t) * E + e] = v;
    mine[t][e - cta * kClusterExperts] = v;
  });
  cluster.sync();  // every CTA's logits are in its shared memory (release / acquire across the cluster)
  constexpr int kAll = kClusterCtas * kClusterExperts;
  float* all = &red[0][0][0];
  if (cta == 0)
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) {
      const int t = i / E, e = i % E;
      const float* src = cluster.map_shared_rank(&mine[0][0], e / kClusterExperts);
      all[t * kAll + e] = src[t * kClusterExperts + e % kClusterExperts];
    }
  cluster.sync();  // CTA 0 read every peer's logits: they may exit
  if (cta != 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sb_s = scratch[warp];
  float* gs_s = sb_s + kAll;
  auto* kept_s = reinterpret_cast<uint8_t*>(gs_s + kAll);
  float bv[kAll / 32];  // the same for every token
  load_bias(bias, E, bv);
  for (int t = warp; t < T; t += kLogitWarps) {
    int my_id;
    float my_w;
    warp_topk<kAll / 32, LogitsIn::kShared>(all + t * kAll, bv, rp, sb_s, gs_s, kept_s, my_id, my_w);
    if (lane < rp.topk) {
      ids[static_cast<size_t>(t) * rp.topk + lane] = my_id;
      weights[static_cast<size_t>(t) * rp.topk + lane] = my_w;
    }
    __syncwarp();  // the scratch is reused by the warp's next token
  }
}

// ------------------------------------------------------------------------------------------------ act quant
// One thread per 8 consecutive values of a row; FP8 block: 16 threads per 128-value block, MXFP8: 4 per 32.
// Mirrors moe_quant_ref.cpp exactly: scale = amax / 448 (1 if amax == 0), q = e4m3(v / scale); MX: e8m0
// code from mx_scale_code, q = e4m3(v * 2^-p).
template <bool kMx>
__global__ void __launch_bounds__(256) act_quant_kernel(const bf16_t* __restrict__ x, int D,
                                                        uint8_t* __restrict__ q, void* __restrict__ scale,
                                                        int32_t* zero, int nzero) {
  pdl_wait();
  pdl_trigger();
  for (int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < nzero;
       i += gridDim.x * gridDim.y * blockDim.x)
    zero[i] = 0;
  const int t = blockIdx.y;
  const int i8 = blockIdx.x * blockDim.x + threadIdx.x;  // index of this thread's 8 values
  const bool live = i8 * 8 < D;                           // D % 128 == 0: whole blocks are live or not
  const uint4 v = live ? ld_act(x + static_cast<size_t>(t) * D + i8 * 8) : make_uint4(0, 0, 0, 0);
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_lo(word(v, i));
    f[2 * i + 1] = bf16_hi(word(v, i));
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
  amax = warp_max(amax, kMx ? 4 : 16);
  if (!live) return;
  uint32_t packed[2] = {0, 0};
  if constexpr (kMx) {
    const uint32_t code = mx_scale_code(amax, false);
    const float inv = pow2f(127 - static_cast<int>(code));
#pragma unroll
    for (int i = 0; i < 8; ++i) packed[i / 4] |= static_cast<uint32_t>(f32_to_e4m3_sat(f[i] * inv)) << (8 * (i % 4));
    if (threadIdx.x % 4 == 0) static_cast<uint8_t*>(scale)[static_cast<size_t>(t) * (D / 32) + i8 / 4] = code;
  } else {
    const float sc = amax > 0.0f ? amax / kE4M3MaxF : 1.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) packed[i / 4] |= static_cast<uint32_t>(f32_to_e4m3_sat(f[i] / sc)) << (8 * (i % 4));
    if (threadIdx.x % 16 == 0) static_cast<float*>(scale)[static_cast<size_t>(t) * (D / 128) + i8 / 16] = sc;
  }
  *reinterpret_cast<uint2*>(q + static_cast<size_t>(t) * D + i8 * 8) = make_uint2(packed[0], packed[1]);
}

// ------------------------------------------------------------------------------------------------ finalize
// out[t] = sum_k w[t,k] y[t,k] (routes with e2p < 0 skipped) + shared[t] + residual[t]; fp32, bf16 out.
__global__ void __launch_bounds__(256) finalize_kernel(const bf16_t* __restrict__ y, const int32_t* __restrict__ e2p,
                                                       const float* __restrict__ w, const bf16_t* __restrict__ shared,
                                                       const bf16_t* residual, int K, int D, bf16_t* out) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  for (int c8 = threadIdx.x; c8 < D / 8; c8 += blockDim.x) finalize8<false>(y, e2p, w, shared, residual, t, K, D, c8 * 8, out);
}

}  // namespace

void launch_router_logits(const bf16_t* x, const bf16_t* w, int T, int D, int E, float* logits, cudaStream_t s,
                          bool pdl) {
  // Decode: 16-token x 8-expert tiles, E/8 CTAs that each stream 8 rows of W once, 12 chunks per warp in
  // flight before the wait (all of D <= 3072); prefill: 32x32 tiles halve the L2 re-reads of x and W.
  if (T <= 16) {
    const dim3 grid((E + 7) / 8, (T + 15) / 16);
    launch(pdl, router_logits_kernel<1, 1, 12>, grid, 256, 0, s, x, w, T, D, E, logits);
  } else {
    const dim3 grid((E + 31) / 32, (T + 31) / 32);
    launch(pdl, router_logits_kernel<2, 4, 0>, grid, 256, 0, s, x, w, T, D, E, logits);
  }
}

void launch_topk(const float* logits, const float* bias, int T, const RouterParams& r, int32_t* ids, float* w,
                 cudaStream_t s, bool pdl) {
  const int grid = (T + kTopkWarps - 1) / kTopkWarps;
  const size_t smem = r.topk_group < r.num_expert_group ? kTopkWarps * (kTopkScratch + sizeof(float)) : 0;
  if (r.E <= 256)
    launch(pdl, topk_kernel<8>, grid, kTopkWarps * 32, smem, s, logits, bias, T, r, ids, w);
  else
    launch(pdl, topk_kernel<32>, grid, kTopkWarps * 32, smem, s, logits, bias, T, r, ids, w);
}

void launch_router_prenorm(const bf16_t* w, int D, int E, float* logits, const PreNormArgs& pn, cudaStream_t s,
                           bool pdl) {
  launch(pdl, router_prenorm_kernel, dim3((E + 7) / 8), 256, static_cast<size_t>(D) * 2, s, w, D, E, logits, pn);
}

bool route_fused_applies(int T, const RouterParams& r) {
  return T >= 1 && T <= kFusedRouteMaxTokens && r.E <= 256 && r.topk_group >= r.num_expert_group;
}

void launch_route_fused(const bf16_t* x, const bf16_t* w, const float* bias, int T, int D, const RouterParams& r,
                        float* logits, int32_t* ids, float* weights, int32_t* counter, cudaStream_t s, bool pdl) {
  launch(pdl, route_fused_kernel, dim3((r.E + 7) / 8), 256, 0, s, x, w, bias, T, D, r, logits, ids, weights, counter);
}

bool route_cluster_applies(int T, const RouterParams& r) {
  return T >= 1 && T <= kClusterMaxTokens && r.E <= kClusterCtas * kClusterExperts;
}

void launch_route_cluster(const bf16_t* x, const bf16_t* w, const float* bias, int T, int D, const RouterParams& r,
                          float* logits, int32_t* ids, float* weights, cudaStream_t s, bool pdl) {
  MOE_CUDA_CHECK(pdl::launch_cluster(kClusterCtas, pdl, route_cluster_kernel, dim3(kClusterCtas), dim3(256), 0, s, x,
                                     w, bias, T, D, r, logits, ids, weights));
}

void launch_act_quant(const bf16_t* x, int T, int D, ActFormat f, void* q, void* scale, cudaStream_t s, bool pdl,
                      int32_t* zero, int nzero) {
  const dim3 grid((D / 8 + 255) / 256, T);
  if (f == ActFormat::kMXFP8)
    launch(pdl, act_quant_kernel<true>, grid, 256, 0, s, x, D, static_cast<uint8_t*>(q), scale, zero, nzero);
  else
    launch(pdl, act_quant_kernel<false>, grid, 256, 0, s, x, D, static_cast<uint8_t*>(q), scale, zero, nzero);
}

void launch_finalize(const bf16_t* expert_out, const int32_t* e2p, const float* w, const bf16_t* shared,
                     const bf16_t* residual, int T, int TOPK, int D, bf16_t* out, cudaStream_t s, bool pdl) {
  const int threads = D / 8 < 256 ? ((D / 8 + 31) / 32) * 32 : 256;
  launch(pdl, finalize_kernel, T, threads, 0, s, expert_out, e2p, w, shared, residual, TOPK, D, out);
}

}  // namespace ds::moe::detail
