// KDA decode kernel vs the fp32 CPU reference: every instantiated head count through every layout, general
// head counts through many-heads, padding rows, sentinel slots, strong decays, reads before the PDL wait.
// GPU only (skips without one).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "kernels/gemm/gemm.h"
#include "tests/kernels/kda_test_common.h"

#ifdef DELTASERVE_WITH_CUDA
namespace ds::kda::test {
namespace {

constexpr double kTol = 5e-3;

// One decode step of `n_rows` rows (rows in `padding` are padding) through the given layout; compares the
// output, the pools (touched slots vs reference, others bit-identical) and that every output was written.
void run_decode_case(int H, int n_rows, KdaLayout layout, uint64_t seed, const std::vector<int>& padding,
                     float A_log_shift = 0.0f) {
  LayerProblem p = make_problem(std::vector<int>(n_rows, 1), H, seed, padding);
  for (auto& a : p.A_log) a += A_log_shift;
  DeviceLayer d(p);
  std::vector<int> rows(n_rows);
  std::iota(rows.begin(), rows.end(), 0);
  d.set_rows(rows, p.slots);
  kda_decode_launch(d.decode_params(), layout, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> state_ref = p.state;
  std::vector<uint16_t> conv_ref = p.conv;
  const auto ref = reference_layer(p, p.cu, p.slots, 0, state_ref, conv_ref);
  const std::string what = fmt::format("decode {} H={} N={}", kda_layout_name(layout), H, n_rows);
  EXPECT_CLOSE(what + ": output", d.output(), ref, kTol);
  std::vector<int32_t> touched;
  for (int s : p.slots)
    if (s >= 0) touched.push_back(s);
  expect_pools(what, d, state_ref, conv_ref, touched, kTol);
}

constexpr KdaLayout kLayouts[] = {KdaLayout::kMany, KdaLayout::kCompact, KdaLayout::kStream};

TEST(KdaDecode, EveryInstantiatedHeadCountEveryLayout) {
  SKIP_WITHOUT_GPU();
  for (int H : kCompactHeadCounts)
    for (KdaLayout layout : kLayouts) run_decode_case(H, 5, layout, 1000 + H, {2});
}

// Head counts without a compact instantiation: many-heads and the streaming kernel take any count.
TEST(KdaDecode, GeneralHeadCounts) {
  SKIP_WITHOUT_GPU();
  for (int H : {5, 7, 40})
    for (KdaLayout layout : {KdaLayout::kMany, KdaLayout::kStream}) run_decode_case(H, 3, layout, 2000 + H, {});
}

// 1,200 (sequence, head) items: the streaming kernel's CTAs walk ~9 items each through its three state buffers
// (every buffer refilled, the mbarrier parity flipping), padding rows landing on different buffers.
TEST(KdaDecode, LargeBatchWithPaddingRows) {
  SKIP_WITHOUT_GPU();
  for (KdaLayout layout : kLayouts) run_decode_case(4, 300, layout, 3000, {0, 17, 150, 151, 299});
}

TEST(KdaDecode, AllPaddingRowsTouchNothing) {
  SKIP_WITHOUT_GPU();
  for (KdaLayout layout : kLayouts) run_decode_case(8, 3, layout, 3500, {0, 1, 2});
}

TEST(KdaDecode, StrongDecayStaysFinite) {
  SKIP_WITHOUT_GPU();
  // exp(A_log) ~ 20-90: per-step log-decays of -10 and below on many channels.
  for (KdaLayout layout : kLayouts) run_decode_case(16, 6, layout, 4000, {}, 3.0f);
}

TEST(KdaDecode, CheckedEntryPointUsesTheSelector) {
  SKIP_WITHOUT_GPU();
  LayerProblem p = make_problem({1, 1, 1}, 5, 5000);
  DeviceLayer d(p);
  d.set_rows({0, 1, 2}, p.slots);
  EXPECT_THROW(kda_decode(d.decode_params(), KdaDecodeSetup{90, KdaLayout::kCompact}, nullptr), Error);
  kda_decode(d.decode_params(), kda_decode_setup(), nullptr);  // auto/env: many-heads for H=5
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> state_ref = p.state;
  std::vector<uint16_t> conv_ref = p.conv;
  const auto ref = reference_layer(p, p.cu, p.slots, 0, state_ref, conv_ref);
  EXPECT_CLOSE("decode checked entry H=5: output", d.output(), ref, kTol);
}

// The engine's decode order: the f_b/g_b GEMV pair writes f and gz, then the decode kernel, launched with PDL and
// qkv_ready, reads everything else before its wait. f and gz are poisoned (NaN) before every pair, so a read that
// overtook the wait shows. The chain is checked against the CPU reference once, then repeated bitwise against
// the same chain with the wait first (races show as mismatches).
TEST(KdaDecode, InputsReadBeforeThePdlWaitEqualWaitingFirst) {
  SKIP_WITHOUT_GPU();
  constexpr int kRank = 128, kRows = 4, kRepeats = 20;
  for (const auto& [H, layout] : {std::pair{32, KdaLayout::kMany}, std::pair{16, KdaLayout::kCompact},
                                  std::pair{3, KdaLayout::kMany}, std::pair{32, KdaLayout::kStream}}) {
    LayerProblem p = make_problem(std::vector<int>(kRows, 1), H, 6000 + H, {2});
    DeviceLayer d(p);
    d.set_rows({0, 1, 2, 3}, p.slots);
    const int P = p.P;
    std::mt19937 rng(H);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    auto rand_bf16 = [&](size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = f32_to_bf16(u(rng));
      return v;
    };
    const DeviceBuffer fa = upload(rand_bf16(kRows * kRank)), ga = upload(rand_bf16(kRows * kRank));
    const DeviceBuffer wf = upload(rand_bf16(static_cast<size_t>(P) * kRank));
    const DeviceBuffer wg = upload(rand_bf16(static_cast<size_t>(P) * kRank));
    DeviceBuffer f(static_cast<size_t>(kRows) * P * 2), gz(static_cast<size_t>(kRows) * P * 2);
    KdaDecodeParams k = d.decode_params();
    k.f = {f.get<bf16_t>(), P};
    k.gz = {gz.get<bf16_t>(), P};
    CudaStream stream;
    auto chain = [&](bool ready) {
      const cudaStream_t s = stream.get();
      CUDA_CHECK(cudaMemcpyAsync(d.state.get(), p.state.data(), d.state.bytes(), cudaMemcpyHostToDevice, s));
      CUDA_CHECK(cudaMemcpyAsync(d.conv.get(), p.conv.data(), d.conv.bytes(), cudaMemcpyHostToDevice, s));
      for (const DeviceBuffer* b : {&f, &gz, &d.out}) CUDA_CHECK(cudaMemsetAsync(b->get(), 0xff, b->bytes(), s));
      gemm::gemv_pair_bf16({fa.get<bf16_t>(), kRank, wf.get<bf16_t>(), f.get<bf16_t>(), P, kRank},
                           {ga.get<bf16_t>(), kRank, wg.get<bf16_t>(), gz.get<bf16_t>(), P, kRank}, kRows, s);
      k.qkv_ready = ready;
      kda_decode_launch(k, layout, s);
      stream.sync();
    };
    const std::string what = fmt::format("decode after the GEMV pair, {} H={}", kda_layout_name(layout), H);

    chain(false);
    LayerProblem with_pair = p;  // the reference reads f and gz from fg: put the pair's outputs there
    const auto fh = download<uint16_t>(f), gh = download<uint16_t>(gz);
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < P; ++c) {
        with_pair.fg[r * p.ld_fg + p.f_col() + c] = fh[r * P + c];
        with_pair.fg[r * p.ld_fg + p.gz_col() + c] = gh[r * P + c];
      }
    std::vector<float> state_ref = p.state;
    std::vector<uint16_t> conv_ref = p.conv;
    EXPECT_CLOSE(what + ": output", d.output(),
                 reference_layer(with_pair, p.cu, p.slots, 0, state_ref, conv_ref), kTol);
    const auto out0 = download<uint16_t>(d.out);
    const auto state0 = download<float>(d.state);
    const auto conv0 = download<uint16_t>(d.conv);

    int64_t mismatched = 0;
    for (int i = 0; i < kRepeats; ++i) {
      chain(true);
      const auto out = download<uint16_t>(d.out);
      const auto state = download<float>(d.state);
      const auto conv = download<uint16_t>(d.conv);
      for (size_t j = 0; j < out.size(); ++j) mismatched += out[j] != out0[j];
      for (size_t j = 0; j < state.size(); ++j) mismatched += std::memcmp(&state[j], &state0[j], 4) != 0;
      for (size_t j = 0; j < conv.size(); ++j) mismatched += conv[j] != conv0[j];
    }
    std::printf("[err] %-40s repeats=%d mismatched elements=%lld (bitwise)\n", what.c_str(), kRepeats,
                static_cast<long long>(mismatched));
    EXPECT_EQ(mismatched, 0) << what;
  }
}

}  // namespace
}  // namespace ds::kda::test
#endif  // DELTASERVE_WITH_CUDA
