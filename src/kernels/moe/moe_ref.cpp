// MoE references: router, SwiGLU experts, finalize, whole block (see moe_ref.h for the definitions).
#include "kernels/moe/moe_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/cpu_math.h"
#include "core/error.h"

namespace ds::moe {

namespace {


float silu(float x) { return x / (1.0f + std::exp(-x)); }

// NaN ranks as -inf so the ordering below is a strict weak order and a NaN never beats a number.
float rank_key(float s) { return std::isnan(s) ? -INFINITY : s; }

// Strict "a ranks before b": higher score first, then the lower index (the documented tie rule).
bool ranks_before(float sa, int ia, float sb, int ib) {
  const float a = rank_key(sa), b = rank_key(sb);
  return a > b || (a == b && ia < ib);
}

void check_router(const RouterParams& p) {
  CHECK(p.E > 0 && p.topk > 0, "router: E={} topk={}", p.E, p.topk);
  CHECK(p.num_expert_group > 0 && p.E % p.num_expert_group == 0, "router: E={} not divisible into {} groups", p.E,
        p.num_expert_group);
  CHECK(p.topk_group >= 1 && p.topk_group <= p.num_expert_group, "router: topk_group={} of {} groups",
        p.topk_group, p.num_expert_group);
  CHECK_LE(p.topk, p.topk_group * (p.E / p.num_expert_group));
}

// One SwiGLU FFN row: y = W_down (silu(W_gate x) * (W_up x)); h is scratch [I].
void swiglu_row(const float* x, const float* w_gate, const float* w_up, const float* w_down, int D, int I, float* h,
                float* y) {
  for (int i = 0; i < I; ++i) {
    const size_t r = static_cast<size_t>(i) * D;
    h[i] = silu(dot_f32(w_gate + r, x, D)) * dot_f32(w_up + r, x, D);
  }
  for (int d = 0; d < D; ++d) y[d] = dot_f32(w_down + static_cast<size_t>(d) * I, h, I);
}

}  // namespace

void route_ref(const float* logits, const float* bias, int T, const RouterParams& p, int32_t* topk_ids,
               float* topk_weights) {
  check_router(p);
  const int E = p.E, G = p.num_expert_group, per_group = E / G;
  std::vector<float> s(E), sb(E), group_score(G);
  std::vector<int> order(std::max(E, G));
  std::vector<char> kept(G);
  for (int t = 0; t < T; ++t) {
    const float* l = logits + static_cast<size_t>(t) * E;
    if (p.scoring == ScoringFunc::kSigmoid) {
      for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      float m = -INFINITY;
      for (int e = 0; e < E; ++e) m = std::max(m, l[e]);
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - m));
      for (int e = 0; e < E; ++e) s[e] /= sum;
    }
    for (int e = 0; e < E; ++e) sb[e] = s[e] + (bias ? bias[e] : 0.0f);

    // Group selection (a no-op for G = topk_group = 1, the Kimi-Linear case).
    std::fill(kept.begin(), kept.end(), 1);
    if (p.topk_group < G) {
      for (int g = 0; g < G; ++g) {
        const float* x = sb.data() + g * per_group;
        int b1 = 0;  // best, then second best, by the same ranking as experts
        for (int e = 1; e < per_group; ++e)
          if (ranks_before(x[e], e, x[b1], b1)) b1 = e;
        float score = rank_key(x[b1]);
        if (per_group > 1) {
          int b2 = b1 == 0 ? 1 : 0;
          for (int e = 0; e < per_group; ++e)
            if (e != b1 && ranks_before(x[e], e, x[b2], b2)) b2 = e;
          score += rank_key(x[b2]);
        }
        group_score[g] = score;
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::partial_sort(order.begin(), order.begin() + p.topk_group, order.begin() + G, [&](int a, int b) {
        return ranks_before(group_score[a], a, group_score[b], b);
      });
      std::fill(kept.begin(), kept.end(), 0);
      for (int i = 0; i < p.topk_group; ++i) kept[order[i]] = 1;
    }

    // Experts of kept groups, best TOPK by biased score.
    int n = 0;
    for (int e = 0; e < E; ++e)
      if (kept[e / per_group]) order[n++] = e;
    std::partial_sort(order.begin(), order.begin() + p.topk, order.begin() + n,
                      [&](int a, int b) { return ranks_before(sb[a], a, sb[b], b); });

    int32_t* ids = topk_ids + static_cast<size_t>(t) * p.topk;
    float* w = topk_weights + static_cast<size_t>(t) * p.topk;
    float sum = 0.0f;
    for (int k = 0; k < p.topk; ++k) {
      ids[k] = order[k];
      w[k] = p.hf_biased_weights ? sb[order[k]] : s[order[k]];
      sum += w[k];
    }
    const float norm = p.renormalize ? 1.0f / (sum + kRenormEps) : 1.0f;
    for (int k = 0; k < p.topk; ++k) w[k] = w[k] * norm * p.routed_scaling_factor;
  }
}

void swiglu_ref(const float* x, const float* w_gate, const float* w_up, const float* w_down, int T, int D, int I,
                float* y) {
  std::vector<float> h(I);
  for (int t = 0; t < T; ++t)
    swiglu_row(x + static_cast<size_t>(t) * D, w_gate, w_up, w_down, D, I, h.data(), y + static_cast<size_t>(t) * D);
}

void experts_ref(const ExpertArgs& a) {
  CHECK(a.x && a.topk_ids && a.w1 && a.w3 && a.w2 && a.expert_out, "experts_ref: null pointer argument");
  std::vector<float> h(a.I);
  const size_t expert_stride = static_cast<size_t>(a.I) * a.D;  // w1/w3/w2 each hold I*D values per expert
  for (int t = 0; t < a.T; ++t) {
    for (int k = 0; k < a.TOPK; ++k) {
      const int e = a.topk_ids[static_cast<size_t>(t) * a.TOPK + k];
      float* y = a.expert_out + (static_cast<size_t>(t) * a.TOPK + k) * a.D;
      if (e < 0) {
        std::fill(y, y + a.D, 0.0f);
        continue;
      }
      CHECK_LT(e, a.E);
      swiglu_row(a.x + static_cast<size_t>(t) * a.D, a.w1 + e * expert_stride, a.w3 + e * expert_stride,
                 a.w2 + e * expert_stride, a.D, a.I, h.data(), y);
    }
  }
}

void finalize_ref(const FinalizeArgs& a) {
  for (int t = 0; t < a.T; ++t) {
    float* o = a.out + static_cast<size_t>(t) * a.D;
    // Accumulate into a temporary so out may alias residual.
    std::vector<float> acc(a.D, 0.0f);
    for (int k = 0; k < a.TOPK; ++k) {
      const size_t tk = static_cast<size_t>(t) * a.TOPK + k;
      if (a.topk_ids[tk] < 0) continue;
      const float w = a.topk_weights[tk];
      const float* y = a.expert_out + tk * a.D;
      for (int d = 0; d < a.D; ++d) acc[d] += w * y[d];
    }
    if (a.shared_out)
      for (int d = 0; d < a.D; ++d) acc[d] += a.shared_out[static_cast<size_t>(t) * a.D + d];
    if (a.residual)
      for (int d = 0; d < a.D; ++d) acc[d] += a.residual[static_cast<size_t>(t) * a.D + d];
    std::copy(acc.begin(), acc.end(), o);
  }
}

void moe_ref(const MoeArgs& a) {
  const int E = a.router.E, TOPK = a.router.topk;
  CHECK(a.topk_ids && a.topk_weights, "moe_ref: topk_ids/topk_weights are required (in or out)");
  if (a.gate_w) {
    std::vector<float> logits(static_cast<size_t>(a.T) * E);
    for (int t = 0; t < a.T; ++t)
      for (int e = 0; e < E; ++e)
        logits[static_cast<size_t>(t) * E + e] =
            dot_f32(a.x + static_cast<size_t>(t) * a.D, a.gate_w + static_cast<size_t>(e) * a.D, a.D);
    route_ref(logits.data(), a.bias, a.T, a.router, a.topk_ids, a.topk_weights);
  }
  std::vector<float> expert_out(static_cast<size_t>(a.T) * TOPK * a.D);
  experts_ref({a.x, a.topk_ids, a.w1, a.w3, a.w2, a.T, a.D, a.I, E, TOPK, expert_out.data()});
  std::vector<float> shared;
  if (a.shared_I > 0) {
    shared.resize(static_cast<size_t>(a.T) * a.D);
    swiglu_ref(a.x, a.shared_gate, a.shared_up, a.shared_down, a.T, a.D, a.shared_I, shared.data());
  }
  finalize_ref({expert_out.data(), a.topk_ids, a.topk_weights, shared.empty() ? nullptr : shared.data(), a.residual,
                a.T, a.D, TOPK, a.out});
}

}  // namespace ds::moe
