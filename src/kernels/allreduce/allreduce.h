// Fused MoE finalize + all-reduce + residual add + RMSNorm (tensor parallel, one node) and the plain one-shot
// peer all-reduce that shares its buffers. Host API, capability gating and buffer layout; protocol in lamport.h.
//
// Dimension names: T tokens, D hidden, TOPK routes per token, R ranks (tensor-parallel degree).
//
// The fused op, per rank r and token t (numerics contract, the same as the unfused path
// moe_finalize -> all-reduce in the activation dtype -> add_rmsnorm):
//   partial_r[t] = act( sum_k w[t,k] * expert_out[t,k] + shared_out[t] )   fp32, k ascending, dropped routes
//                                                                          (expanded_to_permuted < 0) skipped
//   sum[t]       = act( partial_0[t] + partial_1[t] + ... + partial_{R-1}[t] )   fp32 in rank order: every
//                                                                          rank gets the same bits
//   residual[t]  = act( residual[t] + sum[t] )                             written back
//   y[t]         = act( norm_w * (residual[t] * rsqrt(mean(residual[t]^2) + eps)) )
// act() rounds to the activation dtype (bf16 or fp16, nearest-even). shared_out: pass each rank's partial
// shared-expert output when the shared expert is tensor-parallel (every rank), or the full output on exactly
// one rank when it is replicated (nullptr elsewhere); it is added before the cross-rank sum either way.
//
// This header stays free of fmt (core/error.h): nvcc in C++20 mode rejects fmt's consteval format strings, and
// the kernels include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/align.h"
#include "core/dtype.h"
#include "kernels/allreduce/lamport.h"

typedef struct CUstream_st* cudaStream_t;  // the same declaration as cuda_runtime.h

namespace ds::allreduce {

inline constexpr int kThreads = 128;    // threads per block of both kernels
inline constexpr int kMaxTopk = 16;
inline constexpr int kMinD = 8, kMaxD = 8192;
inline constexpr uint64_t kDefaultTimeoutNs = 10'000'000'000ull;  // 10 s: far beyond any healthy wait

// Every operand of both ops is read and written in 16-byte vectors (ds::aligned16 checks them).

// ---------------------------------------------------------------------------------------------- buffers
// One rank's buffer set, one device allocation: [ArState | sum-of-squares slots | receive slots
// [2 parities][R sources][slot_elems halves]]. Peers write only the receive slots.
size_t buffer_bytes(int world, size_t slot_elems);
size_t data_offset_bytes();  // where the receive slots start (256-byte aligned)

// This rank's view of the set (what the kernels take; plain pointers, so it is CUDA-graph friendly: the
// epoch lives in device memory).
struct RankView {
  int rank = 0;
  int world = 0;                          // R
  uint32_t* peer_data[kMaxRanks] = {};    // receive slots of every rank as mapped in this process (own included)
  uint32_t* ss = nullptr;                 // own sum-of-squares slots [2][kMaxTokens][kMaxChunks]
  ArState* state = nullptr;               // own
  size_t slot_elems = 0;                  // capacity of one (parity, source) slot in half elements
  uint64_t timeout_ns = kDefaultTimeoutNs;
  cudaStream_t owner_stream = nullptr;    // the one stream allowed to run ops on this set (one call in flight)
  int co_resident_ranks = 1;              // rank kernels sharing this device (R when ranks are simulated on one)
  int resident_blocks = 0;                // blocks of kThreads the device holds at once (SMs x blocks per SM)
};
// The view of rank `rank` given every rank's allocation base (as mapped in this process).
RankView make_rank_view(void* const* bases, int rank, int world, size_t slot_elems);

// Blocks of kThreads that `device` holds at once for the protocol kernels (SMs x the smallest per-SM occupancy
// of any of them): the co-residency bound that fused_ar_norm_grid() and peer_all_reduce_blocks() respect.
int device_resident_blocks(int device);

// Resets a freshly allocated buffer set (sentinels, zero state). Stream-ordered.
void init_buffers(void* base, int world, size_t slot_elems, cudaStream_t stream);
// Reads the sticky error word (synchronous); 0 when healthy. describe_error() turns it into words.
uint32_t read_error(const RankView& v);
// The whole protocol state (synchronous), for diagnostics: equal epochs on every rank after a timeout mean one
// rank's kernel never ran; different epochs mean the ranks' calls fell out of step.
ArState read_state(const RankView& v);
std::string describe_error(uint32_t code);

// --------------------------------------------------------------------------------------------- gating
// Everything the capability check needs, known at load time except T.
struct FusedArNormConfig {
  int world = 0;                // R
  DType dtype = DType::kBF16;   // activations
  bool peer_access = false;     // every rank can load and store every other rank's buffers
  int D = 0;
  int TOPK = 0;
  size_t slot_elems = 0;        // buffer capacity per (parity, source) slot, half elements
  int max_tokens = 2;           // DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS (0 disables)
  int T = 0;                    // tokens of this call
  bool aligned = true;          // every operand 16-byte aligned
  int co_resident_ranks = 1;
  int resident_blocks = 0;      // 0: unknown (no co-residency check)
};
// nullopt when the fused kernel runs this configuration, else the reason (the caller falls back to the
// unfused path and logs the reason once).
std::optional<std::string> fused_ar_norm_unsupported(const FusedArNormConfig& c);

// Launch shape of the fused op: `chunks` blocks per token, each thread holding `vpt` vectors of 8 values.
struct FusedGrid {
  int chunks = 0;
  int vpt = 0;
};
// Fewest vectors per thread (most blocks streaming the expert rows) that keeps every rank kernel sharing the
// device co-resident (resident_blocks = 0: unknown, take vpt = 1); nullopt when none does.
std::optional<FusedGrid> fused_ar_norm_grid(int T, int D, int co_resident_ranks, int resident_blocks,
                                            int force_vpt = 0);
// Blocks of the plain all-reduce for `count` elements (grid-strided; bounded for co-residency).
int peer_all_reduce_blocks(size_t count, int co_resident_ranks, int resident_blocks);

// ------------------------------------------------------------------------------------------------ ops
struct FusedArNormParams {
  DType dtype = DType::kBF16;          // of expert_out, shared_out, residual, norm_w, y
  int T = 0, D = 0, TOPK = 0;
  float eps = 1e-5f;
  const void* expert_out = nullptr;    // [T, TOPK, D]
  const int32_t* expanded_to_permuted = nullptr;  // [T * TOPK] negative: dropped route
  const float* topk_weights = nullptr; // [T, TOPK] fp32 (the weights the MoE op used)
  const void* shared_out = nullptr;    // [T, D] or nullptr (see the contract above)
  const void* residual = nullptr;      // [T, D] in
  void* residual_out = nullptr;        // [T, D] out (may alias residual)
  const void* norm_w = nullptr;        // [D] the next layer's RMSNorm weight
  void* y = nullptr;                   // [T, D] (must not alias residual / residual_out)
  RankView comm;
  int force_vpt = 0;                   // benchmarks: 1, 2 or 4 vectors per thread; 0 = fused_ar_norm_grid
  cudaStream_t stream = nullptr;       // must be comm.owner_stream when that is set
};
// Validates (ds::Error with the reason) and launches; no allocation, no host synchronisation.
void fused_finalize_ar_norm(const FusedArNormParams& p);

// out = act(sum over ranks of in) in rank order (the same sum as the fused op); count % 8 == 0,
// count <= slot_elems. out may alias in.
struct PeerAllReduceParams {
  DType dtype = DType::kBF16;
  size_t count = 0;
  const void* in = nullptr;            // [count]
  void* out = nullptr;                 // [count]
  RankView comm;
  cudaStream_t stream = nullptr;
};
void peer_all_reduce(const PeerAllReduceParams& p);

namespace detail {
// Raises ds::Error for a failed CUDA call (defined in allreduce_check.cpp, where fmt is allowed).
[[noreturn]] void throw_cuda_error(int err, const char* expr, const char* file, int line);
void launch_fused_ar_norm(const FusedArNormParams& p, const FusedGrid& g);
void launch_peer_all_reduce(const PeerAllReduceParams& p, int blocks);
}  // namespace detail

}  // namespace ds::allreduce
