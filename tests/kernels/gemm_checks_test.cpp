// Host-side operand checks of the cuBLASLt wrapper: every rejection names its operand and happens before any CUDA
// call (these tests run in CI without a GPU; the device pointers below are never dereferenced).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/gemm/gemm.h"

namespace ds::gemm {
namespace {

// Fake, 256-byte aligned device addresses: the checks must never touch them.
void* fake(uintptr_t a) { return reinterpret_cast<void*>(a); }
TensorView dev(uintptr_t addr, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(fake(addr), t, dims, Device::kCUDA);
}

GemmParams good_bf16() {
  return {dev(0x10000, DType::kBF16, {17, 512}), dev(0x20000, DType::kBF16, {384, 512}), {}, {},
          dev(0x30000, DType::kBF16, {17, 384}), "test"};
}
GemmParams good_fp8(int M = 16) {
  return {dev(0x10000, DType::kF8E4M3, {M, 512}), dev(0x20000, DType::kF8E4M3, {384, 512}),
          dev(0x40000, DType::kF32, {4, M}), dev(0x50000, DType::kF32, {3, 4}), dev(0x30000, DType::kBF16, {M, 384}),
          "test"};
}

void expect_refused(const GemmParams& p, const std::string& operand, const std::string& what) {
  const auto r = gemm_unsupported(p);
  ASSERT_TRUE(r.has_value()) << "expected a refusal: " << what;
  EXPECT_NE(r->find("'" + operand + "'"), std::string::npos) << *r;
  EXPECT_NE(r->find(what), std::string::npos) << *r;
  EXPECT_THROW(check_gemm(p), Error);
}

// W8A16 (decode-size FP8 weights against bf16 x): M <= kDecodeMaxRows, weight scales required, no x scales.
GemmParams good_w8a16(int M = 4) {
  return {dev(0x10000, DType::kBF16, {M, 512}), dev(0x20000, DType::kF8E4M3, {384, 512}), {},
          dev(0x50000, DType::kF32, {3, 4}), dev(0x30000, DType::kBF16, {M, 384}), "test"};
}

// The fused input norm (norm_w) belongs to the decode GEMV: bf16 x with M <= 4 (bf16 or W8A16 weights), K % 8 == 0
// and K <= kNormMaxK, a 16-byte aligned weight.
TEST(GemmChecks, FusedInputNormOnlyOnTheDecodeGemv) {
  const auto* nw = static_cast<const bf16_t*>(fake(0x60000));
  for (GemmParams p : {good_w8a16(1), good_w8a16(4)}) {
    p.norm_w = nw;
    EXPECT_EQ(gemm_unsupported(p), std::nullopt);
  }
  GemmParams p = good_bf16();  // M = 17
  p.norm_w = nw;
  expect_refused(p, "norm_w", "M <= 4");
  p = good_fp8();
  p.norm_w = nw;
  expect_refused(p, "norm_w", "bf16 x");
  p = good_w8a16(1);
  p.x = dev(0x10000, DType::kBF16, {1, kNormMaxK + 128});
  p.w = dev(0x20000, DType::kF8E4M3, {384, kNormMaxK + 128});
  p.w_scale = dev(0x50000, DType::kF32, {3, w_scale_cols(kNormMaxK + 128)});
  EXPECT_EQ(gemm_unsupported(p), std::nullopt);  // fine without the norm
  p.norm_w = nw;
  expect_refused(p, "norm_w", "K <= 4096");
  p = good_w8a16(1);
  p.norm_w = static_cast<const bf16_t*>(fake(0x60008));
  expect_refused(p, "norm_w", "16-byte aligned");
}

TEST(GemmChecks, W8A16OnlyAtDecodeSizeWithWeightScales) {
  for (int M = 1; M <= kDecodeMaxRows; ++M) EXPECT_EQ(gemm_unsupported(good_w8a16(M)), std::nullopt) << M;
  expect_refused(good_w8a16(kDecodeMaxRows + 1), "x", "M <= 4");
  auto p = good_w8a16();
  p.w_scale = {};
  expect_refused(p, "w_scale", "missing");
  p = good_w8a16();
  p.w_scale = dev(0x50000, DType::kF32, {3, 3});  // unpadded scale rows
  expect_refused(p, "w_scale", "shape [3, 3]");
  p = good_w8a16();
  p.x_scale = dev(0x40000, DType::kF32, {4, 4});
  expect_refused(p, "x_scale", "W8A16");
  p = good_w8a16();
  p.x = dev(0x10000, DType::kBF16, {4, 528});
  p.w = dev(0x20000, DType::kF8E4M3, {384, 528});
  expect_refused(p, "x", "K % 128");
}

TEST(GemmChecks, AcceptsDenseAlignedOperands) {
  EXPECT_EQ(gemm_unsupported(good_bf16()), std::nullopt);
  EXPECT_EQ(gemm_unsupported(good_fp8()), std::nullopt);
  auto p = good_bf16();
  p.out.dtype = DType::kF32;  // lm_head logits
  EXPECT_EQ(gemm_unsupported(p), std::nullopt);
}

TEST(GemmChecks, RefusesStridedView) {
  auto p = good_bf16();
  // Columns [0, 512) of a [17, 1024] buffer: rows are 1024 apart, so reading it as dense would be wrong.
  p.x = dev(0x10000, DType::kBF16, {17, 1024}).slice_last(0, 512);
  expect_refused(p, "x", "strided view");
  auto q = good_bf16();
  q.out = dev(0x30000, DType::kBF16, {17, 400}).slice_last(16, 384);
  expect_refused(q, "out", "strided view");
}

TEST(GemmChecks, RefusesMisalignedPointer) {
  auto p = good_bf16();
  p.w.data = fake(0x20000 + 8);
  expect_refused(p, "w", "not 16-byte aligned");
  auto q = good_fp8();
  q.x_scale.data = fake(0x40000 + 4);
  expect_refused(q, "x_scale", "not 16-byte aligned");
}

TEST(GemmChecks, RefusesRowsThatBreakAlignment) {
  auto p = good_bf16();
  p.x = dev(0x10000, DType::kBF16, {17, 500});
  p.w = dev(0x20000, DType::kBF16, {384, 500});
  expect_refused(p, "x", "not a multiple of 16");
}

TEST(GemmChecks, RefusesWrongDtypes) {
  auto p = good_bf16();
  p.w.dtype = DType::kF16;
  expect_refused(p, "w", "dtype f16");
  auto q = good_bf16();
  q.x.dtype = DType::kF32;
  q.x.shape[1] = 512;
  expect_refused(q, "x", "dtype f32");
  auto r = good_fp8();
  r.out.dtype = DType::kF32;  // FP8 path: bf16 output only
  expect_refused(r, "out", "dtype f32");
}

TEST(GemmChecks, RefusesWrongShapes) {
  auto p = good_bf16();
  p.w = dev(0x20000, DType::kBF16, {384, 256});
  expect_refused(p, "w", "shape [384, 256]");
  auto q = good_bf16();
  q.out = dev(0x30000, DType::kBF16, {16, 384});
  expect_refused(q, "out", "shape [16, 384]");
  auto r = good_fp8();
  r.x_scale = dev(0x40000, DType::kF32, {16, 4});  // the K-major activation-scale layout: wrong results on the H200
  expect_refused(r, "x_scale", "shape [16, 4]");
  auto s = good_fp8();
  s.w_scale = dev(0x50000, DType::kF32, {4, 3});
  expect_refused(s, "w_scale", "shape [4, 3]");
}

// Weight-scale rows are padded to 4 floats (K/128 = 18 -> 20): unpadded rows made cuBLASLt read wrong scales.
TEST(GemmChecks, WeightScaleRowsArePadded) {
  auto p = good_fp8();
  p.x = dev(0x10000, DType::kF8E4M3, {16, 2304});
  p.w = dev(0x20000, DType::kF8E4M3, {384, 2304});
  p.x_scale = dev(0x40000, DType::kF32, {18, 16});
  p.w_scale = dev(0x50000, DType::kF32, {3, 20});
  EXPECT_EQ(gemm_unsupported(p), std::nullopt);
  EXPECT_EQ(w_scale_cols(2304), 20);
  EXPECT_EQ(w_scale_cols(256), 4);
  EXPECT_EQ(w_scale_cols(512), 4);
  p.w_scale = dev(0x50000, DType::kF32, {3, 18});
  expect_refused(p, "w_scale", "shape [3, 18]");
}

TEST(GemmChecks, RefusesFp8WithoutScalesOrBadK) {
  auto p = good_fp8();
  p.w_scale = {};
  expect_refused(p, "w_scale", "missing");
  auto q = good_fp8();
  q.x = dev(0x10000, DType::kF8E4M3, {16, 272});
  q.w = dev(0x20000, DType::kF8E4M3, {384, 272});
  const auto r = gemm_unsupported(q);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("K % 128"), std::string::npos) << *r;
}

// cuBLASLt 13.1 has no FP8 block-scaled algorithm for M = 1 or 17 on the H200 (and one operand order returned
// wrong numbers at M = 1): token counts that are not a multiple of 8 are refused, the caller pads.
TEST(GemmChecks, RefusesFp8RowCountsNotVerified) {
  for (int M : {1, 3, 17, 1001}) {
    const auto r = gemm_unsupported(good_fp8(M));
    ASSERT_TRUE(r.has_value()) << M;
    EXPECT_NE(r->find("M % 8 == 0"), std::string::npos) << *r;
    EXPECT_NE(r->find("'x'"), std::string::npos) << *r;
  }
  for (int M : {8, 16, 200, 1000}) EXPECT_EQ(gemm_unsupported(good_fp8(M)), std::nullopt) << M;
  auto p = good_bf16();  // the bf16 path takes any M
  for (int M : {1, 3, 17}) {
    p.x.shape[0] = M;
    p.out.shape[0] = M;
    EXPECT_EQ(gemm_unsupported(p), std::nullopt) << M;
  }
}

TEST(GemmChecks, RefusesHostMemory) {
  auto p = good_bf16();
  p.x.device = Device::kCPU;
  expect_refused(p, "x", "not on the CUDA device");
}

#ifdef DELTASERVE_WITH_CUDA
// The runner checks before its first CUDA call: on a machine without a GPU this still throws the operand error
// (not a CUDA error), and nothing is planned.
TEST(GemmChecks, RunnerRefusesBeforeAnyCudaCall) {
  GemmRunner runner;
  auto p = good_bf16();
  p.x = dev(0x10000, DType::kBF16, {17, 1024}).slice_last(0, 512);
  try {
    runner.run(p, nullptr);
    FAIL() << "run() accepted a strided view";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operand 'x' is a strided view"), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner.num_plans(), 0u);
}
#endif

}  // namespace
}  // namespace ds::gemm
