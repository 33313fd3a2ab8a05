// Fused MoE op (CUDA): router, dispatch, grouped expert GEMMs (bf16 / FP8 block / MXFP8 / MXFP4 / NVFP4),
// fused SwiGLU + down-input quantisation, finalize, and the deferred-finalize contract. Host API only.
//
// Dimension names: T tokens, D hidden, I expert intermediate, E experts of the model (router width),
// EL local experts (expert_end - expert_begin), TOPK routes per token, R = T * TOPK routes.
//
// The op, in order (docs/moe.md has the numerics of each format):
//   route      in-kernel: logits = x @ gate_w^T (fp32), sigmoid, bias-corrected grouped top-k, renormalise,
//              routed_scaling_factor (moe_ref.h is the definition); separated: the caller's topk_ids/weights.
//   dispatch   routes grouped by local expert (stable: ascending route index inside an expert), routes to
//              experts outside [expert_begin, expert_end) dropped (expanded_to_permuted = -1).
//   experts    h = silu(x W_gate^T) * (x W_up^T), quantised into the down GEMM's input format in the same
//              kernel; y = h W_down^T in bf16; the shared expert is one more group that every token visits.
//   finalize   out[t] = sum_k w[t,k] * y[t,k] + shared[t] + residual[t], fp32 accumulation, bf16 out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "kernels/moe/moe_ref.h"

// This header stays free of fmt (core/error.h, core/tensor.h): nvcc in C++20 mode rejects fmt's consteval
// format strings, and the kernels and the benchmark include it.

typedef struct CUstream_st* cudaStream_t;  // the same declarations as cuda_runtime.h: no CUDA header needed here
typedef struct CUevent_st* cudaEvent_t;

namespace ds::moe {

// Weight storage of the expert GEMMs (each expert stores W_gate/W_up stacked as w13 and W_down as w2).
enum class WeightFormat : uint8_t {
  kBF16,      // bf16
  kFP8Block,  // e4m3 + fp32 scale per 128x128 block (DeepSeek-V3 / Kimi FP8 checkpoints)
  kMXFP8,     // e4m3 + e8m0 scale per 1x32 along K
  kMXFP4,     // e2m1 (two per byte, even k in the low nibble) + e8m0 per 1x32 along K
  kNVFP4,     // e2m1 + e4m3 scale per 1x16 along K + one fp32 global scale per expert and matrix
};
// Format in which the expert GEMMs read their activations (x for gate/up, h for down).
enum class ActFormat : uint8_t {
  kBF16,      // bf16 rows
  kFP8Block,  // e4m3 + fp32 scale per 1x128 (scale = amax / 448, q = e4m3(v / scale))
  kMXFP8,     // e4m3 + e8m0 per 1x32 (smallest power of two s with amax / s <= 448, q = e4m3(v / s))
};
enum class RoutingMode : uint8_t { kInKernel, kSeparated };
// Expert GEMM implementations: kStream streams weights through mma.sync with the tokens as the narrow side
// (decode: few tokens per expert); kWgmma is the sm_90a tensor-core pipeline (prefill); kGemv is the decode of a
// few tokens (fused finalize, bf16 or FP8-block weights; the heuristic's choice up to T = 4 (bf16) or 8 (FP8);
// two tokens' TOPK + 1 slots per block, <= 18): a matrix-vector product per slot in two kernels, no dispatch and no
// finalize kernel. FP8-block weights run there as W8A16: x and h stay
// bf16 (no activation quantisation), i.e. the reference with bf16 activations.
enum class GemmPath : uint8_t { kStream, kWgmma, kGemv };
// The most tokens GemmPath::kGemv runs (two per block, rows of blocks; moe_gemv.cu).
inline constexpr int kGemvTokenLimit = 32;

const char* weight_format_name(WeightFormat f);
const char* act_format_name(ActFormat f);
const char* gemm_path_name(GemmPath p);

// One set of expert weights: `n` experts stacked (n = EL for the routed experts, 1 for the shared expert).
struct ExpertWeights {
  // Gate/up stacked: rows [0, I) = W_gate (HF w1), rows [I, 2I) = W_up (w3).
  //   kBF16     w13 bf16 [n, 2I, D]
  //   kFP8Block w13 e4m3 [n, 2I, D]     w13_scale f32  [n, 2I/128, D/128]  (K-blocks contiguous)
  //   kMXFP8    w13 e4m3 [n, 2I, D]     w13_scale e8m0 [n, 2I, D/32]
  //   kMXFP4    w13 e2m1 [n, 2I, D/2]   w13_scale e8m0 [n, 2I, D/32]
  //   kNVFP4    w13 e2m1 [n, 2I, D/2]   w13_scale e4m3 [n, 2I, D/16]      w13_global f32 [n]
  const void* w13 = nullptr;
  const void* w13_scale = nullptr;
  const float* w13_global = nullptr;
  // Down: w2 [n, D, I] (packed [n, D, I/2] for fp4), scales [n, D/128, I/128] | [n, D, I/32] | [n, D, I/16].
  const void* w2 = nullptr;
  const void* w2_scale = nullptr;
  const float* w2_global = nullptr;
};

struct MoeParams {
  // ---- set-up (fixed for a layer; moe_unsupported() and moe_workspace_bytes() read only these)
  int D = 0;                            // hidden size (multiple of 128)
  int I = 0;                            // expert intermediate size (multiple of 128); the shared expert's too
  RouterParams router;                  // E, TOPK, groups, renormalise, routed_scaling_factor, HF switch
  int expert_begin = 0;                 // local experts [expert_begin, expert_end) of the E
  int expert_end = -1;                  // -1: all E experts are local
  int max_tokens = 0;                   // largest T of any call (sizes the workspace)
  WeightFormat weight_format = WeightFormat::kBF16;
  ActFormat act_format = ActFormat::kBF16;
  RoutingMode routing = RoutingMode::kInKernel;
  bool do_finalize = true;              // false: deferred finalize (see MoeResult)
  bool has_shared = false;              // shared expert (same I and format as the routed experts)
  int arch = 90;                        // compute capability major*10+minor of the device the op runs on
  std::optional<GemmPath> force_path;   // tests/benchmarks: bypass the heuristic (must be supported)
  bool pdl = true;                      // programmatic dependent launch between the op's kernels (sm_90)
  // Small decode batches on the stream path (T * TOPK <= 512): the expert GEMMs build the routing plan
  // themselves (no dispatch kernel) and GEMM2 finalizes (no finalize kernel): 2 launches for bf16 instead of
  // 4. Same results bit for bit. Off by default: on the H200 (moe_bench 2026-12-03, docs/perf-moe.md) the
  // separate kernels were as fast at T = 1 (47.2 vs 48.2 us bf16) and faster from T = 2 on (up to 1.5x at
  // T = 64): the per-CTA plan and the arrival counters cost more than the two launches they save.
  bool fuse_decode = false;
  // T = 1 (and T = 2 where its slots fit) with fused finalize takes kGemv where it applies (moe_choose_path);
  // false keeps such calls on the stream path (A/B runs: DELTASERVE_MOE_GEMV_DECODE=0 in the engine).
  bool gemv_decode = true;
  // With gemv_decode: the most tokens the heuristic sends to kGemv, 1..kGemvTokenLimit (DELTASERVE_MOE_GEMV_TOKENS);
  // 0: the measured rule (FP8-block weights 8, bf16 4).
  int gemv_tokens = 0;
  // sm_90, FP8-block experts: the tokens past the gemv decode take the wgmma kernels (64-row tiles there, mostly
  // padding) instead of the stream kernel, whatever the routes per expert: their TMA rings keep more weight bytes in
  // flight per SM (H100, Kimi shape, the op alone: T = 16 / 32 / 64 9 / 13 / 16 % faster; docs/perf-moe.md, run 25).
  // The engine with it (H100, FP8 random weights, 1024 / 128): 92.6 against 84.4 tps/user at concurrency 16, 45.3
  // against 39.9 at 64 (docs/perf-engine.md, thirty-fourth session). false (DELTASERVE_MOE_FP8_DECODE_WGMMA=0): the
  // routes-per-expert cut-over of bf16.
  bool fp8_decode_wgmma = true;
  // The gemv path's `down` as a persistent kernel (one wave of blocks, each looping over row pairs with the next
  // pair's weights loaded before the current pair is summed; same bits), where it applies
  // (DELTASERVE_MOE_DOWN_PERSISTENT).
  bool gemv_down_persistent = false;
  // The gemv path's `down` blocks (two rows, or four with gemv_down_rows = 4) load their whole share of W_down into
  // registers before the PDL wait instead of streaming it after (same bits; W_down rows of 32, 64 or 128 16-byte
  // chunks, where gemv_down_persistent_applies; DELTASERVE_MOE_DOWN_PRELOAD in the engine).
  bool gemv_down_preload = true;
  // In-kernel routing at T <= 16 with E <= 256: router GEMM and top-k as one cluster kernel (same routes bit
  // for bit; DELTASERVE_MOE_CLUSTER_ROUTE in the engine). Off until measured on the H200.
  bool cluster_route = false;
  // In-kernel routing at T <= 16 with E <= 256, ungrouped: router GEMM and top-k as one kernel whose last CTA
  // runs the selection (same routes bit for bit; DELTASERVE_MOE_FUSED_ROUTE in the engine) when this arrival
  // counter is given: one int32 of device memory, zero before the first call; every call leaves it zero (one
  // counter may serve every call on a stream). Null: two kernels.
  int32_t* route_counter = nullptr;
  // The layer boundary before the op, in its router kernel (one token, in-kernel routing, the gemv path, two-kernel
  // routing; moe_pre_norm_unsupported() says why not otherwise): pre_residual_out = bf16(pre_residual + pre_add),
  // x = RMSNorm(pre_residual_out) * pre_norm_w, with norm::add_rmsnorm's bits; x (written here: pre_out == x) and
  // the finalize's residual (== pre_residual_out) are then this op's. One launch less per MoE layer.
  const bf16_t* pre_norm_w = nullptr;  // null: x is given normed, as usual
  const bf16_t* pre_add = nullptr;
  const bf16_t* pre_residual = nullptr;
  bf16_t* pre_residual_out = nullptr;
  bf16_t* pre_out = nullptr;
  float pre_eps = 0.0f;
  // Benchmarks: the gemv path's block shapes, h columns per gate/up block (2 or 4) and rows of D per down block
  // (2, 4 or 8); 0 = the measured defaults (moe_gemv.cu).
  int gemv_up_cols = 0, gemv_down_rows = 0;
  // The FP8 wgmma (prefill) GEMMs' tile rows: 64 (every thread loads, a CTA barrier per K step) or 128 (a
  // producer warpgroup with TMA weight tiles feeding two consumer warpgroups); 0 = moe_fp8_prefill_tile_m()'s
  // measured choice. Same bits either way.
  int fp8_prefill_tile_m = 0;
  // The streaming (decode) expert GEMM's token tiles held in registers per pass: 1, 2, 4 or 8 tiles of 8 tokens;
  // a group with more tokens takes several passes over its weight rows (from L2). Fewer tiles, fewer registers:
  // more CTAs per SM. 0 = moe_stream_token_tiles()'s choice. Same bits either way.
  int stream_token_tiles = 0;
  // Benchmarks: events recorded on `stream` just before the gate/up GEMM and just after the down GEMM of the
  // grouped-GEMM paths (not the gemv decode), so the expert GEMMs can be timed apart from routing, dispatch and
  // finalize. nullptr: none (the recording splits the launch chain, so ordinary calls leave them unset).
  cudaEvent_t gemm_begin = nullptr, gemm_end = nullptr;

  // ---- per call
  int T = 0;                            // tokens of this call, 0 <= T <= max_tokens
  const bf16_t* x = nullptr;            // [T, D]
  const bf16_t* gate_w = nullptr;       // [E, D]            in-kernel routing
  const float* gate_bias = nullptr;     // [E] e_score_correction_bias, or nullptr
  const int32_t* topk_ids_in = nullptr; // [T, TOPK]         separated routing (global expert ids)
  const float* topk_weights_in = nullptr;  // [T, TOPK] fp32 separated routing (used as given)
  ExpertWeights experts;                // EL routed experts
  ExpertWeights shared;                 // the shared expert (n = 1) when has_shared
  const bf16_t* residual = nullptr;     // [T, D] or nullptr (fused finalize only)
  // The next layer's input RMSNorm of `out`, fused where the path allows it (the gemv decode):
  // norm_out = RMSNorm(out) * norm_w, the bits of norm::rmsnorm. MoeResult::normed says whether it ran;
  // when it did not, the caller norms as usual. nullptr: no norm.
  const bf16_t* norm_w = nullptr;       // [D]
  bf16_t* norm_out = nullptr;           // [T, D]
  float norm_eps = 1e-6f;

  // ---- outputs
  bf16_t* out = nullptr;                // [T, D] fused finalize (may alias residual)
  int32_t* topk_ids_out = nullptr;      // [T, TOPK] in-kernel routing: optional when fused, required deferred
  float* topk_weights_out = nullptr;    // [T, TOPK] fp32, same rule
  bf16_t* expert_out = nullptr;         // [T, TOPK, D] deferred: y[t, k] (zeros for dropped routes)
  bf16_t* shared_out = nullptr;         // [T, D] deferred with a shared expert
  int32_t* expanded_to_permuted = nullptr;  // [T * TOPK] required deferred, optional fused
  void* workspace = nullptr;            // moe_workspace_bytes() bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// A dense device tensor view with its element type and shape (what crosses the op's boundary; consumers
// check dtype and shape, e.g. fp32 weights are declared kF32, never reinterpreted).
struct MoeTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[3] = {0, 0, 0};
  MoeTensor() = default;
  MoeTensor(void* p, DType t, int64_t d0) : data(p), dtype(t), ndim(1), shape{d0, 0, 0} {}
  MoeTensor(void* p, DType t, int64_t d0, int64_t d1) : data(p), dtype(t), ndim(2), shape{d0, d1, 0} {}
  MoeTensor(void* p, DType t, int64_t d0, int64_t d1, int64_t d2) : data(p), dtype(t), ndim(3), shape{d0, d1, d2} {}
  template <class T> T* ptr() const { return static_cast<T*>(data); }
};

// What the op hands back (device views, dtypes and shapes declared so a consumer can check them).
//   topk_ids     i32 [T, TOPK]   the ids used (separated routing: the caller's own buffer)
//   topk_weights f32 [T, TOPK]   the weights used (separated routing: the caller's own buffer, never a copy
//                                the routing step did not write)
//   expert_out   bf16 [T, TOPK, D]  deferred only
//   shared_out   bf16 [T, D]     deferred with a shared expert
//   expanded_to_permuted i32 [T * TOPK]  row of route t*TOPK+k in the permuted order, -1 if dropped
struct MoeResult {
  MoeTensor topk_ids, topk_weights, expert_out, shared_out, expanded_to_permuted;
  GemmPath path = GemmPath::kStream;
  bool normed = false;  // norm_out was written (MoeParams::norm_w)
};

// nullopt when the op runs this configuration, else the reason (call at load time; never mid-forward).
std::optional<std::string> moe_unsupported(const MoeParams& p);
// Workspace bytes for any call with T <= max_tokens (a pure function of the set-up fields).
size_t moe_workspace_bytes(const MoeParams& p);
// The GEMM implementation a call with T tokens uses on `arch` (a heuristic measured on H200; see docs/moe.md).
GemmPath moe_choose_path(int arch, int T, const MoeParams& p);
// Rows per tile of the FP8 wgmma GEMMs for a call with T tokens (p.fp8_prefill_tile_m, or the measured choice).
int moe_fp8_prefill_tile_m(int T, const MoeParams& p);
// The streaming expert GEMM's token tiles per pass for T tokens (MoeParams::stream_token_tiles when set).
int moe_stream_token_tiles(int T, const MoeParams& p);

// Runs the op on p.stream: no host synchronisation, no allocation (CUDA-graph capturable).
MoeResult moe_forward(const MoeParams& p);
// Why MoeParams::pre_norm_w cannot be honoured for this call (nullopt: it can). No CUDA call.
std::optional<std::string> moe_pre_norm_unsupported(const MoeParams& p);

// Router alone (in-kernel routing's first step, also usable to route for separated mode):
//   logits f32 [T, E] scratch, topk_ids i32 [T, TOPK], topk_weights f32 [T, TOPK].
struct RouteParams {
  RouterParams router;
  int T = 0, D = 0;
  const bf16_t* x = nullptr;            // [T, D]
  const bf16_t* gate_w = nullptr;       // [E, D]
  const float* bias = nullptr;          // [E] or nullptr
  float* logits = nullptr;              // [T, E] written (fp32)
  int32_t* topk_ids = nullptr;          // [T, TOPK]
  float* topk_weights = nullptr;        // [T, TOPK]
  bool logits_given = false;            // true: skip the GEMM and route the logits already in `logits`
  bool cluster = false;                 // T <= 16, E <= 256: GEMM + top-k in one cluster kernel (MoeParams::cluster_route)
  int32_t* route_counter = nullptr;     // T <= 16, E <= 256, ungrouped: one kernel (MoeParams::route_counter)
  bool pdl = true;
  cudaStream_t stream = nullptr;
};
std::optional<std::string> moe_route_unsupported(const RouterParams& r, int D);
void moe_route(const RouteParams& p);

// External finalize for the deferred outputs; checks dtypes and shapes at the boundary and refuses with a
// reason (ds::Error) on any mismatch. out may alias residual.
struct FinalizeParams {
  MoeTensor expert_out;            // bf16 [T, TOPK, D]
  MoeTensor expanded_to_permuted;  // i32 [T * TOPK] (negative: dropped route, contributes nothing)
  MoeTensor topk_weights;          // f32 [T, TOPK]
  MoeTensor shared_out;            // bf16 [T, D] or empty (data == nullptr)
  MoeTensor residual;              // bf16 [T, D] or empty
  MoeTensor out;                   // bf16 [T, D]
  bool pdl = true;
  cudaStream_t stream = nullptr;
};
void moe_finalize(const FinalizeParams& p);

}  // namespace ds::moe
