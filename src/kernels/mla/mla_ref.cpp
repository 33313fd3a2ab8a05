// MLA references: latent append, expanded and weight-absorbed attention (see mla_ref.h).
#include "kernels/mla/mla_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu_math.h"
#include "core/error.h"
#include "kernels/norm/norm_ref.h"

namespace ds::mla {

namespace {


// In-place softmax over n scores (max-subtracted, fp32).
void softmax(float* s, int n) {
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) m = std::max(m, s[j]);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; ++j) s[j] *= inv;
}

void check_args(const AttentionArgs& a) {
  CHECK(a.q && a.cu_seqlens && a.ctx_lens && a.cache.data && a.cache.block_table && a.wkv_b && a.out,
        "MLA attention: null pointer argument");
  CHECK(a.N >= 0 && a.H > 0 && a.L > 0 && a.Dn > 0 && a.Dr >= 0 && a.Dv > 0, "N={} H={} L={} Dn={} Dr={} Dv={}",
        a.N, a.H, a.L, a.Dn, a.Dr, a.Dv);
  CHECK(a.cache.block_size > 0 && a.cache.max_blocks_per_seq > 0, "block_size={} max_blocks={}",
        a.cache.block_size, a.cache.max_blocks_per_seq);
  for (int n = 0; n < a.N; ++n) {
    const int tn = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    CHECK(tn >= 0 && a.ctx_lens[n] >= tn, "sequence {}: {} new tokens, {} cached rows", n, tn, a.ctx_lens[n]);
    CHECK_LE(static_cast<int64_t>(a.ctx_lens[n]),
             static_cast<int64_t>(a.cache.max_blocks_per_seq) * a.cache.block_size);
  }
}

}  // namespace

void append_latent_ref(const float* ckv, const float* norm_w, float eps, const int64_t* slot_mapping, int T, int L,
                       int Dr, float* cache_data) {
  const int R = L + Dr;
  for (int t = 0; t < T; ++t) {
    if (slot_mapping[t] < 0) continue;  // padding row: touches nothing
    float* row = cache_data + slot_mapping[t] * R;
    const float* src = ckv + static_cast<size_t>(t) * R;
    norm::rmsnorm_ref(src, norm_w, 1, L, eps, row);
    std::copy(src + L, src + R, row + L);
  }
}

void attention_expanded_ref(const AttentionArgs& a) {
  check_args(a);
  const int R = a.L + a.Dr, Dq = a.Dn + a.Dr, Dkv = a.Dn + a.Dv;
  std::vector<float> kv, scores;
  for (int n = 0; n < a.N; ++n) {
    const int t0 = a.cu_seqlens[n], tn = a.cu_seqlens[n + 1] - t0, ctx = a.ctx_lens[n], past = ctx - tn;
    if (tn == 0) continue;
    // kv[j, h, :] = [k_nope ; v] = wkv_b_h . c_n_j for every cached row (the expansion prefill pays for).
    kv.assign(static_cast<size_t>(ctx) * a.H * Dkv, 0.0f);
    for (int j = 0; j < ctx; ++j) {
      const float* c = a.cache.data + a.cache.row(n, j) * R;
      for (int r = 0; r < a.H * Dkv; ++r)
        kv[static_cast<size_t>(j) * a.H * Dkv + r] = dot_f32(a.wkv_b + static_cast<size_t>(r) * a.L, c, a.L);
    }
    scores.resize(ctx);
    for (int i = 0; i < tn; ++i) {
      const int visible = past + i + 1;  // causal: rows [0, past + i]
      for (int h = 0; h < a.H; ++h) {
        const float* q = a.q + (static_cast<size_t>(t0 + i) * a.H + h) * Dq;
        for (int j = 0; j < visible; ++j) {
          const float* k_nope = kv.data() + (static_cast<size_t>(j) * a.H + h) * Dkv;
          const float* k_pe = a.cache.data + a.cache.row(n, j) * R + a.L;
          scores[j] = (dot_f32(q, k_nope, a.Dn) + dot_f32(q + a.Dn, k_pe, a.Dr)) * a.scale;
        }
        softmax(scores.data(), visible);
        float* o = a.out + (static_cast<size_t>(t0 + i) * a.H + h) * a.Dv;
        std::fill(o, o + a.Dv, 0.0f);
        for (int j = 0; j < visible; ++j) {
          const float* v = kv.data() + (static_cast<size_t>(j) * a.H + h) * Dkv + a.Dn;
          for (int d = 0; d < a.Dv; ++d) o[d] += scores[j] * v[d];
        }
      }
    }
  }
}

void attention_absorbed_ref(const AttentionArgs& a) {
  check_args(a);
  const int R = a.L + a.Dr, Dq = a.Dn + a.Dr, Dkv = a.Dn + a.Dv;
  std::vector<float> q_lat(a.L), lat(a.L), scores;
  for (int n = 0; n < a.N; ++n) {
    const int t0 = a.cu_seqlens[n], tn = a.cu_seqlens[n + 1] - t0, ctx = a.ctx_lens[n], past = ctx - tn;
    scores.resize(ctx);
    for (int i = 0; i < tn; ++i) {
      const int visible = past + i + 1;
      for (int h = 0; h < a.H; ++h) {
        const float* q = a.q + (static_cast<size_t>(t0 + i) * a.H + h) * Dq;
        const float* w_uk = a.wkv_b + static_cast<size_t>(h) * Dkv * a.L;  // [Dn, L]
        const float* w_uv = w_uk + static_cast<size_t>(a.Dn) * a.L;           // [Dv, L]
        // q~ = Wuk^T q_nope: the key up-projection moves onto the query, so keys stay latent.
        std::fill(q_lat.begin(), q_lat.end(), 0.0f);
        for (int d = 0; d < a.Dn; ++d)
          for (int l = 0; l < a.L; ++l) q_lat[l] += q[d] * w_uk[static_cast<size_t>(d) * a.L + l];
        for (int j = 0; j < visible; ++j) {
          const float* row = a.cache.data + a.cache.row(n, j) * R;
          scores[j] = (dot_f32(q_lat.data(), row, a.L) + dot_f32(q + a.Dn, row + a.L, a.Dr)) * a.scale;
        }
        softmax(scores.data(), visible);
        std::fill(lat.begin(), lat.end(), 0.0f);
        for (int j = 0; j < visible; ++j) {
          const float* c = a.cache.data + a.cache.row(n, j) * R;
          for (int l = 0; l < a.L; ++l) lat[l] += scores[j] * c[l];
        }
        float* o = a.out + (static_cast<size_t>(t0 + i) * a.H + h) * a.Dv;
        for (int d = 0; d < a.Dv; ++d) o[d] = dot_f32(w_uv + static_cast<size_t>(d) * a.L, lat.data(), a.L);
      }
    }
  }
}

}  // namespace ds::mla
