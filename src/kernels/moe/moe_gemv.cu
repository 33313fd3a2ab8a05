// Decode of a few tokens (GemmPath::kGemv): per token, the routed experts and the shared expert are TOPK + 1
// matrix-vector products, so the op is nothing but one pass over their weights. Two kernels, no dispatch and no
// finalize kernel:
//
//   up      block = one warp per slot, kCols (bf16 2, FP8 4) columns of h per block: each warp streams the 2 kCols
//           weight rows (gate j.., up j..) of its expert, the lanes walking K in 16-byte chunks; h = silu(g) * u
//           rounded to bf16 (the reference's quantisation point for bf16 activations).
//   down    block = one warp per slot again, kR (2) rows of D per block: each warp streams its expert's rows
//           of W_down against its h row, the block then finalizes its rows in place: out = sum_k w_k y_k
//           (k ascending, live routes) + y_shared + residual, fp32, each y rounded to bf16 first — the finalize
//           kernel's arithmetic on the values the other paths would have stored.
//
// Slots: a block row (block_row) holds Tb = min(T, 2) tokens, and its warp s is slot g = Tb S row + s of
// the call, i.e. slot j = g % S of token t = g / S, S = TOPK (+ 1 with a shared expert): route t TOPK + j for
// j < TOPK, the shared expert for j == TOPK (warps of a token past T, in an odd T's last row, leave). A warp
// computes one token's dot products, exactly as for one token alone, so each token's output has the bits it would
// have in a call of its own (tokens choosing the same expert, and the shared expert's rows, are read by several
// warps at about the same time: the reads after the first come from L2). Every block of a row holds every slot of
// its tokens, so its weights are the same bytes whichever experts they chose, and the warps of a slot whose expert
// is outside this rank's range simply leave.
// FP8-block weights are read as W8A16 (x and h stay bf16, each 16-byte chunk of e4m3 times its 128x128 block
// scale): no activation quantiser runs at all, and the result is the reference with bf16 activations.
//
// PDL: `up` needs the routes (its predecessor's output) before it knows its weights; `down` knows its experts
// before it waits (`up` passed its wait on the routes before it let `down` start), so it loads its weight rows
// into registers (MoeParams::gemv_down_preload; else it pulls the first chunks into L2) while `up` drains, then
// waits for h.
#include <algorithm>
#include <type_traits>

#include "kernels/common/arrival.cuh"
#include "kernels/common/per_device.h"
#include "kernels/moe/moe_common.cuh"
#include "kernels/moe/moe_kernels.h"
#include "kernels/norm/rmsnorm_row.cuh"

namespace ds::moe::detail {
namespace {

inline constexpr int kMaxSlots = kGemvMaxWarps;

// Block shapes: h columns per `up` block (2 x that many weight rows per warp) and rows of D per `down` block
// (MoeParams::gemv_up_cols / gemv_down_rows). moe_bench's sweep on the H200 (docs/perf-moe.md, run 4, before `down`
// preloaded) chose bf16 2x2 (33.0, 32.9 us) and FP8 4x2 (22.3, 24.3 us): the FP8 `up` kernel wants 8 weight rows per
// warp, as many bytes in flight per lane as bf16's 4. FP8 `down` takes 4 rows since its blocks preload them in
// either height (run 27, H100 engine A/B: +0.7-1.9 % tps/user at C = 1-8; same bits): twice the weight bytes in
// flight per preloading block, half the blocks.
template <bool kFp8>
struct GemvFmt {
  static constexpr int kPer = kFp8 ? 16 : 8;  // weights per 16-byte chunk
  static constexpr int kUpCols = kFp8 ? 4 : 2;
  static constexpr int kDownRows = kFp8 ? 4 : 2;
};

// Slots per token, tokens per block row, and the block's warp s's token and place in it (the header's layout).
__device__ __forceinline__ int slots_per_token(const GemvDecodeArgs& a) { return a.slots; }
__device__ __forceinline__ int row_tokens(const GemvDecodeArgs& a) { return a.row_tokens; }
// The block row of a call with several (kMultiRow: more than kGemvBlockTokens tokens); 0 otherwise, so the
// kernels of one or two tokens compile as before the rows existed (with the row indexing, bf16 `up` took 60
// registers instead of 54 and T = 1 and 2 ran 2-5 % slower on an H100).
// With rows, the rows are grid.x and the column blocks grid.y: blocks are issued x fastest, so every row's block of
// the same weight rows runs at about the same time, and a token's expert (or the shared expert) that another row's
// token also chose is read from L2, not from DRAM again a row later (with the rows on grid.y, a row's blocks ran
// as one wave after another, and each row streamed its 18 experts, past what L2 holds).
template <bool kMultiRow>
__device__ __forceinline__ int block_row() { return kMultiRow ? static_cast<int>(blockIdx.x) : 0; }
// The block's column block (`up`: h columns, `down`: rows of D), and how many there are.
template <bool kMultiRow>
__device__ __forceinline__ int block_col() { return static_cast<int>(kMultiRow ? blockIdx.y : blockIdx.x); }
template <bool kMultiRow>
__device__ __forceinline__ int block_cols() { return static_cast<int>(kMultiRow ? gridDim.y : gridDim.x); }
// The launch grid of `cols` column blocks for `rows` block rows (the layout above).
template <bool kMultiRow>
dim3 gemv_grid(int cols, int rows) {
  return kMultiRow ? dim3(rows, cols) : dim3(cols, rows);
}
struct Slot {
  int t, j;  // token, and route j of it (j == TOPK: the shared expert)
  int g;     // slot index in the call: its h row
};
template <bool kMultiRow>
__device__ __forceinline__ Slot slot_of(const GemvDecodeArgs& a, int s) {
  const int S = slots_per_token(a), g = kMultiRow ? row_tokens(a) * S * block_row<kMultiRow>() + s : s;
  return {g / S, g % S, g};
}
// Expert of route r = t TOPK + j in [0, EL), -1 for a dropped route.
__device__ __forceinline__ int route_expert(const GemvDecodeArgs& a, int r) {
  const int e = a.ids[r] - a.expert_begin;
  return static_cast<unsigned>(e) < static_cast<unsigned>(a.EL) ? e : -1;
}
// Expert of a slot: its route's, the shared expert's 0 for j == TOPK, -1 past the last token.
template <bool kMultiRow>
__device__ __forceinline__ int slot_expert(const GemvDecodeArgs& a, Slot sl) {
  if (kMultiRow && sl.t >= a.T) return -1;  // without rows every slot's token exists
  return sl.j == a.TOPK ? 0 : route_expert(a, sl.t * a.TOPK + sl.j);
}

// x (or h): 8 bf16 (kFp8: 16, two chunks) at chunk c, unpacked to fp32. Written by an earlier kernel, read after
// pdl_wait() on the coherent path (ld_act: pdl::load_prior).
template <int kPer>
__device__ __forceinline__ void load_act(const bf16_t* x, int c, float (&f)[kPer]) {
#pragma unroll
  for (int h = 0; h < kPer / 8; ++h) {
    const uint4 v = ld_act(reinterpret_cast<const uint4*>(x) + c * (kPer / 8) + h);  // L1: every warp reads it
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[8 * h + 2 * i] = bf16_lo(word(v, i));
      f[8 * h + 2 * i + 1] = bf16_hi(word(v, i));
    }
  }
}

// Dot product of one 16-byte weight chunk with the matching activations.
template <bool kFp8>
__device__ __forceinline__ float chunk_dot(const uint4& wv, const float (&xf)[GemvFmt<kFp8>::kPer]) {
  float d = 0.0f;
  if constexpr (kFp8) {  // two e4m3 per conversion instruction (e4m3x2 -> f16x2), exact in fp32
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __half2_raw hr =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word(wv, i) >> (16 * h)), __NV_E4M3);
        const float2 p = __half22float2(__half2(hr));
        d = fmaf(p.x, xf[4 * i + 2 * h], d);
        d = fmaf(p.y, xf[4 * i + 2 * h + 1], d);
      }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      d = fmaf(bf16_lo(word(wv, i)), xf[2 * i], d);
      d = fmaf(bf16_hi(word(wv, i)), xf[2 * i + 1], d);
    }
  }
  return d;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[r] += weight chunk wv[r] . the chunk's activations af, r < kRows; FP8: times the 128x128 block scale, sl for
// rows r < kLo and sh for the others. The summation step of stream_rows and of the preloaded `down` (the same
// bits; the persistent `down` keeps its own copy: routed through here it compiles to a differently scheduled PTX).
template <bool kFp8, int kRows, int kLo = kRows>
__device__ __forceinline__ void accumulate_chunk(const uint4 (&wv)[kRows], const float (&af)[GemvFmt<kFp8>::kPer],
                                                 float sl, float sh, float (&acc)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float d = chunk_dot<kFp8>(wv[r], af);
    if constexpr (kFp8) {
      acc[r] = fmaf(r < kLo ? sl : sh, d, acc[r]);
    } else {
      acc[r] += d;
    }
  }
}

// One warp's dot products of kRows weight rows (16-byte chunk pointers wr) with one activation row, the lanes
// walking K in chunks; the sums in every lane. FP8: each chunk's 128x128 block scale, rows r < kLo from scale row
// s_lo and the others from s_hi (only read when kLo < kRows).
template <bool kFp8, int kRows, int kLo>
__device__ __forceinline__ void stream_rows(const uint4* const (&wr)[kRows], const bf16_t* act, int KC,
                                            const float* s_lo, const float* s_hi, float (&acc)[kRows]) {
  constexpr int kPer = GemvFmt<kFp8>::kPer;
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
#pragma unroll 2
  for (int c = threadIdx.x % 32; c < KC; c += 32) {
    uint4 wv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[r] = ld_stream(wr[r] + c);
    float af[kPer];
    load_act<kPer>(act, c, af);
    float sl = 1.0f, sh = 1.0f;
    if constexpr (kFp8) {
      sl = __ldg(s_lo + c / (128 / kPer));
      if constexpr (kLo < kRows) sh = __ldg(s_hi + c / (128 / kPer));
    }
    accumulate_chunk<kFp8, kRows, kLo>(wv, af, sl, sh, acc);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
}

// `up`: block b, warp s -> h[s, kCols b .. kCols (b + 1)).
template <bool kFp8, int kCols, bool kMultiRow>
__global__ void __launch_bounds__(32 * kMaxSlots) gemv_up_kernel(const GemvDecodeArgs a) {
  using F = GemvFmt<kFp8>;
  constexpr int kPer = F::kPer, kRows = 2 * kCols;  // gate rows j0.., then the matching up rows
  const int s = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = block_col<kMultiRow>() * kCols;
  const Slot sl = slot_of<kMultiRow>(a, s);
  const bool is_shared = sl.j == a.TOPK;
  // The routes (and x) come from the previous kernels. The routed warps wait, then let `down` get scheduled
  // (`down` reads the routes before its own wait). The shared expert needs no route: behind the op's own
  // router, x was complete before the router started, so that warp streams while top-k still runs, and it
  // never triggers (the block's trigger must follow the routed warps' wait).
  if (!(is_shared && a.x_ready)) {
    pdl_wait();
    pdl_trigger();
  }
  if (a.norm_counter && block_col<kMultiRow>() == 0 && threadIdx.x == 0)
    a.norm_counter[block_row<kMultiRow>()] = 0;  // `down` counts after its wait
  const int e = slot_expert<kMultiRow>(a, sl);
  if (e < 0) return;
  const ExpertWeights& W = is_shared ? a.shared : a.experts;
  const int D = a.D, I = a.I, KC = D / kPer;
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = (r < kCols ? 0 : I) + j0 + r % kCols;
    wr[r] = static_cast<const uint4*>(W.w13) + (static_cast<size_t>(e) * 2 * I + row) * KC;
  }
  const float* sg = nullptr;
  const float* su = nullptr;
  if constexpr (kFp8) {  // [n, 2I/128, D/128]: the kCols gate rows share a scale row (kCols | 128), so do the up rows
    const float* sb = static_cast<const float*>(W.w13_scale) + static_cast<size_t>(e) * (2 * I / 128) * (D / 128);
    sg = sb + static_cast<size_t>(j0 / 128) * (D / 128);
    su = sb + static_cast<size_t>((I + j0) / 128) * (D / 128);
  }

  float acc[kRows];
  stream_rows<kFp8, kRows, kCols>(wr, a.x + static_cast<size_t>(sl.t) * D, KC, sg, su, acc);
  if (lane == 0) {
    uint32_t* hp = reinterpret_cast<uint32_t*>(a.h + static_cast<size_t>(sl.g) * I + j0);
#pragma unroll
    for (int c = 0; c < kCols; c += 2)
      hp[c / 2] = pack_bf16x2(silu(acc[c]) * acc[kCols + c], silu(acc[c + 1]) * acc[kCols + c + 1]);
  }
}

// expanded_to_permuted of the op's stable order (block (0, 0), threads < T TOPK): the shared rows first (one per
// token), then experts ascending, routes ascending inside an expert.
__device__ __forceinline__ void write_e2p(const GemvDecodeArgs& a) {
  const int R = a.T * a.TOPK;
  if (blockIdx.x != 0 || blockIdx.y != 0 || threadIdx.x >= R || !a.e2p) return;
  const int r = threadIdx.x, er = route_expert(a, r);
  int pos = a.has_shared ? a.T : 0;
  for (int q = 0; q < R; ++q) {
    const int eq = route_expert(a, q);
    pos += eq >= 0 && (eq < er || (eq == er && q < r));
  }
  a.e2p[r] = er < 0 ? -1 : pos;
}

// The finalize of the block row's token tl (token t) at output row n (column r of the block's ys): sum_k w_k y_k
// over live routes, k ascending, + the shared expert's y + residual, fp32, bf16 out. live(s) and weight(s) (of the
// block's slot s, a route of token t) and residual() say where the inputs come from (read here, or earlier:
// FinalizeInputs); the sum and its order are this one.
template <int kR, class Live, class Weight, class Residual>
__device__ __forceinline__ void finalize_row(const GemvDecodeArgs& a, const float (*ys)[kR], int tl, int t, int r,
                                             int n, Live live, Weight weight, Residual residual) {
  const int s0 = tl * slots_per_token(a);
  float o = 0.0f;
  for (int k = 0; k < a.TOPK; ++k)
    if (live(s0 + k)) o += weight(s0 + k) * ys[s0 + k][r];
  if (a.has_shared) o += ys[s0 + a.TOPK][r];
  if (a.residual) o += residual();
  reinterpret_cast<__nv_bfloat16*>(a.out)[static_cast<size_t>(t) * a.D + n] = __float2bfloat16_rn(o);
}
// With its inputs read as it sums.
template <int kR, bool kMultiRow>
__device__ __forceinline__ void finalize_row(const GemvDecodeArgs& a, const float (*ys)[kR], int tl, int t, int r,
                                             int n) {
  finalize_row<kR>(
      a, ys, tl, t, r, n, [&](int s) { return slot_expert<kMultiRow>(a, slot_of<kMultiRow>(a, s)) >= 0; },
      [&](int s) { return a.w[t * a.TOPK + s % slots_per_token(a)]; },
      [&] {
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.residual)[static_cast<size_t>(t) * a.D + n]);
      });
}
// Thread i < Tb kR of a block finalizes the row's token tl = i / kR at row n0 + i % kR; false: nothing to do.
struct FinalizeItem {
  int tl, t, r;
};
template <bool kMultiRow>
__device__ __forceinline__ bool finalize_item(const GemvDecodeArgs& a, int kR, FinalizeItem& it) {
  const int i = threadIdx.x;
  it.tl = i / kR;
  it.t = row_tokens(a) * block_row<kMultiRow>() + it.tl;
  it.r = i % kR;
  return i < row_tokens(a) * kR && it.t < a.T;
}
// The block's finalize of its rows n0 .. n0 + kR - 1 for the row's tokens.
template <int kR, bool kMultiRow>
__device__ __forceinline__ void finalize_block(const GemvDecodeArgs& a, const float (*ys)[kR], int n0) {
  FinalizeItem it;
  if (finalize_item<kMultiRow>(a, kR, it)) finalize_row<kR, kMultiRow>(a, ys, it.tl, it.t, it.r, n0 + it.r);
}

// finalize_row's inputs that do not come from `up` (the route weights, the residual), read before the PDL wait:
// `down` starts only after every `up` block passed its own wait, so every kernel before `up` has completed (the
// routes are read early on the same grounds); through L2, never L1 or the non-coherent path. Each warp's lane 0
// stores its slot's weight (0 for the shared expert and dropped routes, which the sum skips as finalize_row does).
struct FinalizeInputs {
  float w[kMaxSlots];  // shared memory
  bool live[kMaxSlots];
};
__device__ __forceinline__ void load_finalize_inputs(const GemvDecodeArgs& a, FinalizeInputs& fi, int s, Slot sl,
                                                     int e, int lane) {
  if (lane == 0 && sl.j < a.TOPK) {
    fi.live[s] = e >= 0;
    fi.w[s] = e >= 0 ? __ldcg(a.w + sl.t * a.TOPK + sl.j) : 0.0f;
  }
}
__device__ __forceinline__ float load_residual(const GemvDecodeArgs& a, int t, int n) {
  return a.residual ? __bfloat162float(__ldcg(reinterpret_cast<const __nv_bfloat16*>(a.residual) +
                                              static_cast<size_t>(t) * a.D + n))
                    : 0.0f;
}

// The fused RMSNorm of the block row's finished rows: norm_out = RMSNorm(out) * norm_w in norm.cu's row code
// (rmsnorm_row.cuh), hence norm::rmsnorm's bits (MoeOpGpu.GemvDecodeFusedNorm checks it). The rows were written by
// other blocks of this kernel: read through L2.
template <bool kMultiRow>
__device__ __forceinline__ void norm_rows(const GemvDecodeArgs& a) {
  __shared__ float part[32];
  const int t0 = row_tokens(a) * block_row<kMultiRow>(), t1 = min(a.T, t0 + row_tokens(a));
  for (int t = t0; t < t1; ++t) {
    const uint4* row = reinterpret_cast<const uint4*>(a.out + static_cast<size_t>(t) * a.D);
    norm::dev::rmsnorm_row([&](int i) { return __ldcg(row + i); }, reinterpret_cast<const __nv_bfloat16*>(a.norm_w),
                           reinterpret_cast<__nv_bfloat16*>(a.norm_out) + static_cast<size_t>(t) * a.D, a.D,
                           a.norm_eps, part);
  }
}

// `down` + finalize: block b, warp s -> y_s[rows], then the block's rows of out; kNorm: the last block to finish
// also norms the row (norm_row). kCpl > 0 (W_down rows of exactly 32 kCpl 16-byte chunks): every lane loads its
// whole share of the rows into registers before the PDL wait, so a block made resident while `up` drains has its
// weights when h arrives; the sums keep stream_rows' order (chunk lane, lane + 32, ...): the same bits.
template <bool kFp8, int kR, bool kNorm, int kCpl, bool kMultiRow>
__global__ void __launch_bounds__(32 * kMaxSlots) gemv_down_kernel(const GemvDecodeArgs a) {
  using F = GemvFmt<kFp8>;
  constexpr int kPer = F::kPer;
  __shared__ float ys[kMaxSlots][kR];
  const int s = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = block_col<kMultiRow>() * kR;
  const int D = a.D, I = a.I, KC = I / kPer;
  // The routes are complete: `up` waited for them before it let this kernel start.
  const Slot sl = slot_of<kMultiRow>(a, s);
  const int e = slot_expert<kMultiRow>(a, sl);
  const ExpertWeights& W = sl.j == a.TOPK ? a.shared : a.experts;
  const uint4* wr[kR];
  const float* sc = nullptr;
  uint4 wv[kCpl > 0 ? kCpl : 1][kR];
  if (e >= 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      wr[r] = static_cast<const uint4*>(W.w2) + (static_cast<size_t>(e) * D + n0 + r) * KC;
      if constexpr (kCpl > 0) {
#pragma unroll
        for (int j = 0; j < kCpl; ++j) wv[j][r] = ld_stream(wr[r] + lane + 32 * j);
      } else {
        pdl::prefetch_l2(wr[r] + lane);
      }
    }
    if constexpr (kFp8)  // [n, D/128, I/128]; the block's kR rows never straddle a 128-row block
      sc = static_cast<const float*>(W.w2_scale) + (static_cast<size_t>(e) * (D / 128) + n0 / 128) * (I / 128);
  }
  // FP8 only: the H200 A/B (one call, alternated, three rounds, twice) gave FP8 +0.6 % / +1.4 % tps/user, but bf16
  // -0.9 % / -1.3 % with the same early loads (the same 56 registers; not understood), so bf16 reads them after.
  __shared__ FinalizeInputs fi;
  float residual = 0.0f;  // finalize_item's row of it
  FinalizeItem it;
  const bool finalizes = finalize_item<kMultiRow>(a, kR, it);
  if constexpr (kFp8) {
    load_finalize_inputs(a, fi, s, sl, e, lane);
    if (finalizes) residual = load_residual(a, it.t, n0 + it.r);
  }
  write_e2p(a);
  pdl_wait();  // h comes from `up`
  pdl_trigger();

  if (e >= 0) {
    float acc[kR];
    const bf16_t* hrow = a.h + static_cast<size_t>(sl.g) * I;
    if constexpr (kCpl > 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < kCpl; ++j) {
        const int c = lane + 32 * j;
        float af[kPer];
        load_act<kPer>(hrow, c, af);
        const float bs = kFp8 ? __ldg(sc + c / (128 / kPer)) : 1.0f;
        accumulate_chunk<kFp8, kR>(wv[j], af, bs, bs, acc);
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[r] = warp_sum(acc[r]);
    } else {
      stream_rows<kFp8, kR, kR>(wr, hrow, KC, sc, nullptr, acc);
    }
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kR; ++r) ys[s][r] = __bfloat162float(__float2bfloat16_rn(acc[r]));  // y as stored elsewhere
  }
  __syncthreads();
  if constexpr (kFp8) {
    if (finalizes)
      finalize_row<kR>(
          a, ys, it.tl, it.t, it.r, n0 + it.r, [&](int k) { return fi.live[k]; }, [&](int k) { return fi.w[k]; },
          [&] { return residual; });
  } else {
    finalize_block<kR, kMultiRow>(a, ys, n0);
  }
  if constexpr (kNorm)  // one counter per block row: its last block norms the row's tokens
    if (arrival::last_to_arrive(a.norm_counter + block_row<kMultiRow>(), block_cols<kMultiRow>()))
      norm_rows<kMultiRow>(a);
}

// `down` + finalize as one wave of blocks (MoeParams::gemv_down_persistent). The default kernel's 1,152 blocks of
// two rows each do one round trip of loads apiece, in ~1.75 waves, and the engine's timeline puts it at ~10 us for
// 21 MB of FP8 weights even from L2 (docs/perf-moe.md, run 8): bound by latency and block launch. Here each block
// takes row pairs n0 = 2 (b + i B), b its column block of B, and every warp loads the next pair's weight chunks
// (kCpl per lane and row: the whole row, in registers) before it sums the current pair, so the loads of
// consecutive pairs overlap. The arithmetic is the default kernel's, in its order (chunk lane, lane + 32, ...; the
// same block scales, warp_sum, bf16 rounding of y, finalize): the same bits.
template <bool kFp8, int kCpl, bool kMultiRow>
__global__ void __launch_bounds__(32 * kMaxSlots) gemv_down_persistent_kernel(const GemvDecodeArgs a) {
  using F = GemvFmt<kFp8>;
  constexpr int kPer = F::kPer, kR = 2;
  __shared__ float ys[kMaxSlots][kR];
  const int s = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = a.D, I = a.I, KC = I / kPer, pairs = D / kR;
  const Slot sl = slot_of<kMultiRow>(a, s);
  const int e = slot_expert<kMultiRow>(a, sl);  // the routes are complete: `up` waited for them before this started
  const ExpertWeights& W = sl.j == a.TOPK ? a.shared : a.experts;
  const uint4* w0 = e >= 0 ? static_cast<const uint4*>(W.w2) + static_cast<size_t>(e) * D * KC : nullptr;
  const float* sbase =
      kFp8 && e >= 0 ? static_cast<const float*>(W.w2_scale) + static_cast<size_t>(e) * (D / 128) * (I / 128) : nullptr;
  uint4 cur[kR][kCpl], nxt[kR][kCpl];
  auto load = [&](uint4 (&dst)[kR][kCpl], int pair) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int j = 0; j < kCpl; ++j)
        dst[r][j] = ld_stream(w0 + static_cast<size_t>(pair * kR + r) * KC + lane + 32 * j);
  };
  int pair = block_col<kMultiRow>();
  if (e >= 0 && pair < pairs) load(cur, pair);  // weights: before the wait
  write_e2p(a);
  pdl_wait();  // h comes from `up`
  pdl_trigger();
  const bf16_t* hrow = a.h + static_cast<size_t>(sl.g) * I;
  for (; pair < pairs; pair += block_cols<kMultiRow>()) {
    const int next = pair + block_cols<kMultiRow>();
    if (e >= 0) {
      if (next < pairs) load(nxt, next);
      float acc[kR] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kCpl; ++j) {
        const int c = lane + 32 * j;
        float af[kPer];
        load_act<kPer>(hrow, c, af);
        const float sc =
            kFp8 ? __ldg(sbase + static_cast<size_t>(pair * kR / 128) * (I / 128) + c / (128 / kPer)) : 1.0f;
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const float d = chunk_dot<kFp8>(cur[r][j], af);
          acc[r] = kFp8 ? fmaf(sc, d, acc[r]) : acc[r] + d;
        }
      }
      const float y0 = warp_sum(acc[0]), y1 = warp_sum(acc[1]);  // every lane: the shuffles need the whole warp
      if (lane == 0) {
        ys[s][0] = __bfloat162float(__float2bfloat16_rn(y0));  // y as stored elsewhere
        ys[s][1] = __bfloat162float(__float2bfloat16_rn(y1));
      }
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int j = 0; j < kCpl; ++j) cur[r][j] = nxt[r][j];
    }
    __syncthreads();
    finalize_block<kR, kMultiRow>(a, ys, pair * kR);
    __syncthreads();  // ys is rewritten by the next pair
  }
}

// Blocks of the persistent `down` kernel resident at once (one wave).
template <bool kFp8, int kCpl, bool kMultiRow>
int persistent_grid(int pairs) {
  static PerDeviceValue<int> per_sm_cache;
  int per_sm = 0;
  MOE_CUDA_CHECK(per_sm_cache.get(per_sm, [](int, int& v) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gemv_down_persistent_kernel<kFp8, kCpl, kMultiRow>,
                                                         32 * kMaxSlots, 0);
  }));
  return std::min(pairs, std::max(1, per_sm) * device_sm_count());
}

// One wave per block row (more than one wave of the whole grid from three tokens on).
template <bool kFp8, bool kMultiRow>
void launch_down_persistent(const GemvDecodeArgs& a, dim3 block, int rows) {
  const int cpl = a.I / GemvFmt<kFp8>::kPer / 32, pairs = a.D / 2;
  auto go = [&](auto kernel, int grid) {
    launch(a.pdl, kernel, gemv_grid<kMultiRow>(grid, rows), block, 0, a.stream, a);
  };
  if (cpl == 1)
    go(gemv_down_persistent_kernel<kFp8, 1, kMultiRow>, persistent_grid<kFp8, 1, kMultiRow>(pairs));
  else if (cpl == 2)
    go(gemv_down_persistent_kernel<kFp8, 2, kMultiRow>, persistent_grid<kFp8, 2, kMultiRow>(pairs));
  else
    go(gemv_down_persistent_kernel<kFp8, 4, kMultiRow>, persistent_grid<kFp8, 4, kMultiRow>(pairs));
}

template <bool kFp8, bool kMultiRow>
void launch_fmt(const GemvDecodeArgs& a) {
  using F = GemvFmt<kFp8>;
  // Block rows of up to kGemvBlockTokens tokens (gemv_grid), a warp per slot of each.
  const int tb = a.row_tokens, brows = (a.T + tb - 1) / tb;
  const dim3 block(32 * tb * a.slots);
  const int cols = a.up_cols > 0 ? a.up_cols : F::kUpCols, rows = a.down_rows > 0 ? a.down_rows : F::kDownRows;
  if (cols == 4)
    launch(a.pdl, gemv_up_kernel<kFp8, 4, kMultiRow>, gemv_grid<kMultiRow>(a.I / 4, brows), block, 0, a.stream, a);
  else
    launch(a.pdl, gemv_up_kernel<kFp8, 2, kMultiRow>, gemv_grid<kMultiRow>(a.I / 2, brows), block, 0, a.stream, a);
  const int cpl = a.I / F::kPer / 32;  // down_preload: I is 32, 64 or 128 chunks (gemv_down_persistent_applies)
  // Preloading blocks of 2 or 4 rows of D (8 rows' weights do not fit the registers: that height streams).
  if (a.down_preload && !a.down_persistent && (rows == 2 || rows == 4)) {
    auto go = [&](auto norm_tag, auto rows_tag) {
      constexpr bool kNorm = decltype(norm_tag)::value;
      constexpr int kR = decltype(rows_tag)::value;
      const dim3 grid = gemv_grid<kMultiRow>(a.D / kR, brows);
      if (cpl == 1)
        launch(a.pdl, gemv_down_kernel<kFp8, kR, kNorm, 1, kMultiRow>, grid, block, 0, a.stream, a);
      else if (cpl == 2)
        launch(a.pdl, gemv_down_kernel<kFp8, kR, kNorm, 2, kMultiRow>, grid, block, 0, a.stream, a);
      else
        launch(a.pdl, gemv_down_kernel<kFp8, kR, kNorm, 4, kMultiRow>, grid, block, 0, a.stream, a);
    };
    using R2 = std::integral_constant<int, 2>;
    using R4 = std::integral_constant<int, 4>;
    if (rows == 4)
      a.norm_out ? go(std::true_type{}, R4{}) : go(std::false_type{}, R4{});
    else
      a.norm_out ? go(std::true_type{}, R2{}) : go(std::false_type{}, R2{});
    return;
  }
  auto down = [&](auto kernel, int height) {
    launch(a.pdl, kernel, gemv_grid<kMultiRow>(a.D / height, brows), block, 0, a.stream, a);
  };
  if (a.norm_out)  // the default block height only
    down(gemv_down_kernel<kFp8, F::kDownRows, true, 0, kMultiRow>, F::kDownRows);
  else if (a.down_persistent)
    launch_down_persistent<kFp8, kMultiRow>(a, block, brows);
  else if (rows == 8)
    down(gemv_down_kernel<kFp8, 8, false, 0, kMultiRow>, 8);
  else if (rows == 4)
    down(gemv_down_kernel<kFp8, 4, false, 0, kMultiRow>, 4);
  else
    down(gemv_down_kernel<kFp8, 2, false, 0, kMultiRow>, 2);
}

}  // namespace

bool gemv_down_persistent_applies(bool fp8, int D, int I) {
  const int per = fp8 ? 16 : 8;
  if (D % 2 != 0 || I % (32 * per) != 0) return false;
  const int cpl = I / per / 32;
  return cpl == 1 || cpl == 2 || cpl == 4;
}

bool gemv_norm_fusable(int D, int slots) {
  const int nvec = D / 8, nt = norm::dev::row_threads(D);
  return D % 8 == 0 && nvec >= 1 && (nvec + nt - 1) / nt <= norm::dev::kRowMaxVpt && 32 * slots >= nt;
}

void launch_gemv_decode(const GemvDecodeArgs& args) {
  GemvDecodeArgs a = args;
  a.slots = a.TOPK + (a.has_shared ? 1 : 0);
  a.row_tokens = std::min(a.T, kGemvBlockTokens);
  const bool rows = a.T > kGemvBlockTokens;
  if (a.fp8)
    rows ? launch_fmt<true, true>(a) : launch_fmt<true, false>(a);
  else
    rows ? launch_fmt<false, true>(a) : launch_fmt<false, false>(a);
}

}  // namespace ds::moe::detail
