// MoE router kernel vs moe_ref's route_ref (ids exact up to fp32 near-ties, weights within fp32 rounding):
// random and adversarial logits (all negative, all equal, huge, NaN), grouped top-k, up to 1024 experts /
// top-16, the HF biased-weight switch and softmax scoring; logits GEMM vs an fp32 CPU product.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "kernels/moe/moe_kernels.h"
#include "moe_test_common.h"

#ifdef DELTASERVE_WITH_CUDA

namespace ds::moe {
namespace {

using test::download;
using test::expect_same_routes;
using test::RouteOut;
using test::upload;


// moe_route on the device, outputs poisoned first: the router GEMM on x [T, D] and W [E, D] (bf16, device), or
// (`given`) only the top-k of these logits. Bias optional (device).
struct GemmRoute {
  std::vector<float> logits;
  std::vector<int32_t> ids;
  std::vector<float> w;
};
GemmRoute gemm_route(const RouterParams& r, int T, int D, const bf16_t* x, const bf16_t* w, const float* bias,
                     bool cluster = false, const std::vector<float>* given = nullptr, int32_t* counter = nullptr) {
  DeviceBuffer dl = given ? upload(*given) : DeviceBuffer(static_cast<size_t>(T) * r.E * 4),
               ids(static_cast<size_t>(T) * r.topk * 4), wt(static_cast<size_t>(T) * r.topk * 4);
  if (!given) CUDA_CHECK(cudaMemset(dl.get(), 0xff, dl.bytes()));
  CUDA_CHECK(cudaMemset(ids.get(), 0x7f, ids.bytes()));
  CUDA_CHECK(cudaMemset(wt.get(), 0xff, wt.bytes()));
  RouteParams p;
  p.router = r;
  p.T = T;
  p.D = D;
  p.x = x;
  p.gate_w = w;
  p.bias = bias;
  p.logits = dl.get<float>();
  p.topk_ids = ids.get<int32_t>();
  p.topk_weights = wt.get<float>();
  p.logits_given = given != nullptr;
  p.cluster = cluster;
  p.route_counter = counter;
  moe_route(p);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {download<float>(dl.get(), static_cast<size_t>(T) * r.E),
          download<int32_t>(ids.get(), static_cast<size_t>(T) * r.topk),
          download<float>(wt.get(), static_cast<size_t>(T) * r.topk)};
}

// How many of n floats differ from b's in their bits (a bitwise comparison that also counts).
int bits_differ(const float* a, const float* b, size_t n) {
  int d = 0;
  for (size_t i = 0; i < n; ++i) d += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return d;
}

// A shape of the bitwise route tests (router GEMM + top-k on x [T, D]): experts, top-k, groups, width, the HF
// weight switch, scoring.
struct RouteCase {
  int E, topk, G, topk_group, D;
  bool hf;
  ScoringFunc sf;
  RouterParams params() const {
    return RouterParams{.E = E, .topk = topk, .num_expert_group = G, .topk_group = topk_group, .scoring = sf,
                        .routed_scaling_factor = 2.446f, .hf_biased_weights = hf};
  }
  std::string name(int T) const {
    return "E=" + std::to_string(E) + " G=" + std::to_string(G) + " D=" + std::to_string(D) + " T=" +
           std::to_string(T);
  }
};

// Random x [T, D], W [E, D] (bf16) and bias [E] of a case on the device; seeds from `seed`.
struct RouteInputs {
  DeviceBuffer x, w, bias;
  RouteInputs(const RouteCase& c, int T, uint64_t seed)
      : x(upload(f32_to_bf16(ds::test::randn(static_cast<size_t>(T) * c.D, seed + T, 1.0f)))),
        w(upload(f32_to_bf16(ds::test::randn(static_cast<size_t>(c.E) * c.D, seed + 1 + c.E, 0.05f)))),
        bias(upload(ds::test::randn(c.E, seed + 2 + c.E, 0.05f))) {}
};

// Two routes of the same inputs, bit for bit (ids, logits, weights); adds the floats compared and differing.
void expect_bitwise_route(const GemmRoute& a, const GemmRoute& b, const std::string& what, int& compared,
                          int& differ) {
  differ += bits_differ(a.logits.data(), b.logits.data(), a.logits.size()) +
            bits_differ(a.w.data(), b.w.data(), a.w.size());
  compared += static_cast<int>(a.logits.size() + a.w.size());
  EXPECT_EQ(a.ids, b.ids) << what;
  EXPECT_EQ(a.logits, b.logits) << what;
  EXPECT_EQ(a.w, b.w) << what;
}

RouteOut gpu_route(const std::vector<float>& logits, const std::vector<float>* bias, int T, const RouterParams& r) {
  DeviceBuffer db = bias ? upload(*bias) : DeviceBuffer();
  GemmRoute g = gemm_route(r, T, 128, nullptr, nullptr, bias ? db.get<float>() : nullptr, false, &logits);
  return {std::move(g.ids), std::move(g.w)};
}

TEST(MoeRouteGpu, RandomLogitsManyShapes) {
  SKIP_WITHOUT_GPU();
  struct Case { int E, topk, G, topk_group; bool hf; };
  const Case cases[] = {{256, 8, 1, 1, false}, {256, 8, 1, 1, true}, {256, 8, 8, 4, false}, {896, 16, 1, 1, false},
                        {1024, 16, 8, 4, false}, {64, 4, 64, 8, false}, {48, 2, 4, 1, false}, {1024, 1, 1, 1, false}};
  for (const Case& c : cases)
    for (int T : {1, 3, 17, 1000}) {
      RouterParams r{.E = c.E, .topk = c.topk, .num_expert_group = c.G, .topk_group = c.topk_group,
                     .routed_scaling_factor = 2.446f, .hf_biased_weights = c.hf};
      const auto logits = ds::test::randn(static_cast<size_t>(T) * c.E, 100 + T + c.E, 2.0f);
      const auto bias = ds::test::randn(c.E, 200 + c.E, 0.05f);
      const std::string what = "route E=" + std::to_string(c.E) + " k=" + std::to_string(c.topk) + " G=" +
                               std::to_string(c.G) + "/" + std::to_string(c.topk_group) + " T=" + std::to_string(T) +
                               (c.hf ? " hf" : "");
      expect_same_routes(gpu_route(logits, &bias, T, r), logits, &bias, T, r, what.c_str());
    }
}

TEST(MoeRouteGpu, AdversarialLogits) {
  SKIP_WITHOUT_GPU();
  const int E = 256, T = 6;
  RouterParams r{.E = E, .topk = 8, .routed_scaling_factor = 2.446f};
  std::vector<float> logits(static_cast<size_t>(T) * E);
  for (int e = 0; e < E; ++e) {
    logits[0 * E + e] = -30.0f - 0.01f * ((e * 37) % E);  // all negative, distinct
    logits[1 * E + e] = 0.5f;                             // all equal: the 8 lowest indices win
    logits[2 * E + e] = 1e30f * ((e % 3) - 1);            // huge: saturated sigmoids tie
    logits[3 * E + e] = (e % 5 == 0) ? NAN : -1.0f + 0.001f * e;  // NaN never beats a number
    logits[4 * E + e] = -1e30f;                           // every score 0 (all tie)
    logits[5 * E + e] = (e == 200) ? 50.0f : -50.0f;      // one dominant expert
  }
  const auto g = gpu_route(logits, nullptr, T, r);
  expect_same_routes(g, logits, nullptr, T, r, "adversarial");
  for (int k = 0; k < 8; ++k) EXPECT_EQ(g.ids[8 + k], k) << "all-equal logits: lower index wins";
  for (int k = 0; k < 8; ++k) EXPECT_NE(g.ids[3 * 8 + k] % 5, 0) << "a NaN logit was selected";
  EXPECT_EQ(g.ids[5 * 8], 200);
  for (float w : g.w) EXPECT_TRUE(std::isfinite(w));
  // With a bias that makes every selection score negative, the selection still follows the scores.
  std::vector<float> bias(E, -2.0f);
  bias[17] = -1.0f;
  const auto gb = gpu_route(logits, &bias, T, r);
  expect_same_routes(gb, logits, &bias, T, r, "negative selection scores");
  EXPECT_EQ(gb.ids[8], 17);
}

TEST(MoeRouteGpu, SoftmaxScoring) {
  SKIP_WITHOUT_GPU();
  RouterParams r{.E = 128, .topk = 4, .scoring = ScoringFunc::kSoftmax};
  const int T = 17;
  const auto logits = ds::test::randn(static_cast<size_t>(T) * r.E, 9, 3.0f);
  const auto g = gpu_route(logits, nullptr, T, r);
  std::vector<int32_t> ids(T * 4);
  std::vector<float> w(T * 4);
  route_ref(logits.data(), nullptr, T, r, ids.data(), w.data());
  EXPECT_EQ(g.ids, ids);
  const auto s = ds::test::compare("softmax weights", g.w.data(), w.data(), T * 4);
  EXPECT_LT(s.max_abs, 1e-5);
}

TEST(MoeRouteGpu, LogitsGemmMatchesFp32Product) {
  SKIP_WITHOUT_GPU();
  for (auto [T, E, D] : {std::tuple{1, 256, 2304}, std::tuple{17, 896, 512}, std::tuple{300, 64, 128}}) {
    const auto x = f32_to_bf16(ds::test::randn(static_cast<size_t>(T) * D, 1, 1.0f));
    const auto w = f32_to_bf16(ds::test::randn(static_cast<size_t>(E) * D, 2, 0.05f));
    DeviceBuffer dx = upload(x), dw = upload(w);
    const auto got = gemm_route(RouterParams{.E = E, .topk = 8}, T, D, dx.get<bf16_t>(), dw.get<bf16_t>(), nullptr).logits;
    std::vector<float> ref(got.size());
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += static_cast<double>(bf16_to_f32(x[t * D + d])) * bf16_to_f32(w[e * D + d]);
        ref[static_cast<size_t>(t) * E + e] = static_cast<float>(s);
      }
    EXPECT_CLOSE("router logits T=" + std::to_string(T) + " E=" + std::to_string(E), got, ref, 1e-5);
  }
}

// A token's logits must not depend on how many tokens share the call: decode (T <= 16, W prefetched before the
// wait) and prefill tiles sum every (token, expert) over the same chunks in the same order. D = 4096 runs the
// decode kernel past its prefetch depth, D = 96 leaves warps without a chunk, E = 100 a partial expert tile.
TEST(MoeRouteGpu, LogitsDoNotDependOnTheTokenCount) {
  SKIP_WITHOUT_GPU();
  for (auto [E, D] : {std::pair{256, 2304}, std::pair{100, 4096}, std::pair{64, 96}}) {
    const int T = 40;
    const auto x = f32_to_bf16(ds::test::randn(static_cast<size_t>(T) * D, 3, 1.0f));
    const auto w = f32_to_bf16(ds::test::randn(static_cast<size_t>(E) * D, 4, 0.05f));
    DeviceBuffer dx = upload(x), dw = upload(w);
    auto logits = [&](int t0, int n) {
      return gemm_route(RouterParams{.E = E, .topk = 8}, n, D, dx.get<bf16_t>() + static_cast<size_t>(t0) * D,
                        dw.get<bf16_t>(), nullptr)
          .logits;
    };
    const auto all = logits(0, T);  // the prefill tiles
    const auto first16 = logits(0, 16);
    int differ = bits_differ(first16.data(), all.data(), first16.size());
    for (int t : {0, 7, 23, 39}) differ += bits_differ(logits(t, 1).data(), all.data() + static_cast<size_t>(t) * E, E);
    std::printf("[err] router logits E=%d D=%d: T=1 and T=16 vs T=40, %d values differ in their bits\n", E, D, differ);
    EXPECT_EQ(differ, 0) << "E=" << E << " D=" << D;
  }
}

// The cluster kernel (router GEMM + top-k in one launch, decode sizes) against the two-kernel path: logits, ids
// and weights bit for bit, outputs poisoned before each run. Grouped and ungrouped selection, softmax, the HF
// weight switch, E below 256 (idle CTAs), D past the prefetch depth and below one chunk per warp, T up to 16.
TEST(MoeRouteGpu, ClusterKernelEqualsTwoKernels) {
  SKIP_WITHOUT_GPU();
  constexpr ScoringFunc kSig = ScoringFunc::kSigmoid;
  const RouteCase cases[] = {{256, 8, 1, 1, 2304, false, kSig},  {256, 8, 8, 4, 2304, true, kSig},
                             {64, 4, 64, 8, 4096, false, kSig},  {72, 6, 1, 1, 96, false, ScoringFunc::kSoftmax},
                             {256, 16, 1, 1, 512, false, kSig}};
  int compared = 0, differ = 0;
  for (const RouteCase& c : cases)
    for (int T : {1, 3, 16}) {
      const RouterParams r = c.params();
      const RouteInputs in(c, T, 7);
      const GemmRoute two = gemm_route(r, T, c.D, in.x.get<bf16_t>(), in.w.get<bf16_t>(), in.bias.get<float>());
      const GemmRoute one = gemm_route(r, T, c.D, in.x.get<bf16_t>(), in.w.get<bf16_t>(), in.bias.get<float>(), true);
      expect_bitwise_route(one, two, c.name(T), compared, differ);
    }
  std::printf("[err] cluster route vs two kernels: %d of %d logits and weights differ in their bits\n", differ,
              compared);
}

// The fused kernel (router GEMM whose last CTA runs the top-k; RouteParams::route_counter) against the two-kernel
// path: logits, ids and weights bit for bit, outputs poisoned before each run, every case run twice on one counter
// (the first run must re-arm it). Ungrouped selection (grouped routing keeps two kernels: checked to leave the
// counter untouched), softmax, the HF weight switch, E below 256 (fewer CTAs) and not a multiple of 8, D past the
// prefetch depth and below one chunk per warp, T up to 16 (two tokens per warp).
TEST(MoeRouteGpu, FusedKernelEqualsTwoKernels) {
  SKIP_WITHOUT_GPU();
  constexpr ScoringFunc kSig = ScoringFunc::kSigmoid;
  const RouteCase cases[] = {{256, 8, 1, 1, 2304, false, kSig},  {256, 8, 1, 1, 2304, true, kSig},
                             {64, 4, 1, 1, 4096, false, kSig},   {72, 6, 1, 1, 96, false, ScoringFunc::kSoftmax},
                             {256, 16, 1, 1, 512, false, kSig},  {20, 3, 1, 1, 64, false, kSig},
                             {256, 8, 8, 4, 2304, false, kSig}};
  DeviceBuffer counter(4);
  CUDA_CHECK(cudaMemset(counter.get(), 0, 4));
  int compared = 0, differ = 0;
  for (const RouteCase& c : cases)
    for (int T : {1, 3, 9, 16}) {
      const RouterParams r = c.params();
      const RouteInputs in(c, T, 17);
      const GemmRoute two = gemm_route(r, T, c.D, in.x.get<bf16_t>(), in.w.get<bf16_t>(), in.bias.get<float>());
      for (int rep = 0; rep < 2; ++rep) {
        const GemmRoute one = gemm_route(r, T, c.D, in.x.get<bf16_t>(), in.w.get<bf16_t>(), in.bias.get<float>(),
                                         false, nullptr, counter.get<int32_t>());
        const std::string what = c.name(T) + " rep " + std::to_string(rep);
        expect_bitwise_route(one, two, what, compared, differ);
        EXPECT_EQ(download<int32_t>(counter.get(), 1)[0], 0) << what << ": the counter must be re-armed";
      }
    }
  std::printf("[err] fused route vs two kernels: %d of %d logits and weights differ in their bits\n", differ,
              compared);
  EXPECT_FALSE(detail::route_fused_applies(17, RouterParams{.E = 256, .topk = 8}));
  EXPECT_FALSE(detail::route_fused_applies(1, RouterParams{.E = 384, .topk = 8}));
  EXPECT_FALSE(detail::route_fused_applies(1, RouterParams{.E = 256, .topk = 8, .num_expert_group = 8, .topk_group = 4}));
  EXPECT_TRUE(detail::route_fused_applies(16, RouterParams{.E = 256, .topk = 8}));
}

}  // namespace
}  // namespace ds::moe

#endif  // DELTASERVE_WITH_CUDA
