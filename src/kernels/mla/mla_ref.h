// MLA (NoPE multi-head latent attention) CPU references in fp32: latent-cache append, the expanded attention
// (prefill) and the weight-absorbed attention (decode). The CUDA kernels are tested against these.
//
// Spec section 5. Projections (q_proj, kv_a_proj_with_mqa, o_proj) are the caller's GEMMs. The "rope" dims are
// used unrotated (NoPE). Dimension names: T new tokens (all sequences), N sequences, H heads, L latent (512),
// Dn nope head dim (128), Dr rope head dim (64), Dv value head dim (128), R = L + Dr (576) values per cache row.
//
// Latent cache (vLLM layout, paged): data [num_blocks, block_size, R]; a row is [c_n (L) ; k_pe (Dr)], c_n already
// passed through kv_a_layernorm. Position p of sequence n lives at global row
//   block_table[n * max_blocks_per_seq + p / block_size] * block_size + p % block_size.
// A contiguous per-sequence cache is the special case N = 1, block_table = {0}, block_size >= length.
#pragma once

#include <cstdint>

namespace ds::mla {

struct LatentCache {
  float* data = nullptr;                 // [num_blocks, block_size, R]
  const int32_t* block_table = nullptr;  // [N, max_blocks_per_seq]
  int block_size = 0;
  int max_blocks_per_seq = 0;

  // Global row index of position p of sequence n.
  int64_t row(int n, int64_t p) const {
    const int64_t blk = block_table[static_cast<int64_t>(n) * max_blocks_per_seq + p / block_size];
    return blk * block_size + p % block_size;
  }
};

// concat_and_cache_mla with kv_a_layernorm folded in: for each new token t,
//   data[slot_mapping[t]] = [ RMSNorm(ckv[t, :L]) * norm_w ; ckv[t, L:L+Dr] ].
// eps: the reference uses config.rms_norm_eps (1e-5, vLLM's choice). HF builds kv_a_layernorm with the
// KimiRMSNorm default 1e-6; the effect is far below bf16 resolution for real latents (spec section 9.2).
//   ckv [T, L + Dr] (kv_a_proj_with_mqa output), norm_w [L], slot_mapping [T] (global rows; < 0 = skip)
void append_latent_ref(const float* ckv, const float* norm_w, float eps, const int64_t* slot_mapping, int T, int L,
                       int Dr, float* cache_data);

struct AttentionArgs {
  const float* q = nullptr;           // [T, H, Dn + Dr] q_proj output of the new tokens, sequence after sequence
  const int32_t* cu_seqlens = nullptr;  // [N + 1] new-token offsets into q/out; a sequence may have 0 new tokens
  const int32_t* ctx_lens = nullptr;  // [N] cached rows per sequence INCLUDING its new tokens (already appended;
                                      //     the new tokens are the last cu_seqlens[n+1]-cu_seqlens[n] rows)
  LatentCache cache;                  // read only
  const float* wkv_b = nullptr;       // [H * (Dn + Dv), L] kv_b_proj: head h rows h*(Dn+Dv) + [0, Dn) = k_nope,
                                      //                    + [Dn, Dn+Dv) = v
  int N = 0, H = 0, L = 0, Dn = 0, Dr = 0, Dv = 0;
  float scale = 0.0f;                 // (Dn + Dr)^-0.5 = 192^-0.5
  float* out = nullptr;               // [T, H, Dv] attention output (before o_proj)
};

// Expanded form (prefill): k_nope/v of every cached row are rebuilt as kv_b_proj(c_n); new token i of a sequence
// with `past` earlier rows attends causally to rows [0, past + i]:
//   score_j = (q_nope . k_nope_j + q_pe . k_pe_j) * scale,  out = softmax_j(score) . v_j   (fp32 softmax)
void attention_expanded_ref(const AttentionArgs& a);

// Weight-absorbed form (decode; any number of new tokens is allowed, with the same causal rule):
//   q~_h = Wuk_h^T q_nope_h [L],  score_j = (q~_h . c_n_j + q_pe_h . k_pe_j) * scale,
//   lat_h = sum_j p_j c_n_j [L],  out_h = Wuv_h lat_h [Dv]
// where Wuk_h / Wuv_h are the k_nope / v row blocks of head h in wkv_b. Equal to the expanded form up to
// fp32 rounding.
void attention_absorbed_ref(const AttentionArgs& a);

}  // namespace ds::mla
