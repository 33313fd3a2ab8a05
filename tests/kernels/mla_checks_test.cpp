// MLA host-side logic in CI (no GPU): the fused A-GEMM refuses strided, misaligned, mistyped and misshapen operands
// with an error naming the operand before any CUDA call; capability check; split heuristic; workspace sizes.
#include <gtest/gtest.h>

#include <string>

#include "kernels/mla/mla.h"
#include "kernels/norm/norm.h"

namespace ds::mla {
namespace {

TensorView dev(uintptr_t addr, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(reinterpret_cast<void*>(addr), t, dims, Device::kCUDA);
}

// Kimi-Linear shapes: D = 2304, H = 32 -> packed N = 32 * 192 + 576 = 6720.
FusedAParams good(int T = 17) {
  FusedAParams p;
  p.x = dev(0x100000, DType::kBF16, {T, 2304});
  p.w = dev(0x200000, DType::kBF16, {6720, 2304});
  p.out = dev(0x300000, DType::kBF16, {T, 6720});
  return p;
}

void expect_refused(const FusedAParams& p, const std::string& operand, const std::string& what) {
  const auto r = fused_a_unsupported(p);
  ASSERT_TRUE(r.has_value()) << "expected a refusal: " << what;
  EXPECT_NE(r->find("mla fused A-GEMM"), std::string::npos) << *r;
  EXPECT_NE(r->find("'" + operand + "'"), std::string::npos) << *r;
  EXPECT_NE(r->find(what), std::string::npos) << *r;
#ifdef DELTASERVE_WITH_CUDA
  // The op itself refuses before any CUDA call: same message, no plan built, also on a machine without a GPU.
  gemm::GemmRunner runner;
  try {
    fused_a_gemm(runner, p, nullptr);
    ADD_FAILURE() << "fused_a_gemm accepted: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + operand + "'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner.num_plans(), 0u);
#endif
}

TEST(MlaChecks, FusedAAcceptsTheModelShapes) {
  for (int T : {1, 3, 17, 1000}) EXPECT_EQ(fused_a_unsupported(good(T)), std::nullopt) << T;
  auto p = good();
  p.heads = 16;  // tensor parallel 2: 16 * 192 + 576 = 3648 rows
  p.w = dev(0x200000, DType::kBF16, {3648, 2304});
  p.out = dev(0x300000, DType::kBF16, {17, 3648});
  EXPECT_EQ(fused_a_unsupported(p), std::nullopt);
}

TEST(MlaChecks, FusedARefusesStridedViews) {
  auto p = good();
  p.x = dev(0x100000, DType::kBF16, {17, 4608}).slice_last(0, 2304);  // every other row block of a wider buffer
  expect_refused(p, "x", "strided view");
  auto q = good();
  q.out = dev(0x300000, DType::kBF16, {17, 8192}).slice_last(0, 6720);
  expect_refused(q, "out", "strided view");
  auto r = good();
  r.w = dev(0x200000, DType::kBF16, {6720, 4096}).slice_last(1024, 2304);
  expect_refused(r, "w", "strided view");
}

TEST(MlaChecks, FusedARefusesMisalignedPointers) {
  auto p = good();
  p.x.data = reinterpret_cast<void*>(0x100000 + 2);  // one bf16 element off
  expect_refused(p, "x", "not 16-byte aligned");
  auto q = good();
  q.out.data = reinterpret_cast<void*>(0x300000 + 8);
  expect_refused(q, "out", "not 16-byte aligned");
  auto r = good();
  r.w.data = reinterpret_cast<void*>(0x200000 + 4);
  expect_refused(r, "w", "not 16-byte aligned");
}

TEST(MlaChecks, FusedARefusesWrongDtypes) {
  auto p = good();
  p.x.dtype = DType::kF16;
  expect_refused(p, "x", "dtype f16");
  auto q = good();
  q.w.dtype = DType::kF8E4M3;  // FP8 weights need FP8 activations (and scales)
  expect_refused(q, "w", "dtype f8e4m3");
  auto r = good();
  r.out.dtype = DType::kF32;
  expect_refused(r, "out", "dtype f32");
}

TEST(MlaChecks, FusedARefusesWrongShapes) {
  auto p = good();
  p.w = dev(0x200000, DType::kBF16, {6144, 2304});  // q_proj alone, kv_a not packed
  expect_refused(p, "w", "shape [6144, 2304]");
  auto q = good();
  q.x = dev(0x100000, DType::kBF16, {17, 2048});
  expect_refused(q, "x", "shape [17, 2048]");
  auto r = good();
  r.out = dev(0x300000, DType::kBF16, {16, 6720});
  expect_refused(r, "out", "shape [16, 6720]");
}

TEST(MlaChecks, FusedAFp8NeedsScales) {
  auto p = good(16);
  p.x.dtype = DType::kF8E4M3;
  p.w.dtype = DType::kF8E4M3;
  expect_refused(p, "x_scale", "missing");
  p.x_scale = dev(0x400000, DType::kF32, {18, 16});  // [D/128, T]
  p.w_scale = dev(0x500000, DType::kF32, {53, 20});  // [ceil(6720/128), D/128 = 18 padded to 20]
  EXPECT_EQ(fused_a_unsupported(p), std::nullopt);
  p.w_scale = dev(0x500000, DType::kF32, {52, 20});  // 6720 / 128 rounded down: the last partial block is missing
  expect_refused(p, "w_scale", "shape [52, 20]");
  p.w_scale = dev(0x500000, DType::kF32, {53, 18});  // unpadded rows: cuBLASLt would read the wrong scales
  expect_refused(p, "w_scale", "shape [53, 18]");
  // FP8 needs T % 8 == 0 (no cuBLASLt algorithm for T = 1 or 17 on the H200): the caller pads the token rows.
  auto q = good(17);
  q.x.dtype = DType::kF8E4M3;
  q.w.dtype = DType::kF8E4M3;
  q.x_scale = dev(0x400000, DType::kF32, {18, 17});
  q.w_scale = dev(0x500000, DType::kF32, {53, 20});
  expect_refused(q, "x", "M % 8 == 0");
}

// Decode steps (T <= 4) may hand bf16 x to FP8 weights: the GEMM's W8A16 path, which still needs the weight scales.
TEST(MlaChecks, FusedAW8A16OnlyAtDecodeSize) {
  auto p = good(4);
  p.w.dtype = DType::kF8E4M3;
  expect_refused(p, "w_scale", "missing");
  p.w_scale = dev(0x500000, DType::kF32, {53, 20});
  EXPECT_EQ(fused_a_unsupported(p), std::nullopt);
  auto q = good(8);
  q.w.dtype = DType::kF8E4M3;
  q.w_scale = dev(0x500000, DType::kF32, {53, 20});
  expect_refused(q, "w", "dtype f8e4m3");
}

TEST(MlaChecks, CapabilityNamesTheReason) {
  EXPECT_EQ(mla_unsupported({32}), std::nullopt);
  EXPECT_EQ(mla_unsupported({1}), std::nullopt);
  MlaDims d{32};
  d.latent = 256;
  auto r = mla_unsupported(d);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("512/64/128/128"), std::string::npos) << *r;
  d = MlaDims{32};
  d.rope = 32;
  EXPECT_TRUE(mla_unsupported(d).has_value());
  EXPECT_TRUE(mla_unsupported({0}).has_value());
  EXPECT_TRUE(mla_unsupported({kMaxHeads + 1}).has_value());
}

TEST(MlaChecks, DecodeSplitHeuristic) {
  // One wave of (sequence, head group, split) blocks on 132 SMs, splits no shorter than 64 rows (one KV tile).
  EXPECT_EQ(decode_num_splits(90, 132, 1, 32, 131072), 132);
  EXPECT_EQ(decode_num_splits(90, 132, 16, 32, 131072), 8);   // 128 blocks, not 144
  EXPECT_EQ(decode_num_splits(90, 132, 1, 32, 1024), 16);     // 1024 rows / 64 (one tile per split)
  EXPECT_EQ(decode_num_splits(90, 132, 1, 32, 100), 2);
  EXPECT_EQ(decode_num_splits(90, 132, 1, 64, 131072), 66);   // two head groups
  EXPECT_EQ(decode_num_splits(90, 132, 200, 32, 131072), 1);
  EXPECT_EQ(decode_num_splits(80, 108, 1, 32, 131072), 108);  // other architectures: the same rule
  EXPECT_EQ(decode_num_splits(90, 132, 1, 32, 1), 1);
}

TEST(MlaChecks, DecodeFusedCacheWriteCoversTheDecodeTokensAndIsChecked) {
  DecodeParams p;
  p.q = reinterpret_cast<const bf16_t*>(16);
  p.q_stride = 32 * kQk + kRow;
  p.wkv_b = p.q;
  p.cache = {reinterpret_cast<const bf16_t*>(16), reinterpret_cast<const int32_t*>(16), 16, 4};
  p.ctx_lens = reinterpret_cast<const int32_t*>(16);
  p.N = 2;
  p.H = 32;
  p.scale = 0.1f;
  p.workspace = reinterpret_cast<void*>(256);
  p.out = reinterpret_cast<bf16_t*>(16);
  CacheWriteParams w;
  w.ckv = p.q;
  w.ckv_stride = p.q_stride;
  w.norm_w = p.q;
  w.slot_mapping = reinterpret_cast<const int64_t*>(16);
  w.cache = reinterpret_cast<bf16_t*>(16);
  w.T = 3;
  p.write = &w;
  ASSERT_TRUE(decode_unsupported(p).has_value());
  EXPECT_NE(decode_unsupported(p)->find("write.T = 3"), std::string::npos) << *decode_unsupported(p);
  w.T = 2;
  EXPECT_FALSE(decode_unsupported(p).has_value()) << *decode_unsupported(p);
  w.ckv_stride = 100;
  ASSERT_TRUE(decode_unsupported(p).has_value());
  EXPECT_NE(decode_unsupported(p)->find("cache_write"), std::string::npos) << *decode_unsupported(p);
}

TEST(MlaChecks, WorkspaceSizesCoverTheBuffers) {
  // q_abs + o_part + lse, each rounded to 256 bytes.
  EXPECT_GE(decode_workspace_bytes(16, 32, 8), size_t{16} * 32 * 576 * 2 + size_t{16} * 8 * 32 * 512 * 4);
  EXPECT_EQ(decode_workspace_bytes(1, 32, 1) % 256, 0u);
  EXPECT_GE(prefill_workspace_bytes(1000, 32), size_t{1000} * (512 + 64 + 32 * 256) * 2);
  EXPECT_EQ(prefill_workspace_bytes(0, 32), 0u);
}

TEST(NormChecks, SupportedWidths) {
  EXPECT_EQ(norm::rmsnorm_unsupported(2304), std::nullopt);
  EXPECT_EQ(norm::rmsnorm_unsupported(512), std::nullopt);
  EXPECT_EQ(norm::rmsnorm_unsupported(8192), std::nullopt);
  EXPECT_TRUE(norm::rmsnorm_unsupported(2300).has_value());
  EXPECT_TRUE(norm::rmsnorm_unsupported(16384).has_value());
}

}  // namespace
}  // namespace ds::mla
