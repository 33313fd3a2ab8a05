// Shared fixtures of the MoE op tests: random experts in every format (uploaded, with dequantised fp32
// copies for the references), a poisoned-workspace runner of moe_forward, and host<->device helpers.
#pragma once

#include <cstring>
#include <vector>

#include "../test_util.h"
#include "core/dtype.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_quant_ref.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"

namespace ds::moe::test {

using ds::download;  // core/cuda_utils.h; the tests name them test::upload / test::download
using ds::upload;

// n experts of one format on the device, plus their dequantised values (what the kernels compute with).
struct GpuExperts {
  DeviceBuffer w13, w13s, w13g, w2, w2s, w2g;
  std::vector<float> w13f, w2f;  // [n, 2I, D], [n, D, I]
  ExpertWeights view() const {
    ExpertWeights e;
    e.w13 = w13.get();
    e.w13_scale = w13s.bytes() ? w13s.get() : nullptr;
    e.w13_global = w13g.bytes() ? w13g.get<float>() : nullptr;
    e.w2 = w2.get();
    e.w2_scale = w2s.bytes() ? w2s.get() : nullptr;
    e.w2_global = w2g.bytes() ? w2g.get<float>() : nullptr;
    return e;
  }
};

inline GpuExperts make_experts(int n, int D, int I, WeightFormat f, uint64_t seed) {
  GpuExperts g;
  const auto w13 = ds::test::randn(static_cast<size_t>(n) * 2 * I * D, seed, 1.0f / std::sqrt(static_cast<float>(D)));
  const auto w2 = ds::test::randn(static_cast<size_t>(n) * D * I, seed + 1, 1.0f / std::sqrt(static_cast<float>(I)));
  const QuantWeights q13 = quantize_weights_ref(w13.data(), n, 2 * I, D, f);
  const QuantWeights q2 = quantize_weights_ref(w2.data(), n, D, I, f);
  g.w13f.resize(w13.size());
  g.w2f.resize(w2.size());
  dequantize_weights_ref(q13, n, 2 * I, D, f, g.w13f.data());
  dequantize_weights_ref(q2, n, D, I, f, g.w2f.data());
  g.w13 = upload(q13.data);
  g.w2 = upload(q2.data);
  if (!q13.scale.empty()) {
    g.w13s = upload(q13.scale);
    g.w2s = upload(q2.scale);
  }
  if (!q13.global.empty()) {
    g.w13g = upload(q13.global);
    g.w2g = upload(q2.global);
  }
  return g;
}

struct RouteOut {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

inline float sigmoid_ref(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Ids must equal the reference's; a difference is accepted only where the two experts' selection scores are
// within 2 ulp-ish of each other (the GPU's expf may differ from glibc's in the last bit).
inline void expect_same_routes(const RouteOut& g, const std::vector<float>& logits, const std::vector<float>* bias, int T,
                        const RouterParams& r, const char* what) {
  std::vector<int32_t> ids(static_cast<size_t>(T) * r.topk);
  std::vector<float> w(ids.size());
  route_ref(logits.data(), bias ? bias->data() : nullptr, T, r, ids.data(), w.data());
  int mismatches = 0, near_ties = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (g.ids[i] == ids[i]) continue;
    const size_t t = i / r.topk;
    auto score = [&](int e) {
      const float s = sigmoid_ref(logits[t * r.E + e]);
      return s + (bias ? (*bias)[e] : 0.0f);
    };
    if (g.ids[i] >= 0 && g.ids[i] < r.E && std::fabs(score(g.ids[i]) - score(ids[i])) <= 1e-6f * (1 + std::fabs(score(ids[i]))))
      ++near_ties;
    else
      ++mismatches;
  }
  EXPECT_EQ(mismatches, 0) << what;
  if (near_ties) std::printf("[info] %s: %d near-tie swaps\n", what, near_ties);
  if (near_ties == 0) {
    const auto s = ds::test::compare(std::string(what) + " weights", g.w.data(), w.data(), static_cast<int64_t>(w.size()));
    EXPECT_LT(s.max_abs, 1e-5 * std::max(1.0f, r.routed_scaling_factor)) << what;
  }
}

// Host copies of everything moe_forward produced.
struct OpOutputs {
  std::vector<float> out;                 // [T, D] fused
  std::vector<float> expert_out;          // [T, TOPK, D] deferred
  std::vector<uint16_t> out_bits, expert_out_bits, shared_out_bits;
  std::vector<float> shared_out;          // [T, D] deferred
  std::vector<int32_t> ids, e2p;
  std::vector<float> weights;
  MoeResult res;
};

// Runs moe_forward with the workspace and every output poisoned with `poison` bytes, synchronously.
// `p` carries the set-up and inputs; output buffers are allocated here.
inline OpOutputs run_op(MoeParams p, uint8_t poison) {
  const int T = p.T, K = p.router.topk, D = p.D;
  DeviceBuffer ws(moe_workspace_bytes(p));
  CUDA_CHECK(cudaMemset(ws.get(), poison, ws.bytes()));
  DeviceBuffer out(static_cast<size_t>(T) * D * 2 + 16), eo(static_cast<size_t>(T) * K * D * 2 + 16),
      so(static_cast<size_t>(T) * D * 2 + 16), ids(static_cast<size_t>(T) * K * 4 + 16),
      w(static_cast<size_t>(T) * K * 4 + 16), e2p(static_cast<size_t>(T) * K * 4 + 16);
  for (DeviceBuffer* b : {&out, &eo, &so, &ids, &w, &e2p}) CUDA_CHECK(cudaMemset(b->get(), poison, b->bytes()));
  p.workspace = ws.get();
  p.workspace_bytes = ws.bytes();
  if (p.do_finalize) {
    p.out = out.get<bf16_t>();
  } else {
    p.expert_out = eo.get<bf16_t>();
    p.shared_out = p.has_shared ? so.get<bf16_t>() : nullptr;
    p.expanded_to_permuted = e2p.get<int32_t>();
  }
  if (p.routing == RoutingMode::kInKernel) {
    p.topk_ids_out = ids.get<int32_t>();
    p.topk_weights_out = w.get<float>();
  }
  OpOutputs o;
  o.res = moe_forward(p);
  CUDA_CHECK(cudaDeviceSynchronize());
  const size_t R = static_cast<size_t>(T) * K;
  o.ids = download<int32_t>(o.res.topk_ids.data, R);
  o.weights = download<float>(o.res.topk_weights.data, R);
  if (p.do_finalize) {
    o.out_bits = download<uint16_t>(out.get(), static_cast<size_t>(T) * D);
    o.out = bf16_to_f32(o.out_bits);
  } else {
    o.e2p = download<int32_t>(e2p.get(), R);
    o.expert_out_bits = download<uint16_t>(eo.get(), R * D);
    o.expert_out = bf16_to_f32(o.expert_out_bits);
    if (p.has_shared) {
      o.shared_out_bits = download<uint16_t>(so.get(), static_cast<size_t>(T) * D);
      o.shared_out = bf16_to_f32(o.shared_out_bits);
    }
  }
  return o;
}

}  // namespace ds::moe::test

#endif  // DELTASERVE_WITH_CUDA
