// KDA CPU references: gate, short conv, recurrence, chunked (UT/WY) form and gated RMSNorm, all fp32.
#include "kernels/kda/kda_ref.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ds::kda {
namespace {

float softplus(float z) { return z > 20.0f ? z : std::log1p(std::exp(z)); }
float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
float silu(float z) { return z * sigmoid(z); }

// Writes x / sqrt(sum x^2 + eps) * scale into out (n values).
void l2norm(const float* x, int n, float scale, bool normalise, float* out) {
  float r = scale;
  if (normalise) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    r = scale / std::sqrt(static_cast<float>(ss) + kL2NormEps);
  }
  for (int i = 0; i < n; ++i) out[i] = x[i] * r;
}

void check_args(const RecurrenceArgs& a) {
  CHECK(a.N >= 0 && a.H > 0 && a.K > 0 && a.V > 0, "N={} H={} K={} V={}", a.N, a.H, a.K, a.V);
  for (int n = 0; n < a.N; ++n) CHECK_LE(a.cu_seqlens[n], a.cu_seqlens[n + 1]);
}

}  // namespace

void gate_ref(const float* f, const float* A_log, const float* dt_bias, int T, int H, int K, float* g) {
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const float a = -std::exp(A_log[h]);
      for (int d = 0; d < K; ++d) {
        const size_t i = (static_cast<size_t>(t) * H + h) * K + d;
        g[i] = a * softplus(f[i] + dt_bias[h * K + d]);
      }
    }
}

void recurrent_ref(const RecurrenceArgs& a, float* state, float* o) {
  check_args(a);
  const int H = a.H, K = a.K, V = a.V;
  std::vector<float> qn(K), kn(K), u(V);
  for (int n = 0; n < a.N; ++n)
    for (int h = 0; h < H; ++h) {
      float* S = state + (static_cast<size_t>(n) * H + h) * K * V;  // [K, V]
      for (int t = a.cu_seqlens[n]; t < a.cu_seqlens[n + 1]; ++t) {
        const size_t th = static_cast<size_t>(t) * H + h;
        l2norm(a.q + th * K, K, a.scale, a.qk_l2norm, qn.data());
        l2norm(a.k + th * K, K, 1.0f, a.qk_l2norm, kn.data());
        const float* g = a.g + th * K;
        const float* v = a.v + th * V;
        const float beta = a.beta[th];
        for (int i = 0; i < K; ++i) {  // decay rows (key dim) first
          const float decay = std::exp(g[i]);
          for (int j = 0; j < V; ++j) S[i * V + j] *= decay;
        }
        for (int j = 0; j < V; ++j) {  // u = beta (v - S^T k)
          float kv = 0;
          for (int i = 0; i < K; ++i) kv += S[i * V + j] * kn[i];
          u[j] = beta * (v[j] - kv);
        }
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < V; ++j) S[i * V + j] += kn[i] * u[j];
        float* out = o + th * V;
        for (int j = 0; j < V; ++j) {  // read with the updated state
          float acc = 0;
          for (int i = 0; i < K; ++i) acc += S[i * V + j] * qn[i];
          out[j] = acc;
        }
      }
    }
}

void chunked_ref(const RecurrenceArgs& a, float* state, float* o, int chunk) {
  check_args(a);
  CHECK_GT(chunk, 0);
  const int H = a.H, K = a.K, V = a.V, C = chunk;
  // Per-chunk scratch: Q^, K^ [C, K]; Gamma [C, K]; A matrices [C, C]; W [C, K]; U, Vn [C, V].
  std::vector<float> Q(C * K), Kh(C * K), G(C * K), Akk(C * C), Aqk(C * C), M(C * C), W(C * K), U(C * V),
      Vn(C * V), tmp(C * K);
  for (int n = 0; n < a.N; ++n)
    for (int h = 0; h < H; ++h) {
      float* S = state + (static_cast<size_t>(n) * H + h) * K * V;
      for (int t0 = a.cu_seqlens[n]; t0 < a.cu_seqlens[n + 1]; t0 += C) {
        const int L = std::min(C, a.cu_seqlens[n + 1] - t0);
        // 1. normalised q/k and the in-chunk cumulative log-decay Gamma (inclusive).
        for (int r = 0; r < L; ++r) {
          const size_t th = static_cast<size_t>(t0 + r) * H + h;
          l2norm(a.q + th * K, K, a.scale, a.qk_l2norm, &Q[r * K]);
          l2norm(a.k + th * K, K, 1.0f, a.qk_l2norm, &Kh[r * K]);
          for (int d = 0; d < K; ++d) G[r * K + d] = (r ? G[(r - 1) * K + d] : 0.0f) + a.g[th * K + d];
        }
        auto beta = [&](int r) { return a.beta[static_cast<size_t>(t0 + r) * H + h]; };
        // 2. intra-chunk matrices; every exponent Gamma_r - Gamma_j (j <= r) is <= 0.
        for (int r = 0; r < L; ++r)
          for (int j = 0; j < L; ++j) {
            float akk = 0, aqk = 0;
            if (j <= r)
              for (int d = 0; d < K; ++d) {
                const float e = std::exp(G[r * K + d] - G[j * K + d]);
                akk += Kh[r * K + d] * Kh[j * K + d] * e;
                aqk += Q[r * K + d] * Kh[j * K + d] * e;
              }
            Akk[r * C + j] = j < r ? beta(r) * akk : 0.0f;
            Aqk[r * C + j] = j <= r ? aqk : 0.0f;
          }
        // 3. UT transform: M = (I + Akk)^-1 by forward substitution (unit lower-triangular).
        for (int r = 0; r < L; ++r)
          for (int c = 0; c < L; ++c) {
            float m = r == c ? 1.0f : 0.0f;
            for (int j = c; j < r; ++j) m -= Akk[r * C + j] * M[j * C + c];
            M[r * C + c] = c <= r ? m : 0.0f;
          }
        // 4. WY factors: W = M (beta exp(Gamma) K^), U = M (beta V).
        for (int r = 0; r < L; ++r) {
          for (int d = 0; d < K; ++d) {
            float acc = 0;
            for (int j = 0; j <= r; ++j) acc += M[r * C + j] * beta(j) * std::exp(G[j * K + d]) * Kh[j * K + d];
            W[r * K + d] = acc;
          }
          for (int e = 0; e < V; ++e) {
            float acc = 0;
            for (int j = 0; j <= r; ++j)
              acc += M[r * C + j] * beta(j) * a.v[(static_cast<size_t>(t0 + j) * H + h) * V + e];
            U[r * V + e] = acc;
          }
        }
        // 5. pseudo-values against the state entering the chunk, output, then the state update.
        for (int r = 0; r < L; ++r)
          for (int e = 0; e < V; ++e) {
            float acc = U[r * V + e];
            for (int d = 0; d < K; ++d) acc -= W[r * K + d] * S[d * V + e];
            Vn[r * V + e] = acc;
          }
        for (int r = 0; r < L; ++r) {
          float* out = o + (static_cast<size_t>(t0 + r) * H + h) * V;
          for (int d = 0; d < K; ++d) tmp[d] = Q[r * K + d] * std::exp(G[r * K + d]);
          for (int e = 0; e < V; ++e) {
            float acc = 0;
            for (int d = 0; d < K; ++d) acc += tmp[d] * S[d * V + e];
            for (int j = 0; j <= r; ++j) acc += Aqk[r * C + j] * Vn[j * V + e];
            out[e] = acc;
          }
        }
        for (int d = 0; d < K; ++d) {
          const float gl = G[(L - 1) * K + d];
          const float decay = std::exp(gl);
          for (int e = 0; e < V; ++e) {
            float acc = decay * S[d * V + e];
            for (int r = 0; r < L; ++r) acc += Kh[r * K + d] * std::exp(gl - G[r * K + d]) * Vn[r * V + e];
            S[d * V + e] = acc;
          }
        }
      }
    }
}

void short_conv_ref(const float* x, const float* w, const int32_t* cu_seqlens, int N, int C, int W,
                    float* conv_state, float* y) {
  CHECK_GE(W, 1);
  const int S = W - 1;
  std::vector<float> old(static_cast<size_t>(S) * C);
  for (int n = 0; n < N; ++n) {
    const int t0 = cu_seqlens[n], T = cu_seqlens[n + 1] - t0;
    float* st = conv_state + static_cast<size_t>(n) * S * C;  // [W-1, C], oldest first
    std::copy(st, st + old.size(), old.begin());
    // Input at local time tau (< 0 comes from the state: time -1 is the newest state row, S-1).
    auto input = [&](int tau, int c) {
      return tau >= 0 ? x[static_cast<size_t>(t0 + tau) * C + c] : old[static_cast<size_t>(S + tau) * C + c];
    };
    for (int i = 0; i < T; ++i)
      for (int c = 0; c < C; ++c) {
        float acc = 0;
        for (int j = 0; j < W; ++j) acc += w[c * W + j] * input(i - S + j, c);
        y[static_cast<size_t>(t0 + i) * C + c] = silu(acc);
      }
    for (int r = 0; r < S; ++r)
      for (int c = 0; c < C; ++c) st[static_cast<size_t>(r) * C + c] = input(T - S + r, c);
  }
}

void gated_rmsnorm_ref(const float* o, const float* gz, const float* w, int T, int H, int V, float eps, float* out,
                       bool round_o) {
  std::vector<float> x(V);
  for (size_t th = 0; th < static_cast<size_t>(T) * H; ++th) {
    for (int e = 0; e < V; ++e) x[e] = round_o ? round_bf16(o[th * V + e]) : o[th * V + e];
    double ss = 0;
    for (int e = 0; e < V; ++e) ss += static_cast<double>(x[e]) * x[e];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / V) + eps);
    for (int e = 0; e < V; ++e) out[th * V + e] = x[e] * r * w[e] * sigmoid(gz[th * V + e]);
  }
}

}  // namespace ds::kda
