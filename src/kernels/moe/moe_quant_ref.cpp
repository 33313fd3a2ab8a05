// CPU references of the MoE formats, dispatch and quantised experts (definitions in moe_quant_ref.h).
#include "kernels/moe/moe_quant_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/moe/moe_bits.h"

namespace ds::moe {

namespace {

float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float amax_of(const float* v, int n, int stride = 1) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(v[static_cast<size_t>(i) * stride]));
  return m;
}

float fp8_block_scale(float amax) { return amax > 0.0f ? amax / kE4M3Max : 1.0f; }

int group_size(ActFormat f) { return f == ActFormat::kMXFP8 ? 32 : 128; }

}  // namespace

void quantize_act_ref(const float* x, int rows, int K, ActFormat f, uint8_t* q, void* scale) {
  CHECK(f != ActFormat::kBF16, "quantize_act_ref: bf16 has no quantised form");
  const int gs = group_size(f), ng = K / gs;
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < ng; ++b) {
      const float* v = x + static_cast<size_t>(r) * K + b * gs;
      uint8_t* o = q + static_cast<size_t>(r) * K + b * gs;
      const float amax = amax_of(v, gs);
      if (f == ActFormat::kFP8Block) {
        const float sc = fp8_block_scale(amax);
        for (int i = 0; i < gs; ++i) o[i] = f32_to_e4m3(v[i] / sc);
        static_cast<float*>(scale)[static_cast<size_t>(r) * ng + b] = sc;
      } else {
        const uint8_t code = e8m0_scale_for_amax(amax, kE4M3Max);
        const float inv = pow2f(127 - code);
        for (int i = 0; i < gs; ++i) o[i] = f32_to_e4m3(v[i] * inv);
        static_cast<uint8_t*>(scale)[static_cast<size_t>(r) * ng + b] = code;
      }
    }
}

void dequantize_act_ref(const uint8_t* q, const void* scale, int rows, int K, ActFormat f, float* out) {
  const int gs = group_size(f), ng = K / gs;
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(r) * K + k;
      const float s = f == ActFormat::kFP8Block ? static_cast<const float*>(scale)[static_cast<size_t>(r) * ng + k / gs]
                                                : e8m0_to_f32(static_cast<const uint8_t*>(scale)[static_cast<size_t>(r) * ng + k / gs]);
      out[i] = e4m3_to_f32(q[i]) * s;
    }
}

void fake_quantize_act_ref(float* x, int rows, int K, ActFormat f) {
  const size_t n = static_cast<size_t>(rows) * K;
  if (f == ActFormat::kBF16) {
    for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
    return;
  }
  std::vector<uint8_t> q(n), s(static_cast<size_t>(rows) * (K / group_size(f)) * 4);
  quantize_act_ref(x, rows, K, f, q.data(), s.data());
  dequantize_act_ref(q.data(), s.data(), rows, K, f, x);
}

QuantWeights quantize_weights_ref(const float* w, int n, int R, int K, WeightFormat f) {
  QuantWeights q;
  const size_t per = static_cast<size_t>(R) * K, total = per * n;
  switch (f) {
    case WeightFormat::kBF16: {
      q.data.resize(total * 2);
      auto* o = reinterpret_cast<uint16_t*>(q.data.data());
      for (size_t i = 0; i < total; ++i) o[i] = f32_to_bf16(w[i]);
      break;
    }
    case WeightFormat::kFP8Block: {
      CHECK(R % 128 == 0 && K % 128 == 0, "fp8 block weights need 128-multiples, got {}x{}", R, K);
      q.data.resize(total);
      q.scale.resize(static_cast<size_t>(n) * (R / 128) * (K / 128) * 4);
      auto* sc = reinterpret_cast<float*>(q.scale.data());
      for (int e = 0; e < n; ++e)
        for (int rb = 0; rb < R / 128; ++rb)
          for (int kb = 0; kb < K / 128; ++kb) {
            const float* base = w + e * per + static_cast<size_t>(rb) * 128 * K + kb * 128;
            float amax = 0.0f;
            for (int r = 0; r < 128; ++r) amax = std::fmax(amax, amax_of(base + static_cast<size_t>(r) * K, 128));
            const float s = fp8_block_scale(amax);
            sc[(static_cast<size_t>(e) * (R / 128) + rb) * (K / 128) + kb] = s;
            for (int r = 0; r < 128; ++r)
              for (int k = 0; k < 128; ++k) {
                const size_t i = e * per + (static_cast<size_t>(rb) * 128 + r) * K + kb * 128 + k;
                q.data[i] = f32_to_e4m3(w[i] / s);
              }
          }
      break;
    }
    case WeightFormat::kMXFP8:
    case WeightFormat::kMXFP4: {
      const bool fp4 = f == WeightFormat::kMXFP4;
      q.data.resize(fp4 ? total / 2 : total);
      q.scale.resize(total / 32);
      for (size_t b = 0; b < total / 32; ++b) {
        const float* v = w + b * 32;
        const uint8_t code = e8m0_scale_for_amax(amax_of(v, 32), fp4 ? kE2M1Max : kE4M3Max);
        q.scale[b] = code;
        const float inv = pow2f(127 - code);
        for (int i = 0; i < 32; ++i) {
          const size_t idx = b * 32 + i;
          if (fp4)
            store_from_f32(q.data.data(), DType::kF4E2M1, idx, v[i] * inv);
          else
            q.data[idx] = f32_to_e4m3(v[i] * inv);
        }
      }
      break;
    }
    case WeightFormat::kNVFP4: {
      q.data.resize(total / 2);
      q.scale.resize(total / 16);
      q.global.resize(n);
      for (int e = 0; e < n; ++e) {
        const float am = amax_of(w + e * per, static_cast<int>(per));
        const float g = am > 0.0f ? am / (kE4M3Max * kE2M1Max) : 1.0f;
        q.global[e] = g;
        for (size_t b = e * per / 16; b < (e + 1) * per / 16; ++b) {
          const float* v = w + b * 16;
          const uint8_t s = f32_to_e4m3(amax_of(v, 16) / (kE2M1Max * g));
          q.scale[b] = s;
          const float sd = e4m3_to_f32(s) * g;
          for (int i = 0; i < 16; ++i) store_from_f32(q.data.data(), DType::kF4E2M1, b * 16 + i, sd > 0 ? v[i] / sd : 0.0f);
        }
      }
      break;
    }
  }
  return q;
}

void dequantize_weights_ref(const QuantWeights& q, int n, int R, int K, WeightFormat f, float* out) {
  const size_t per = static_cast<size_t>(R) * K, total = per * n;
  for (size_t i = 0; i < total; ++i) {
    const size_t e = i / per, r = (i % per) / K, k = i % K;
    switch (f) {
      case WeightFormat::kBF16: out[i] = load_as_f32(q.data.data(), DType::kBF16, i); break;
      case WeightFormat::kFP8Block:
        out[i] = e4m3_to_f32(q.data[i]) *
                 reinterpret_cast<const float*>(q.scale.data())[(e * (R / 128) + r / 128) * (K / 128) + k / 128];
        break;
      case WeightFormat::kMXFP8: out[i] = e4m3_to_f32(q.data[i]) * e8m0_to_f32(q.scale[i / 32]); break;
      case WeightFormat::kMXFP4: out[i] = load_as_f32(q.data.data(), DType::kF4E2M1, i) * e8m0_to_f32(q.scale[i / 32]); break;
      case WeightFormat::kNVFP4:
        out[i] = load_as_f32(q.data.data(), DType::kF4E2M1, i) * e4m3_to_f32(q.scale[i / 16]) * q.global[e];
        break;
    }
  }
}

void dispatch_ref(const int32_t* topk_ids, int T, int TOPK, int expert_begin, int EL, bool has_shared,
                  int32_t* e2p, std::vector<int>* group_counts) {
  std::vector<int> cnt(EL + (has_shared ? 1 : 0), 0);
  const int R = T * TOPK;
  for (int r = 0; r < R; ++r) {
    const int e = topk_ids[r] - expert_begin;
    if (e >= 0 && e < EL) ++cnt[e];
  }
  if (has_shared) cnt[EL] = T;
  std::vector<int> cursor(EL);
  int row = has_shared ? T : 0;
  for (int e = 0; e < EL; ++e) {
    cursor[e] = row;
    row += cnt[e];
  }
  for (int r = 0; r < R; ++r) {
    const int e = topk_ids[r] - expert_begin;
    e2p[r] = (e >= 0 && e < EL) ? cursor[e]++ : -1;
  }
  if (group_counts) *group_counts = cnt;
}

void experts_quant_ref(const QuantExpertArgs& a) {
  const int D = a.D, I = a.I;
  std::vector<float> xa(D), h(I), y(D);
  auto ffn = [&](const float* w13, const float* w2, float* out) {
    for (int i = 0; i < I; ++i) {
      const float g = dot(xa.data(), w13 + static_cast<size_t>(i) * D, D);
      const float u = dot(xa.data(), w13 + static_cast<size_t>(I + i) * D, D);
      h[i] = silu(g) * u;
    }
    fake_quantize_act_ref(h.data(), 1, I, a.act);
    for (int d = 0; d < D; ++d) out[d] = round_bf16(dot(h.data(), w2 + static_cast<size_t>(d) * I, I));
  };
  const size_t s13 = static_cast<size_t>(2) * I * D, s2 = static_cast<size_t>(D) * I;
  for (int t = 0; t < a.T; ++t) {
    std::copy(a.x + static_cast<size_t>(t) * D, a.x + static_cast<size_t>(t + 1) * D, xa.begin());
    fake_quantize_act_ref(xa.data(), 1, D, a.act);
    for (int k = 0; k < a.TOPK; ++k) {
      float* out = a.expert_out + (static_cast<size_t>(t) * a.TOPK + k) * D;
      const int e = a.topk_ids[static_cast<size_t>(t) * a.TOPK + k] - a.expert_begin;
      if (e < 0 || e >= a.EL) {
        std::fill(out, out + D, 0.0f);
        continue;
      }
      ffn(a.w13 + e * s13, a.w2 + e * s2, out);
    }
    if (a.shared_w13 && a.shared_out) ffn(a.shared_w13, a.shared_w2, a.shared_out + static_cast<size_t>(t) * D);
  }
}

}  // namespace ds::moe
