// KDA decode kernel vs the fp32 CPU reference: every instantiated head count through both layouts, general
// head counts through many-heads, padding rows, sentinel slots, strong decays. GPU only (skips without one).
#include <gtest/gtest.h>

#include <string>

#include "tests/kernels/kda_test_common.h"

#ifdef DELTASERVE_WITH_CUDA
namespace ds::kda::test {
namespace {

constexpr double kTol = 5e-3;

// One decode step of `n_rows` rows (rows in `padding` are padding) through the given layout; compares the
// output, the pools (touched slots vs reference, others bit-identical) and that every output was written.
void run_decode_case(int H, int n_rows, bool compact, uint64_t seed, const std::vector<int>& padding,
                     float A_log_shift = 0.0f) {
  LayerProblem p = make_problem(std::vector<int>(n_rows, 1), H, seed, padding);
  for (auto& a : p.A_log) a += A_log_shift;
  DeviceLayer d(p);
  std::vector<int> rows(n_rows);
  std::iota(rows.begin(), rows.end(), 0);
  d.set_rows(rows, p.slots);
  kda_decode_launch(d.decode_params(), compact, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> state_ref = p.state;
  std::vector<uint16_t> conv_ref = p.conv;
  const auto ref = reference_layer(p, p.cu, p.slots, 0, state_ref, conv_ref);
  const std::string what = fmt::format("decode {} H={} N={}", compact ? "compact" : "many", H, n_rows);
  EXPECT_CLOSE(what + ": output", d.output(), ref, kTol);
  std::vector<int32_t> touched;
  for (int s : p.slots)
    if (s >= 0) touched.push_back(s);
  expect_pools(what, d, state_ref, conv_ref, touched, kTol);
}

TEST(KdaDecode, EveryInstantiatedHeadCountBothLayouts) {
  SKIP_WITHOUT_GPU();
  for (int H : kCompactHeadCounts)
    for (bool compact : {false, true}) run_decode_case(H, 5, compact, 1000 + H, {2});
}

TEST(KdaDecode, GeneralHeadCountsManyHeads) {
  SKIP_WITHOUT_GPU();
  for (int H : {5, 7, 40}) run_decode_case(H, 3, false, 2000 + H, {});
}

TEST(KdaDecode, LargeBatchWithPaddingRows) {
  SKIP_WITHOUT_GPU();
  for (bool compact : {false, true}) run_decode_case(4, 300, compact, 3000, {0, 17, 150, 299});
}

TEST(KdaDecode, AllPaddingRowsTouchNothing) {
  SKIP_WITHOUT_GPU();
  for (bool compact : {false, true}) run_decode_case(8, 3, compact, 3500, {0, 1, 2});
}

TEST(KdaDecode, StrongDecayStaysFinite) {
  SKIP_WITHOUT_GPU();
  // exp(A_log) ~ 20-90: per-step log-decays of -10 and below on many channels.
  for (bool compact : {false, true}) run_decode_case(16, 6, compact, 4000, {}, 3.0f);
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

}  // namespace
}  // namespace ds::kda::test
#endif  // DELTASERVE_WITH_CUDA
