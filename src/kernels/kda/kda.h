// KDA (Kimi Delta Attention) CUDA ops: decode (one token per sequence, two layouts + selector) and chunked
// prefill (varlen, chunk 64), both from the packed projection output to the gated-normed bf16 output.
//
// Math: spec kimi_linear.md sections 3-4; CPU definitions in kda_ref.h. Design notes: docs/kda.md.
// Dimension names: N sequences, T tokens (all sequences), H heads, K = V = 128 head dims, P = H * K,
// W = 4 conv taps, C = number of 64-token chunks over the batch.
//
// Numerics (both ops): conv + SiLU computed in fp32 and rounded to bf16 (the activation dtype, as HF and
// vLLM do), then L2 norm (eps 1e-6 inside the sqrt) and q scale K^-0.5; gate -exp(A_log)*softplus(f+dt_bias)
// and beta sigmoid in fp32; recurrent state fp32; gated RMSNorm in fp32, output bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

struct CUstream_st;

namespace ds::kda {

using Stream = CUstream_st*;  // = cudaStream_t, without pulling CUDA headers into host code

inline constexpr int kHeadDim = 128;  // K = V: the only head size the kernels are written for
inline constexpr int kConvWidth = 4;  // W
inline constexpr int kChunk = 64;     // prefill chunk (tokens)

// Head counts the compact-heads decode layout is instantiated for: the per-GPU head counts after tensor
// parallelism of the 32-head and 96-head models. The one list every instantiation and check comes from.
#define DS_KDA_COMPACT_HEADS(X) \
  X(1) X(2) X(3) X(4) X(6) X(8) X(12) X(16) X(24) X(32) X(48) X(64) X(96) X(128)

#define DS_KDA_LIST_ITEM_(H) H,
inline constexpr int kCompactHeadCounts[] = {DS_KDA_COMPACT_HEADS(DS_KDA_LIST_ITEM_)};
#undef DS_KDA_LIST_ITEM_
constexpr bool is_compact_head_count(int num_heads) {
  for (int h : kCompactHeadCounts)
    if (h == num_heads) return true;
  return false;
}

// A bf16 matrix view with a row stride: row i starts at ptr + i * stride (elements). Used for column slices
// of the packed projection output, so no repacking copy is needed.
struct Bf16Rows {
  const bf16_t* ptr = nullptr;
  int64_t stride = 0;
};

// ---------------------------------------------------------------------------------------------------------
// Decode: one token per sequence, one kernel per layer. Rows with slot_ids[n] < 0 are padding (CUDA-graph
// batch padding): their output row is zeroed and no state is read or written.
struct KdaDecodeParams {
  int N = 0;                 // rows (sequences, padding rows included)
  int H = 0;                 // heads
  int K = kHeadDim;          // key head dim (must be 128)
  int V = kHeadDim;          // value head dim (must be 128)
  Bf16Rows q, k, v;          // [N, P] each, pre-conv projections
  Bf16Rows beta_logits;      // [N, H] pre-sigmoid
  Bf16Rows f;                // [N, P] forget-gate logits (f_b_proj output, before dt_bias)
  Bf16Rows gz;               // [N, P] output-gate logits (g_b_proj output)
  const int32_t* slot_ids = nullptr;  // [N] device; < 0 = padding row
  int num_slots = 0;                  // slots in both pools (ids must be < num_slots)
  float* state_pool = nullptr;        // [num_slots, H, K, V] fp32, key-major, updated in place
  bf16_t* conv_pool = nullptr;        // [num_slots, W-1, 3P] bf16 (q|k|v channels), oldest row first
  const bf16_t* conv_w = nullptr;     // [3P, W] depthwise conv weights (q|k|v channels)
  const float* A_log = nullptr;       // [H]
  const float* dt_bias = nullptr;     // [P]
  const float* o_norm_w = nullptr;    // [V] o_norm weight (shared by all heads)
  float norm_eps = 1e-5f;             // gated RMSNorm eps (rms_norm_eps)
  bf16_t* out = nullptr;              // [N, H*V] gated-normed output
  int64_t out_stride = 0;             // row stride of out (elements), >= H*V
  // The caller's promise that only f and gz come from the kernel launched right before this one, and that this
  // kernel triggers its dependents only after its own griddepcontrol.wait (the engine's f_b/g_b GEMV pair): the
  // decode kernel then reads everything else (slot ids, state, conv, q/k/v, beta) before its PDL wait.
  bool qkv_ready = false;
};

// kStream: a persistent kernel that streams each head's state through shared memory with bulk copies
// (kda_decode_stream.cu), for large batches (should_use_stream).
enum class KdaLayout : uint8_t { kAuto, kCompact, kMany, kStream };
KdaLayout parse_kda_layout(const std::string& s);  // "auto" | "compact" | "many" | "stream"
const char* kda_layout_name(KdaLayout l);

// Layout heuristic. arch = compute capability major*10+minor (90 = H100/H200). On arch 90 it uses the
// thresholds measured on an H200 (docs/perf.md); on every other arch the legacy rule: compact iff H == 2.
// Never true for a head count without a compact instantiation.
bool should_use_compact_heads(int arch, int num_seqs, int num_heads);
// The streaming layout: on arch 90 for N * H at or above a measured item count (any head count); never elsewhere
// (not measured). Takes precedence over should_use_compact_heads.
bool should_use_stream(int arch, int num_seqs, int num_heads);

// Per-process decode set-up: the device's arch and DELTASERVE_KDA_LAYOUT, read once here (not per call).
struct KdaDecodeSetup {
  int arch = 0;
  KdaLayout layout = KdaLayout::kAuto;
};
KdaDecodeSetup kda_decode_setup();

// Resolves the layout of one call (kCompact, kMany or kStream, never kAuto). Throws ds::Error when the compact
// layout is forced for a head count that has no instantiation (never runs it with another count's layout).
KdaLayout kda_decode_layout(const KdaDecodeSetup& setup, int num_seqs, int num_heads);

// Why these params cannot run (shape, null pointer, alignment), or nullopt. Alignment contract: q, k, v, f,
// gz, out base pointers 8-byte aligned and their strides multiples of 4 elements (the kernels read 4
// channels per 8-byte access); state_pool 16-byte aligned; beta_logits has no alignment requirement.
std::optional<std::string> kda_decode_unsupported(const KdaDecodeParams& p);

// Checks the params, picks the layout and launches. Throws ds::Error with the reason if unsupported.
void kda_decode(const KdaDecodeParams& p, const KdaDecodeSetup& setup, Stream stream);
// The single dispatch point (kCompact -> the kFixedHeads == p.H instantiation; kAuto runs many-heads). No checks
// beyond the head count.
void kda_decode_launch(const KdaDecodeParams& p, KdaLayout layout, Stream stream);

// ---------------------------------------------------------------------------------------------------------
// Chunked prefill: variable-length batch, chunk 64. Each sequence n reads its initial recurrent and conv
// state from slot slot_ids[n] and writes the final ones back (a new sequence's slot must be zeroed by the
// caller). slot < 0 = padding sequence: its output rows are zeroed, no state is touched. Empty sequences
// leave their state untouched.
struct KdaPrefillParams {
  int N = 0;                 // sequences
  int T = 0;                 // total tokens = cu_seqlens[N]
  int H = 0;
  int K = kHeadDim;
  int V = kHeadDim;
  const int32_t* cu_seqlens = nullptr;     // [N + 1] device, token offsets
  const int32_t* chunk_offsets = nullptr;  // [N + 1] device, first chunk of each sequence (kda_chunk_offsets)
  int num_chunks = 0;                      // C = chunk_offsets[N] (host value, sizes the grid)
  Bf16Rows q, k, v;          // [T, P] pre-conv projections
  Bf16Rows beta_logits;      // [T, H]
  Bf16Rows f;                // [T, P]
  Bf16Rows gz;               // [T, P]
  const int32_t* slot_ids = nullptr;  // [N] device
  int num_slots = 0;
  float* state_pool = nullptr;        // [num_slots, H, K, V] fp32
  bf16_t* conv_pool = nullptr;        // [num_slots, W-1, 3P] bf16
  const bf16_t* conv_w = nullptr;     // [3P, W]
  const float* A_log = nullptr;       // [H]
  const float* dt_bias = nullptr;     // [P]
  const float* o_norm_w = nullptr;    // [V]
  float norm_eps = 1e-5f;
  bf16_t* out = nullptr;              // [T, H*V]
  int64_t out_stride = 0;
  void* workspace = nullptr;          // kda_prefill_workspace_bytes(num_chunks, H) bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  // Profiling only (kda_bench --intra-phases): when set, the intra kernel adds each CTA's SM cycles per phase
  // to [kKdaIntraPhases] device counters (one clock read and one atomic per phase and CTA; null in production).
  unsigned long long* intra_phase_cycles = nullptr;
  // Benchmarks and tests only: force the scan's configuration, V-tiles per head (4: 32 columns per CTA, 2: 64)
  // and factor stages (4 tiles: 3 or 1; 2 tiles: 2 or 1); 0 and 0 take the measured rule (kda_prefill_scan_config).
  int scan_vtiles = 0;
  int scan_stages = 0;
  // Benchmarks and tests only: the scan's factor loader, kKdaScanLoaderCpAsync or kKdaScanLoaderBulk; 0 takes
  // kKdaScanLoaderDefault.
  int scan_loader = 0;
  // Benchmarks and tests only: the SiLU of the intra kernel's short conv, kKdaSiluExact or kKdaSiluTanh; 0 takes
  // kKdaSiluDefault.
  int intra_silu = 0;
};
// SiLU forms of the prefill's conv: z / (1 + e^-z) on two MUFU ops (ex2, rcp), or z/2 (1 + tanh(z/2)) on one
// (tanh.approx, max relative error ~2^-11: an absolute error of at most |z| 2^-12, an eighth of a bf16 ulp of z).
// tanh is the default: H100, 2026-12-07, intra kernel -1.0 to -2.4 % at every targets shape (8192 x 1 408 -> 401 us,
// 32768 x 1 1,564 -> 1,527), error statistics unchanged to 3 digits (docs/perf.md).
inline constexpr int kKdaSiluExact = 1;
inline constexpr int kKdaSiluTanh = 2;
inline constexpr int kKdaSiluDefault = kKdaSiluTanh;
// Factor loaders of the scan: cp.async from every thread, or six bulk copies (TMA) per stage on an mbarrier.
inline constexpr int kKdaScanLoaderCpAsync = 1;
inline constexpr int kKdaScanLoaderBulk = 2;
// The loader production launches take: bulk copies won in every configuration and shape (H200, 2026-12-05,
// docs/perf.md: 8192 x 1, H = 32 at 4 x 3 327 -> 259 us).
inline constexpr int kKdaScanLoaderDefault = kKdaScanLoaderBulk;
inline constexpr int kKdaIntraPhases = 6;  // conv/norms/gate, cumsum, Akk/Aqk, qg/kd, inverse, W/U

// Host-side plan: chunk offsets [N + 1] from host cu_seqlens [N + 1] (ceil(len / 64) chunks per sequence).
std::vector<int32_t> kda_chunk_offsets(const std::vector<int32_t>& cu_seqlens);
size_t kda_prefill_workspace_bytes(int num_chunks, int H);

// Per-(chunk, head) factors the intra-chunk stage writes into the workspace and the scan stage reads (spec
// 4.1; Gamma = in-chunk cumulative log-decay, rows at and beyond the chunk's length are zero). Each tile is
// stored the way the scan keeps it in shared memory, so the scan fetches it with one contiguous copy. Rows are
// not padded (padded rows straddled the 32-byte sectors and cost the intra stage 25 % on the H200); instead the
// 16-byte chunks of each row are permuted so that the scan's ldmatrix (8 rows, one chunk column) and float2
// reads (4 rows x 2 chunks per half-warp) hit distinct banks. Each permutation maps aligned chunk pairs to
// aligned chunk pairs, so a row's 32-byte sectors keep their bytes and the intra stage's stores stay coalesced.
//   qg, kd, w: [64][128] bf16, chunk c of row r at c ^ (r & 7)
//   aqk:       [64][64] bf16,  chunk c of row r at c ^ (r & 7)
//   u:         4 blocks of 32 columns (one per 32-column scan V-tile), each [64][32] fp32, chunk c at c ^ 2(r & 3)
inline constexpr int kKdaUBlock = 32;
// Offsets of element (row r, column c) within a tile. The bf16 tiles share one swizzle (8 bf16 per 16-byte chunk).
template <int kRowElems>
constexpr int kda_bf16_swizzled_offset(int r, int c) { return r * kRowElems + (((c >> 3) ^ (r & 7)) << 3) + (c & 7); }
constexpr int kda_factor_offset(int r, int c) { return kda_bf16_swizzled_offset<kHeadDim>(r, c); }
constexpr int kda_aqk_offset(int r, int c) { return kda_bf16_swizzled_offset<kChunk>(r, c); }
constexpr int kda_u_offset(int r, int c) {
  return (c / kKdaUBlock) * kChunk * kKdaUBlock + r * kKdaUBlock + ((((c % kKdaUBlock) >> 2) ^ ((r & 3) << 1)) << 2) +
         (c & 3);
}
inline constexpr int kKdaFactorTile = kChunk * kHeadDim;  // elements per qg, kd or w tile
inline constexpr int kKdaAqkTile = kChunk * kChunk;       // per Aqk tile
inline constexpr int kKdaUTile = kChunk * kHeadDim;       // per u tile
struct KdaChunkFactors {
  bf16_t* qg;   // [C, H, 64, K]  q^ * exp(Gamma)                 (q^ includes the K^-0.5 scale)
  bf16_t* kd;   // [C, H, 64, K]  k^ * exp(Gamma_last - Gamma)    (keys decayed to the chunk end)
  bf16_t* w;    // [C, H, 64, K]  M (beta exp(Gamma) k^)          (WY factor)
  float* u;     // [C, H, 64, V]  M (beta v)                      (fp32: it feeds the output almost directly)
  bf16_t* aqk;  // [C, H, 64, 64] lower-triangular (diagonal included) q^ k^ exp(Gamma_r - Gamma_j)
  float* gl;    // [C, H, K]      exp(Gamma_last)
  bf16_t* o;    // [T, H, V]      the scan's output before the gated RMSNorm, bf16 as the model's o (sized for
                //                C * 64 >= T rows)
};
KdaChunkFactors kda_chunk_factors(void* workspace, int num_chunks, int H);

std::optional<std::string> kda_prefill_unsupported(const KdaPrefillParams& p);
// Both stages (checks first; throws ds::Error with the reason if unsupported).
void kda_prefill(const KdaPrefillParams& p, Stream stream);
// The two stages, exposed for tests: conv/gate/norms + intra-chunk factors, then the state scan + output
// (the scan stage also runs the gated RMSNorm kernel).
void kda_prefill_intra(const KdaPrefillParams& p, Stream stream);
void kda_prefill_scan(const KdaPrefillParams& p, Stream stream);
struct KdaScanConfig {
  int vtiles;  // CTAs per (sequence, head), each keeping a 128 x (128 / vtiles) slice of the state: 4 or 2
  int stages;  // factor stages in shared memory: 3 (4 tiles) or 2 (2 tiles) at one CTA per SM, or 1 at two
};
// The scan configuration this launch takes: p.scan_vtiles / p.scan_stages when set, else the measured rule below
// for the current device's SM count (queried once).
KdaScanConfig kda_prefill_scan_config(const KdaPrefillParams& p);
// The rule itself, for `head_seqs` (sequences x heads) on `sms` SMs: the configuration with the fewest waves x
// cost per wave, the costs measured on the H200 relative to 4 tiles x 3 stages (kda_dispatch.cpp).
KdaScanConfig kda_prefill_scan_config_for(int64_t head_seqs, int sms);

}  // namespace ds::kda
