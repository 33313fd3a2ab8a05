// MLA (NoPE multi-head latent attention) CUDA ops: the fused A-GEMM (q_proj + kv_a_proj_with_mqa in one GEMM),
// the paged latent-cache write (kv_a_layernorm fused), expanded prefill attention and weight-absorbed split-K
// decode attention. Math and cache layout: spec kimi_linear.md section 5, references in mla_ref.h.
//
// Dimension names: T new tokens (all sequences), N sequences, H heads, L latent (512), Dr rope dims (64, used
// unrotated), Dn nope dims (128), Dv value dims (128), R = L + Dr = 576 values per cache row, D hidden (2304).
//
// Paged latent cache: data [num_pages, page_size, R] bf16, one row per token per layer: [c_n (L) ; k_pe (Dr)],
// c_n already normalised by kv_a_layernorm. Position p of sequence n lives at page
// block_table[n * max_pages_per_seq + p / page_size], slot p % page_size (int32 page tables, one row per sequence).
//
// The q and ckv inputs of the attention ops are the column slices of the fused A-GEMM output [T, H*192 + 576]:
// q = out[:, 0 : H*192] and ckv = out[:, H*192 :], passed as pointer + row stride (elements). The A-GEMM itself
// only accepts dense operands; the kernels below read the slices through their explicit strides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "kernels/gemm/gemm.h"

namespace ds::mla {

inline constexpr int kLatent = 512;            // L  (kv_lora_rank)
inline constexpr int kRope = 64;               // Dr (qk_rope_head_dim)
inline constexpr int kNope = 128;              // Dn (qk_nope_head_dim)
inline constexpr int kValue = 128;             // Dv (v_head_dim)
inline constexpr int kRow = kLatent + kRope;   // R = 576
inline constexpr int kQk = kNope + kRope;      // 192: q row per head, softmax scale 192^-0.5
inline constexpr int kMaxHeads = 128;          // heads per GPU accepted by the kernels

struct MlaDims {
  int heads = 32;  // H on this GPU
  int latent = kLatent, rope = kRope, nope = kNope, value = kValue;
};

// nullopt when the kernels support these dims (512/64/128/128, 1 <= H <= 128); else the reason.
std::optional<std::string> mla_unsupported(const MlaDims& d);

// ---- 1. fused A-GEMM: out[T, H*192 + 576] = x[T, D] @ W_a[H*192 + 576, D]^T, W_a = [q_proj ; kv_a_proj_with_mqa]
struct FusedAParams {
  TensorView x;        // [T, D] bf16 (or e4m3 with x_scale for FP8 weights)
  TensorView w;        // [H*192 + 576, D] packed weight, bf16 or e4m3
  TensorView x_scale;  // FP8 only, layout of gemm.h
  TensorView w_scale;  // FP8 only, [ceil((H*192+576)/128), D/128]: q_proj's and kv_a's scales stacked
  TensorView out;      // [T, H*192 + 576] bf16
  int heads = 32;      // H
  int hidden = 2304;   // D
  const bf16_t* norm_w = nullptr;  // decode GEMV only: x un-normalised, RMSNorm(x) * norm_w applied (gemm.h)
  float norm_eps = 0.0f;
};
// Host checks (no CUDA call): every operand dense, on the GPU, 16-byte aligned, right dtype and shape; the
// reason names the operand. fused_a_gemm() runs these before touching the GPU.
std::optional<std::string> fused_a_unsupported(const FusedAParams& p);
void fused_a_gemm(gemm::GemmRunner& runner, const FusedAParams& p, CUstream_st* stream);

// Load time: packed[0 : H*192] = q_proj, packed[H*192 :] = kv_a (device-to-device row copies). For FP8 weights
// the 128x128 scales stack the same way (H*192 is a multiple of 128, so no block straddles the seam).
struct PackFusedAParams {
  TensorView q_proj;  // [H*192, D]
  TensorView kv_a;    // [576, D]
  TensorView packed;  // [H*192 + 576, D], same dtype
  // FP8 only (all empty for bf16): f32 128x128 block scales, K-blocks contiguous
  TensorView q_scale;       // [H*192/128, D/128]
  TensorView kv_a_scale;    // [5, D/128] (576 rows = 4.5 blocks, the last one partial)
  TensorView packed_scale;  // [ceil((H*192 + 576)/128), D/128]
};
void pack_fused_a_weight(const PackFusedAParams& p, CUstream_st* stream);

// ---- 2. cache write (concat_and_cache_mla with kv_a_layernorm fused)
struct CacheWriteParams {
  const bf16_t* ckv = nullptr;          // [T, 576] rows of stride ckv_stride: [c (512) ; k_pe (64)]
  int64_t ckv_stride = kRow;            // elements between token rows (H*192 + 576 when reading the A-GEMM output)
  const bf16_t* norm_w = nullptr;       // [512] kv_a_layernorm.weight
  const int64_t* slot_mapping = nullptr;  // [T] global cache row (page * page_size + slot); < 0: padding, skipped
  bf16_t* cache = nullptr;              // [num_pages * page_size, 576]
  int T = 0;
  float eps = 1e-5f;                    // spec section 9.2: vLLM's rms_norm_eps (HF's default would be 1e-6)
};
std::optional<std::string> cache_write_unsupported(const CacheWriteParams& p);
void cache_write(const CacheWriteParams& p, CUstream_st* stream);

struct PagedCache {
  const bf16_t* data = nullptr;           // [num_pages, page_size, 576]
  const int32_t* block_table = nullptr;   // [N, max_pages_per_seq]
  int page_size = 0;
  int max_pages_per_seq = 0;
};

// ---- 3. decode: one new token per sequence, weight-absorbed, split-K over the context
//   q~_h = Wuk_h^T q_nope_h (512), s_j = (q~_h . c_n_j + q_pe_h . k_pe_j) * scale, lat_h = sum_j p_j c_n_j,
//   out_h = Wuv_h lat_h (128). Splits are merged with log-sum-exp.
struct DecodeParams {
  const bf16_t* q = nullptr;        // [N, H, 192] rows of stride q_stride (token n at q + n * q_stride)
  int64_t q_stride = 0;
  const bf16_t* wkv_b = nullptr;    // [H * 256, 512] kv_b_proj.weight (head h: rows h*256 + [0,128) k, [128,256) v)
  PagedCache cache;
  const int32_t* ctx_lens = nullptr;  // [N] cached rows incl. the new token (already written); 0 = padding row
  int N = 0, H = 0;
  int num_splits = 1;               // from decode_num_splits(); fixed per graph
  int variant = 0;                  // split kernel: 0 = decode_variant(arch); 1 = 4-warp column split,
                                    // 2 = 8-warp K split (tests and benchmarks force each)
  float scale = 0.0f;               // 192^-0.5
  void* workspace = nullptr;        // decode_workspace_bytes(N, H, num_splits) bytes, 256-byte aligned
  bf16_t* out = nullptr;            // [N, H, 128] dense
  // Decode-only steps: the q-absorption kernel's extra blocks also write the N tokens' cache rows (cache_write's
  // code, the same bits; write->T must be N), one launch less than cache_write + decode. Null: the caller ran
  // cache_write. The decode kernels read the cache after the absorption kernel completes (PDL wait).
  const CacheWriteParams* write = nullptr;
};
size_t decode_workspace_bytes(int N, int H, int num_splits);
// Heuristic (arch-keyed): enough (sequence, head-group, split) blocks to fill num_sms once, never splits shorter
// than 64 rows (one KV tile) for max_ctx. A CUDA-graph runner passes its capacity as max_ctx so the grid stays fixed.
int decode_num_splits(int arch, int num_sms, int N, int H, int max_ctx);
// Which split kernel an architecture gets (1 or 2, see DecodeParams::variant); measured on sm_90 (docs/perf-mla.md).
int decode_variant(int arch);
std::optional<std::string> decode_unsupported(const DecodeParams& p);
void decode(const DecodeParams& p, CUstream_st* stream);

// ---- 4. prefill: expanded form. K/V are materialised for every cached row of the batch's sequences (earlier
// context + the new tokens, which are already in the cache): c_n rows are gathered from the pages, one GEMM
// kv = c_n @ Wkv_b^T gives [k_nope ; v] per head, then a causal FlashAttention-2 kernel (mma.sync bf16, online
// softmax) runs over them. Costs 2 * ctx * 512 * H * 256 FLOP for the expansion against ~2 * ctx * T * H * 1088
// for absorbed attention: expanding wins for chunks longer than ~170 tokens (docs/mla.md).
struct PrefillParams {
  const bf16_t* q = nullptr;          // [T, H, 192] rows of stride q_stride
  int64_t q_stride = 0;
  const bf16_t* wkv_b = nullptr;      // [H * 256, 512]
  PagedCache cache;
  const int32_t* cu_seqlens = nullptr;  // [N + 1] device: new-token offsets (a sequence may have 0 new tokens)
  const int32_t* ctx_lens = nullptr;    // [N] device: cached rows incl. the new tokens
  const int32_t* cu_ctx = nullptr;      // [N + 1] device: prefix sums of ctx_lens
  int N = 0, H = 0, T = 0;
  int total_ctx = 0;                  // host: cu_ctx[N]
  int max_new_tokens = 0;             // host: max over n of the new tokens (grid size)
  float scale = 0.0f;
  void* workspace = nullptr;          // prefill_workspace_bytes(total_ctx, H) bytes, 256-byte aligned
  bf16_t* out = nullptr;              // [T, H, 128] dense
};
size_t prefill_workspace_bytes(int total_ctx, int H);
std::optional<std::string> prefill_unsupported(const PrefillParams& p);
void prefill(gemm::GemmRunner& runner, const PrefillParams& p, CUstream_st* stream);

}  // namespace ds::mla
