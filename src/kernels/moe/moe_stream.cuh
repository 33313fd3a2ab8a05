// Streaming expert GEMM (decode path): one CTA per (non-empty group, tile of weight rows) reads its rows once
// with 16-byte loads while all tokens of the group ride along as the mma's n = 8 side; fp32 accumulation. The
// shared expert's T tokens are split into passes of 8 x NT tokens, each on CTAs of its own (grid rows after the
// routed groups), so a large T does not leave one CTA per row tile looping over its passes at the launch's end.
// GEMM1 fuses SwiGLU and the quantisation of h; GEMM2 writes y[t, k] rows. Included by moe_stream_*.cu.
#pragma once

#include "kernels/moe/moe_kernels.h"
#include "kernels/moe/moe_stream_formats.cuh"
#include "kernels/moe/moe_stream_plan.cuh"

namespace ds::moe::detail {

// CTA = 8 warps: 2 row tiles of 16 weight rows x 4-way K split. GEMM1 row tile = 8 gate + 8 up rows of the
// same 8 columns of h (so SwiGLU is thread-local): a CTA covers 16 columns of h, I/16 CTAs per group
// (64 at I = 1024: 576 CTAs for 9 groups of a decode step). GEMM2: 32 rows of D per CTA (72 at D = 2304).
inline constexpr int kStreamRowTiles = 2;
inline constexpr int kStreamKSplit = 4;
inline constexpr int kStreamThreads = 32 * kStreamRowTiles * kStreamKSplit;
inline constexpr int kStreamHCols = 8 * kStreamRowTiles;  // h columns per GEMM1 CTA
static_assert(16 * kStreamRowTiles == kFinalizeCols, "GEMM2 CTAs cover kFinalizeCols columns of D");

template <class F>
__device__ __forceinline__ size_t weight_row_bytes(int K) {
  return F::kW == WeightFormat::kMXFP4 || F::kW == WeightFormat::kNVFP4 ? K / 2
         : F::kW == WeightFormat::kBF16                                  ? K * 2
                                                                         : K;
}
// Scale row of weight row n of expert e in a matrix with N rows and K columns.
template <class F>
__device__ __forceinline__ const uint8_t* weight_scale_row(const void* base, int e, int n, int N, int K) {
  const auto* b = static_cast<const uint8_t*>(base);
  if constexpr (F::kW == WeightFormat::kFP8Block)
    return b + ((static_cast<size_t>(e) * (N / 128) + n / 128) * (K / 128)) * 4;
  else if constexpr (F::kW == WeightFormat::kNVFP4)
    return b + (static_cast<size_t>(e) * N + n) * (K / 16);
  else
    return b + (static_cast<size_t>(e) * N + n) * (K / 32);  // MX (unused for bf16)
}

// Quantises h32 rows [rb, rb + cnt) x columns [c0, c0 + 128) into the down GEMM's input format (one warp per
// row; the same arithmetic as act_quant_kernel and moe_quant_ref).
template <ActFormat kAct>
__device__ void quantize_h_block(const GemmArgs& a, int rb, int cnt, int c0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, I = a.I;
  for (int n = warp; n < cnt; n += kStreamThreads / 32) {
    const size_t row = static_cast<size_t>(rb + n);
    const float4 v = __ldcg(reinterpret_cast<const float4*>(a.h32 + row * I + c0) + lane);
    const float f[4] = {v.x, v.y, v.z, v.w};
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    uint32_t packed = 0;
    if constexpr (kAct == ActFormat::kMXFP8) {
      amax = warp_max(amax, 8);
      const uint32_t code = mx_scale_code(amax, false);
      const float inv = pow2f(127 - static_cast<int>(code));
#pragma unroll
      for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(f32_to_e4m3_sat(f[i] * inv)) << (8 * i);
      if (lane % 8 == 0) static_cast<uint8_t*>(a.h_scale)[row * (I / 32) + c0 / 32 + lane / 8] = code;
    } else {
      amax = warp_max(amax);
      const float sc = amax > 0.0f ? amax / kE4M3MaxF : 1.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(f32_to_e4m3_sat(f[i] / sc)) << (8 * i);
      if (lane == 0) static_cast<float*>(a.h_scale)[row * (I / 128) + c0 / 128] = sc;
    }
    reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(a.h) + row * I + c0)[lane] = packed;
  }
}

// Fused decode, GEMM1, every CTA before it looks at its group (grid-stride over the whole grid): e2p = -1 for
// dropped routes, zero rows of dropped routes in the deferred expert_out, zero finalize counters (GEMM2 uses
// them after its PDL wait, i.e. after GEMM1 completed), and the finalize of tokens no GEMM2 row reaches (every
// route dropped, no shared expert): out = residual (or 0), as finalize_kernel writes it.
__device__ inline void fused_side_work(const GemmArgs& a) {
  const Plan& P = a.plan;
  const int R = P.T * P.TOPK;
  const int i0 = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const int stride = gridDim.x * gridDim.y * blockDim.x;
  auto dropped = [&](int r) {
    return static_cast<unsigned>(a.topk_ids[r] - P.expert_begin) >= static_cast<unsigned>(P.EL);
  };
  for (int r = i0; r < R; r += stride)
    if (dropped(r)) P.e2p[r] = -1;
  if (a.out) {
    for (int i = i0; i < P.T * (a.D / kFinalizeCols); i += stride) a.fcounters[i] = 0;
    if (!P.has_shared)
      for (int i = i0; i < P.T * (a.D / 8); i += stride) {
        const int t = i / (a.D / 8);
        bool any = false;
        for (int k = 0; k < P.TOPK; ++k) any = any || !dropped(t * P.TOPK + k);
        if (!any) finalize8<false>(nullptr, nullptr, nullptr, nullptr, a.residual, t, 0, a.D, (i % (a.D / 8)) * 8, a.out);
      }
  }
  if (a.zero_dropped) {
    const int per_row = a.D / 8;
    for (int i = i0; i < R * per_row; i += stride)
      if (dropped(i / per_row))
        reinterpret_cast<uint4*>(a.zero_dropped + static_cast<size_t>(i / per_row) * a.D)[i % per_row] =
            make_uint4(0, 0, 0, 0);
  }
}

// Fused finalize after one pass of GEMM2 rows [c0, c0 + rows) of the CTA's group: each row arrives at its
// token's counter for this CTA's 32 columns; the CTA that brings the last of a token's (live routes +
// shared) rows finalizes those columns (finalize8, the finalize kernel's arithmetic). The y and shared rows
// of the other CTAs are visible: each writer fences before its CTA arrives, the reader fences after.
__device__ inline void fused_finalize_pass(const GemmArgs& a, SmallPlan& sp, bool is_shared, int c0, int rows) {
  const Plan& P = a.plan;
  const int tid = threadIdx.x;
  __threadfence();
  __syncthreads();
  if (tid < rows) {
    const int n = c0 + tid;
    const int tok = is_shared ? sp.rb + n : sp.route[n] / P.TOPK;  // shared: rows of its chunk
    int expect = P.has_shared ? 1 : 0;
    for (int k = 0; k < P.TOPK; ++k)
      expect += static_cast<unsigned>(a.topk_ids[tok * P.TOPK + k] - P.expert_begin) < static_cast<unsigned>(P.EL);
    const int prev = atomicAdd(&a.fcounters[tok * (a.D / kFinalizeCols) + blockIdx.x], 1);
    sp.last[tid] = prev == expect - 1 ? tok : -1;
  }
  __syncthreads();
  __threadfence();
  constexpr int kPerRow = kFinalizeCols / 8;
  for (int i = tid / kPerRow; i < rows; i += kStreamThreads / kPerRow) {
    const int tok = sp.last[i];
    if (tok >= 0)
      finalize8<true>(a.expert_out, P.e2p, a.topk_w, P.has_shared ? a.shared_out : nullptr, a.residual, tok, P.TOPK,
                      a.D, blockIdx.x * kFinalizeCols + (tid % kPerRow) * 8, a.out);
  }
}

// CTAs per SM the register allocation must allow (ptxas caps registers at 65536 / (256 * n)). Two CTAs per SM
// double the weight bytes in flight of a latency-bound stream; asked for where ptxas then spills at most a few
// registers (<= 12 bytes a thread): bf16 and FP8 up to 4 token tiles, and bf16 GEMM1 at 8 (20 bytes stored, 176
// loaded; never the rule's pick), where ptxas chose 128 registers on its own before. MXFP8, MXFP4 and NVFP4 up to
// 2 tiles (the FP4 formats with half their K-units in flight per lane there: the same bytes per SM, twice the
// warps for their dequantisation; only NVFP4 / bf16 GEMM2 spills, 4 bytes). docs/perf-moe.md runs 18 and 20.
template <class F, int NT, bool kGemm1>
constexpr int stream_min_ctas() {
  if constexpr (F::kW == WeightFormat::kBF16) return kGemm1 || NT <= 4 ? 2 : 1;
  if constexpr (F::kW == WeightFormat::kFP8Block) return NT <= 2 || (NT == 4 && kGemm1) ? 2 : 1;
  return NT <= 2 ? 2 : 1;
}

template <class F, int NT, bool kGemm1>
__global__ void __launch_bounds__(kStreamThreads, (stream_min_ctas<F, NT, kGemm1>()))
    stream_gemm_kernel(const GemmArgs a) {
  // GEMM1 needs the plan of its predecessor (the dispatch) before anything else. GEMM2's predecessor is GEMM1
  // (h); the plan is two kernels back, complete before GEMM1 passed its own wait, so GEMM2 reads it and starts
  // streaming its first weights while GEMM1 drains (with PDL), and waits only before touching h.
  // Fused decode: the plan comes from topk_ids (small_plan), which are complete before GEMM1 passed its wait.
  if constexpr (kGemm1) {
    pdl_wait();
    pdl_trigger();
  }
  const Plan& P = a.plan;
  constexpr int kPass = 8 * NT;  // tokens per pass
  // The shared expert sees all T tokens: its passes run on stream_shared_chunks grid rows side by side (one pass
  // each, its weights re-read from L2), not one after another on one CTA, which made it the launch's tail. The
  // chunk narrows rb and cnt (small_plan; stream_slot_rows), so the pass loop is the same for every CTA.
  __shared__ SmallPlan sp;
  int g, rb, cnt;  // group, its first permuted row and rows (the shared expert: its chunk's)
  if (a.fused) {
    if constexpr (kGemm1) fused_side_work(a);
    if (!small_plan(sp, P, a.topk_ids, blockIdx.y, kPass)) {
      // GEMM1 writes outputs even when no group exists (e2p, zero rows, out of unreached tokens): a GEMM2
      // whose CTAs all left without waiting could complete before it, and the op's consumer would not wait.
      if constexpr (!kGemm1) pdl_wait();
      return;
    }
    g = sp.g;
    rb = sp.rb;
    cnt = sp.cnt;
    if (kGemm1 && blockIdx.x == 0 && g < P.EL)
      for (int n = threadIdx.x; n < cnt; n += kStreamThreads) P.e2p[sp.route[n]] = rb + n;
  } else {
    // Slots: the active groups in order, the shared expert (always active when present) last, then its other
    // chunks (moe_stream_rows.h).
    const int slot = blockIdx.y, na = *P.num_active;
    if (slot >= stream_grid_slots(na, P.has_shared, P.T, kPass)) return;
    g = P.active[min(slot, na - 1)];
    const StreamRows sr = stream_slot_rows(slot, na, P.grp_begin[g], P.grp_count[g], g == P.EL, kPass);
    rb = sr.rb;
    cnt = sr.cnt;
  }
  const bool is_shared = g == P.EL;
  const ExpertWeights& W = is_shared ? a.shared : a.experts;
  const int e = is_shared ? 0 : g;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, c = lane % 4;
  const int rw = warp % kStreamRowTiles, kw = warp / kStreamRowTiles;
  const int K = kGemm1 ? a.D : a.I, N = kGemm1 ? 2 * a.I : a.D;

  // This lane's two weight rows.
  int n0, n1;
  if constexpr (kGemm1) {
    const int col = blockIdx.x * kStreamHCols + rw * 8 + r;  // column of h
    n0 = col;                                                 // gate row
    n1 = a.I + col;                                           // up row
  } else {
    n0 = blockIdx.x * 16 * kStreamRowTiles + rw * 16 + r;
    n1 = n0 + 8;
  }
  const void* wbase = kGemm1 ? W.w13 : W.w2;
  const void* sbase = kGemm1 ? W.w13_scale : W.w2_scale;
  WRows wr;
  const size_t rbytes = weight_row_bytes<F>(K);
  wr.row[0] = static_cast<const uint8_t*>(wbase) + (static_cast<size_t>(e) * N + n0) * rbytes;
  wr.row[1] = static_cast<const uint8_t*>(wbase) + (static_cast<size_t>(e) * N + n1) * rbytes;
  if constexpr (F::kW != WeightFormat::kBF16) {
    wr.sc[0] = weight_scale_row<F>(sbase, e, n0, N, K);
    wr.sc[1] = weight_scale_row<F>(sbase, e, n1, N, K);
  }
  float gscale = 1.0f;
  if constexpr (F::kW == WeightFormat::kNVFP4) gscale = (kGemm1 ? W.w13_global : W.w2_global)[e];

  // Activation rows: GEMM1 gathers x by token, GEMM2 reads h in permuted order.
  constexpr bool kAct8 = F::kA != ActFormat::kBF16;
  const size_t arow_bytes = static_cast<size_t>(K) * (kAct8 ? 1 : 2);
  const uint8_t* abase = static_cast<const uint8_t*>(a.a);
  auto act_row = [&](int n) {
    if (!kGemm1) return rb + n;
    if (a.fused) return is_shared ? rb + n : sp.route[n] / P.TOPK;
    return P.row_token[rb + n];
  };

  const int U = K / kQuantBlock;
  const int ub = kw * U / kStreamKSplit, ue = (kw + 1) * U / kStreamKSplit;  // contiguous K range per warp
  __shared__ float red[kStreamKSplit - 1][kStreamRowTiles][NT * 4][32];

  // GEMM2 issues its first K units before waiting for GEMM1, into the registers the first iteration of the
  // K loop consumes (no second copy: a copy kept GEMM2 at 220-255 registers, one CTA per SM).
  constexpr int kU = F::template kUnits<NT>;
  typename F::A av[kU];
  bool have = false;
  if constexpr (!kGemm1) {
#pragma unroll
    for (int q = 0; q < kU; ++q)
      if (ub + q < ue) F::load(av[q], wr, ub + q, c);
    have = true;
    pdl_wait();
    pdl_trigger();
  }

  __shared__ TokRows<NT> rows;
  for (int c0 = 0; c0 < cnt; c0 += 8 * NT) {
    if (threadIdx.x < NT * 8) {
      const int ar = act_row(min(c0 + static_cast<int>(threadIdx.x), cnt - 1));  // past the group: repeat its
      rows.row[threadIdx.x] = abase + ar * arow_bytes;                             // last row (never stored)
      if constexpr (F::kA == ActFormat::kMXFP8)
        rows.srow[threadIdx.x] = static_cast<const uint8_t*>(a.a_scale) + static_cast<size_t>(ar) * (K / 32);
      if constexpr (F::kA == ActFormat::kFP8Block)
        rows.srow[threadIdx.x] = static_cast<const uint8_t*>(a.a_scale) + static_cast<size_t>(ar) * (K / 128) * 4;
    }
    __syncthreads();
    Tok<NT> t{&rows, r, c, min(NT, (cnt - c0 + 7) / 8)};
    float acc[NT][4] = {};
    for (int u = ub; u < ue; u += kU) {
      if (!have) {
#pragma unroll
        for (int q = 0; q < kU; ++q)
          if (u + q < ue) F::load(av[q], wr, u + q, c);
      }
      have = false;
#pragma unroll
      for (int q = 0; q < kU; ++q)
        if (u + q < ue) F::template compute<NT>(acc, av[q], t, u + q, c);
    }
    // Fixed-order K-split reduction (deterministic).
    if (kw > 0)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[kw - 1][rw][nt * 4 + i][lane] = acc[nt][i];
    __syncthreads();
    if (kw == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= t.live) break;
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[i] = acc[nt][i];
          for (int s = 0; s < kStreamKSplit - 1; ++s) v[i] += red[s][rw][nt * 4 + i][lane];
          v[i] *= gscale;
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int n = c0 + nt * 8 + 2 * c + i;  // token (column of the C fragment)
          if (n >= cnt) continue;
          const size_t prow = static_cast<size_t>(rb + n);
          if constexpr (kGemm1) {
            const float hv = silu(v[i]) * v[2 + i];  // gate row r, up row r + 8
            if constexpr (kAct8)
              a.h32[prow * a.I + n0] = hv;
            else
              static_cast<uint16_t*>(a.h)[prow * a.I + n0] = f32_to_bf16_bits(hv);
          } else {
            const int dst = a.fused ? (is_shared ? -1 - (rb + n) : sp.route[n]) : P.row_dest[prow];
            bf16_t* out = dst >= 0 ? a.expert_out + static_cast<size_t>(dst) * a.D
                                   : a.shared_out + static_cast<size_t>(-1 - dst) * a.D;
            reinterpret_cast<uint16_t*>(out)[n0] = f32_to_bf16_bits(v[i]);
            reinterpret_cast<uint16_t*>(out)[n1] = f32_to_bf16_bits(v[2 + i]);
          }
        }
      }
    }
    if constexpr (!kGemm1)
      if (a.fused && a.out) fused_finalize_pass(a, sp, is_shared, c0, min(8 * NT, cnt - c0));
    __syncthreads();  // red[] (and sp.last) are reused by the next pass
  }

  if constexpr (kGemm1 && kAct8) {
    // The last of the 8 CTAs (x each shared-expert chunk) covering a 128-wide block of the group's h quantises
    // it (fp32 h -> down input format).
    __shared__ int last;
    const int cta_per_block = kQuantBlock / kStreamHCols;
    const int qb = blockIdx.x / cta_per_block;
    const int arrivals = cta_per_block * (is_shared ? stream_shared_chunks(P, kPass) : 1);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
      last = atomicAdd(&P.qcounters[g * (a.I / kQuantBlock) + qb], 1) == arrivals - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (is_shared) {  // the rows of all its chunks
      rb = a.fused ? 0 : P.grp_begin[g];
      cnt = a.fused ? P.T : P.grp_count[g];
    }
    quantize_h_block<F::kA>(a, rb, cnt, qb * kQuantBlock);
  }
}

// Format traits by (weights, activations): the struct that implements the pair.
template <WeightFormat W, ActFormat A> struct FmtFor;
template <> struct FmtFor<WeightFormat::kBF16, ActFormat::kBF16> { using type = FmtBF16; };
template <> struct FmtFor<WeightFormat::kFP8Block, ActFormat::kFP8Block> { using type = FmtFP8; };
template <> struct FmtFor<WeightFormat::kMXFP8, ActFormat::kMXFP8> { using type = FmtMXFP8; };
template <> struct FmtFor<WeightFormat::kMXFP4, ActFormat::kBF16> { using type = FmtMXFP4; };
template <> struct FmtFor<WeightFormat::kNVFP4, ActFormat::kBF16> { using type = FmtNVFP4<ActFormat::kBF16>; };
template <> struct FmtFor<WeightFormat::kNVFP4, ActFormat::kFP8Block> { using type = FmtNVFP4<ActFormat::kFP8Block>; };

template <WeightFormat W, ActFormat A, int NT>
void launch_stream_gemm(const GemmArgs& a) {
  using F = typename FmtFor<W, A>::type;
  // max_groups counts the shared expert once; its other chunks take grid rows of their own (moe_stream_rows.h).
  const dim3 grid(a.gemm1 ? a.I / kStreamHCols : a.D / (16 * kStreamRowTiles),
                  stream_grid_slots(a.max_groups, a.plan.has_shared, a.plan.T, 8 * NT));
  if (a.gemm1)
    launch(a.pdl, stream_gemm_kernel<F, NT, true>, grid, kStreamThreads, 0, a.stream, a);
  else
    launch(a.pdl, stream_gemm_kernel<F, NT, false>, grid, kStreamThreads, 0, a.stream, a);
}

}  // namespace ds::moe::detail

// Explicit instantiations of one (weights, activations) pair for every token-tile count the dispatch point
// uses (moe_dispatch.cpp: 1, 2, 4, 8 n8-tiles).
#define DS_MOE_STREAM_INSTANTIATE(W, A)                                                \
  template void ds::moe::detail::launch_stream_gemm<W, A, 1>(const ds::moe::detail::GemmArgs&); \
  template void ds::moe::detail::launch_stream_gemm<W, A, 2>(const ds::moe::detail::GemmArgs&); \
  template void ds::moe::detail::launch_stream_gemm<W, A, 4>(const ds::moe::detail::GemmArgs&); \
  template void ds::moe::detail::launch_stream_gemm<W, A, 8>(const ds::moe::detail::GemmArgs&);
