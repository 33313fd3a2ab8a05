// MoE op internals shared by moe_dispatch.cpp (host orchestration) and the .cu files: the device-side plan,
// kernel argument structs, and the launchers (templates are instantiated in the .cu files, chosen only in
// moe_dispatch.cpp's dispatch point).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/moe/moe.h"

namespace ds::moe::detail {

inline constexpr int kMaxTopk = 16;
inline constexpr int kMaxExperts = 1024;
inline constexpr int kDispatchChunk = 1024;     // routes per CTA of the multi-CTA dispatch
inline constexpr int kSingleCtaMaxRoutes = 4096;  // above this the dispatch runs as count/scan/scatter kernels
inline constexpr int kQuantBlock = 128;         // FP8 block and the stream kernels' K unit
inline constexpr int kFusedMaxRoutes = 512;     // fused decode (MoeParams::fuse_decode): routes per call at most
inline constexpr int kFinalizeCols = 32;        // columns of D per GEMM2 CTA of the stream path (fused finalize)

// The dispatch plan, all in the workspace; written by the dispatch kernel(s) every call.
// Groups g in [0, EL) are the local experts, g = EL is the shared expert (rows [0, T) of the permuted order,
// row t = token t); routed rows follow from Ts = (has_shared ? T : 0), grouped by expert.
struct Plan {
  int T = 0, TOPK = 0, EL = 0, G = 0, expert_begin = 0;
  bool has_shared = false;
  int32_t* grp_begin = nullptr;    // [G] first permuted row of each group
  int32_t* grp_count = nullptr;    // [G] rows of each group
  int32_t* active = nullptr;       // [G] ids of the non-empty groups, ascending; [num_active..G) unspecified
  int32_t* num_active = nullptr;   // [1]
  int32_t* tile_prefix = nullptr;  // [G + 1] prefix sums of ceil(count / tile_m) (wgmma tile schedule)
  int32_t* row_token = nullptr;    // [P] source token of each permuted row
  int32_t* row_dest = nullptr;     // [P] route index t*TOPK+k, or -1 - t for a shared-expert row
  int32_t* e2p = nullptr;          // [R] expanded_to_permuted (-1: dropped)
  int32_t* qcounters = nullptr;    // [G * I/128] arrival counters of the stream path's fused quantisation
  int32_t* chunk_hist = nullptr;   // [ceil(R / kDispatchChunk) * G] multi-CTA dispatch scratch
};

struct DispatchArgs {
  Plan plan;
  const int32_t* topk_ids = nullptr;  // [T, TOPK]
  int tile_m = 0;                     // wgmma tile rows (0: no tile schedule needed)
  int num_qcounters = 0;              // counters to zero
  bf16_t* zero_dropped = nullptr;     // [R, D] deferred expert_out: rows of dropped routes are zeroed
  int D = 0;
  bool pdl = true;
  cudaStream_t stream = nullptr;
};

// Both expert GEMMs share one argument struct; `gemm1` selects the role.
//   gemm1: A = x or xq [T, D] gathered by row_token, B = w13 [g][2I, D]; epilogue SwiGLU -> h.
//   gemm2: A = h [P, I] (rows in permuted order),   B = w2 [g][D, I];   epilogue -> expert_out / shared_out.
struct GemmArgs {
  Plan plan;
  int D = 0, I = 0;
  bool gemm1 = true;
  ActFormat act = ActFormat::kBF16;
  const void* a = nullptr;         // activations (see above)
  const void* a_scale = nullptr;   // f32 [rows, K/128] (FP8 block) | e8m0 [rows, K/32] (MXFP8)
  ExpertWeights experts, shared;   // B operands
  // gemm1 outputs: h in the down input format; h32 is the stream path's fp32 staging for quantised formats
  void* h = nullptr;               // bf16 | e4m3 [P, I]
  void* h_scale = nullptr;         // f32 [P, I/128] | e8m0 [P, I/32]
  float* h32 = nullptr;            // [P, I]
  // gemm2 outputs
  bf16_t* expert_out = nullptr;    // [R, D]
  bf16_t* shared_out = nullptr;    // [T, D]
  int max_groups = 0;              // upper bound of non-empty groups (grid size of the stream path)
  // Fused decode (stream path, R <= kFusedMaxRoutes): each CTA derives its group, first row and routes from
  // topk_ids (the plan arrays are not used); GEMM1 writes expanded_to_permuted (plan.e2p), zeroes the
  // deferred rows of dropped routes and the finalize counters; GEMM2 finalizes when `out` is set (the last
  // CTA to write a token's 32 columns sums them, same arithmetic as finalize_kernel).
  bool fused = false;
  const int32_t* topk_ids = nullptr;  // [T, TOPK]
  const float* topk_w = nullptr;      // [T, TOPK] fused finalize
  int32_t* fcounters = nullptr;       // [T, D/32] arrival counters of the fused finalize
  bf16_t* zero_dropped = nullptr;     // [R, D] deferred expert_out (rows of dropped routes zeroed by GEMM1)
  const bf16_t* residual = nullptr;   // [T, D] or nullptr
  bf16_t* out = nullptr;              // [T, D] fused finalize output, nullptr: no finalize
  int num_sms = 0;
  int fp8_tile_m = 64;  // FP8 wgmma path: 64 (moe_wgmma_fp8.cu) or 128 rows per tile (moe_wgmma_fp8_ws.cu)
  bool pdl = true;
  cudaStream_t stream = nullptr;
};

// ---- launchers (moe_route.cu)
// `pdl`: launch with programmatic dependent launch (every kernel waits for its predecessor before reading).
void launch_router_logits(const bf16_t* x, const bf16_t* w, int T, int D, int E, float* logits, cudaStream_t s,
                          bool pdl);
void launch_topk(const float* logits, const float* bias, int T, const RouterParams& r, int32_t* ids, float* w,
                 cudaStream_t s, bool pdl);
// The one-token router GEMM with the layer boundary before it (MoeParams::pre_norm_w): residual_out =
// bf16(residual + add), out = RMSNorm(residual_out) * norm_w (written by CTA 0), logits from that row.
struct PreNormArgs {
  const bf16_t* add = nullptr;       // [D]
  const bf16_t* residual = nullptr;  // [D] (read only)
  bf16_t* residual_out = nullptr;    // [D]
  const bf16_t* norm_w = nullptr;    // [D]
  bf16_t* out = nullptr;             // [D] (the op's x)
  float eps = 0.0f;
};
void launch_router_prenorm(const bf16_t* w, int D, int E, float* logits, const PreNormArgs& pn, cudaStream_t s,
                           bool pdl);
// Router GEMM + top-k in one kernel whose last CTA selects (same bits as the two launches above) where it applies:
// T <= 16, E <= 256, ungrouped. `counter`: one int32, zero before the first call, left zero.
bool route_fused_applies(int T, const RouterParams& r);
void launch_route_fused(const bf16_t* x, const bf16_t* w, const float* bias, int T, int D, const RouterParams& r,
                        float* logits, int32_t* ids, float* weights, int32_t* counter, cudaStream_t s, bool pdl);
// Router GEMM + top-k in one cluster kernel (same bits as the two launches above) where it applies.
bool route_cluster_applies(int T, const RouterParams& r);
void launch_route_cluster(const bf16_t* x, const bf16_t* w, const float* bias, int T, int D, const RouterParams& r,
                          float* logits, int32_t* ids, float* weights, cudaStream_t s, bool pdl);
void launch_dispatch(const DispatchArgs& a);
// `zero[0, nzero)` is cleared too (the fused decode's quantisation counters: no dispatch kernel runs).
void launch_act_quant(const bf16_t* x, int T, int D, ActFormat f, void* q, void* scale, cudaStream_t s, bool pdl,
                      int32_t* zero = nullptr, int nzero = 0);
void launch_finalize(const bf16_t* expert_out, const int32_t* e2p, const float* w, const bf16_t* shared,
                     const bf16_t* residual, int T, int TOPK, int D, bf16_t* out, cudaStream_t s, bool pdl);

// ---- expert GEMMs: the stream path (moe_stream_*.cu), NT = token n8-tiles held in registers (tokens per
// pass = 8 * NT), and the sm_90a wgmma path (moe_wgmma_*.cu).
template <WeightFormat W, ActFormat A, int NT>
void launch_stream_gemm(const GemmArgs& a);
void launch_wgmma_bf16(const GemmArgs& a);
void launch_wgmma_fp8(const GemmArgs& a);
void launch_wgmma_fp8_ws(const GemmArgs& a);
inline constexpr int kWgmmaTileMBf16 = 128;
inline constexpr int kWgmmaTileMFp8 = 64;
inline constexpr int kWgmmaTileMFp8Ws = 128;

// ---- decode of a few tokens (GemmPath::kGemv, moe_gemv.cu): a block row (grid.x) holds up to kGemvBlockTokens
// tokens and a warp per slot of each, TOPK (+ 1 with a shared expert) slots per token; token t's slot j < TOPK is
// its route j, slot TOPK its shared expert.
inline constexpr int kGemvBlockTokens = 2;
// The token limit of the path (the heuristic's own is lower: gemv_auto_tokens). Block (0, 0) of `down` writes the
// expanded_to_permuted map, a thread per route: its 32 kGemvBlockTokens slots cover T TOPK routes up to 64 tokens.
inline constexpr int kGemvMaxTokens = kGemvTokenLimit;
static_assert(kGemvMaxTokens <= 32 * kGemvBlockTokens, "write_e2p: a thread per route in one block");
inline constexpr int kGemvMaxWarps = kMaxTopk + 2;  // 576 threads: top-16 + shared at T = 1, top-8 + shared at T = 2
struct GemvDecodeArgs {
  int T = 1;                        // tokens <= kGemvMaxTokens, min(T, 2) (TOPK + has_shared) <= kGemvMaxWarps
  int slots = 0, row_tokens = 0;    // set by launch_gemv_decode: TOPK + has_shared, min(T, kGemvBlockTokens)
  const bf16_t* x = nullptr;        // [T, D]
  const int32_t* ids = nullptr;     // [T, TOPK] global expert ids
  const float* w = nullptr;         // [T, TOPK]
  int TOPK = 0, expert_begin = 0, EL = 0;
  bool has_shared = false;
  int D = 0, I = 0;
  bool fp8 = false;                 // FP8-block weights (read as W8A16), else bf16
  ExpertWeights experts, shared;
  bf16_t* h = nullptr;              // [T (TOPK + 1), I] workspace, a row per slot
  const bf16_t* residual = nullptr; // [T, D] or nullptr
  bf16_t* out = nullptr;            // [T, D] (may alias residual)
  int32_t* e2p = nullptr;           // [T TOPK] or nullptr
  bool x_ready = false;             // x was complete before the previous kernel started (in-kernel routing)
  int up_cols = 0, down_rows = 0;   // block shapes (0: the defaults; else 2 or 4, and 2, 4 or 8)
  bool down_persistent = false;     // MoeParams::gemv_down_persistent (where gemv_down_persistent_applies)
  bool down_preload = false;        // MoeParams::gemv_down_preload (where gemv_down_persistent_applies; 2 or 4 rows)
  // Fused RMSNorm of out (MoeParams::norm_w): the last `down` block to finish norms the row; `up` zeroes the
  // arrival counter first.
  const bf16_t* norm_w = nullptr;   // [D]
  bf16_t* norm_out = nullptr;       // [T, D]
  float norm_eps = 0.0f;
  int32_t* norm_counter = nullptr;  // [block rows] workspace
  bool pdl = true;
  cudaStream_t stream = nullptr;
};
void launch_gemv_decode(const GemvDecodeArgs& a);
// Whether the persistent `down` kernel runs these dims: W_down rows of I weights in 32, 64 or 128 16-byte chunks.
bool gemv_down_persistent_applies(bool fp8, int D, int I);
// Whether the gemv decode can fuse the RMSNorm of its output row (block size and D; see moe_gemv.cu).
bool gemv_norm_fusable(int D, int slots);

// Shared host helper: SM count of the current device (cached).
int device_sm_count();

}  // namespace ds::moe::detail
