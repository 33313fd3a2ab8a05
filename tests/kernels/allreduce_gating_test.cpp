// Fused finalize + all-reduce + RMSNorm on the host: one rejection test per gating reason, the launch-shape
// heuristic, the knob's parsing, the buffer layout, and the CPU reference on a hand-computed case.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "kernels/allreduce/allreduce.h"
#include "kernels/allreduce/allreduce_ref.h"

namespace ds::allreduce {
namespace {

FusedArNormConfig good() {
  FusedArNormConfig c;
  c.world = 8;
  c.dtype = DType::kBF16;
  c.peer_access = true;
  c.D = 7168;
  c.TOPK = 8;
  c.slot_elems = 16 * 7168;
  c.max_tokens = 2;
  c.T = 2;
  c.aligned = true;
  c.co_resident_ranks = 1;
  c.resident_blocks = 132 * 8;
  return c;
}

// The reason names what was wrong (the log line is all an operator sees).
void expect_reason(const FusedArNormConfig& c, const std::string& needle) {
  const auto why = fused_ar_norm_unsupported(c);
  ASSERT_TRUE(why.has_value()) << "expected a rejection mentioning '" << needle << "'";
  EXPECT_NE(why->find(needle), std::string::npos) << *why;
}

TEST(AllReduceGating, AcceptsTheSupportedConfigurations) {
  for (int world : {2, 4, 8, 16})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (int D : {2304, 7168, 8, 8192, 136})
        for (int T : {0, 1, 2}) {
          auto c = good();
          c.world = world;
          c.dtype = dt;
          c.D = D;
          c.T = T;
          c.slot_elems = static_cast<size_t>(2) * D;
          const auto why = fused_ar_norm_unsupported(c);
          EXPECT_FALSE(why.has_value()) << world << " " << D << " " << T << ": " << *why;
        }
}

TEST(AllReduceGating, RejectsKnobZero) {
  auto c = good();
  c.max_tokens = 0;
  expect_reason(c, "DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS = 0");
}

TEST(AllReduceGating, RejectsTensorParallelDegree) {
  for (int w : {1, 3, 6, 32}) {
    auto c = good();
    c.world = w;
    expect_reason(c, "tensor-parallel degree " + std::to_string(w));
  }
}

TEST(AllReduceGating, RejectsDtype) {
  for (DType dt : {DType::kF32, DType::kF8E4M3}) {
    auto c = good();
    c.dtype = dt;
    expect_reason(c, "activation dtype");
  }
}

TEST(AllReduceGating, RejectsMissingPeerAccess) {
  auto c = good();
  c.peer_access = false;
  expect_reason(c, "peer access");
}

TEST(AllReduceGating, RejectsHiddenSize) {
  for (int D : {0, 4, 2300, 8200, 16384}) {
    auto c = good();
    c.D = D;
    c.slot_elems = 1 << 20;
    expect_reason(c, "hidden size " + std::to_string(D));
  }
}

TEST(AllReduceGating, RejectsMisalignedOperands) {
  auto c = good();
  c.aligned = false;
  expect_reason(c, "16-byte aligned");
}

TEST(AllReduceGating, RejectsTopk) {
  for (int k : {0, 17}) {
    auto c = good();
    c.TOPK = k;
    expect_reason(c, "TOPK");
  }
}

TEST(AllReduceGating, RejectsSmallBuffers) {
  auto c = good();
  c.slot_elems = 2 * 7168 - 8;  // one vector short of the largest batch the knob lets through
  expect_reason(c, "peer buffers too small");
  c.slot_elems = 2 * 7168;
  EXPECT_FALSE(fused_ar_norm_unsupported(c).has_value());
}

TEST(AllReduceGating, RejectsBatchesAboveTheKnob) {
  auto c = good();
  c.T = 3;
  expect_reason(c, "T = 3 tokens > DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS = 2");
  c.max_tokens = 16;
  c.T = 17;
  expect_reason(c, "T = 17");
}

TEST(AllReduceGating, RejectsRanksThatCannotBeCoResident) {
  auto c = good();
  c.co_resident_ranks = 8;  // simulated ranks on one device
  c.resident_blocks = 20;   // 8 ranks x 2 tokens x 2 chunks (vpt 4) = 32 > 20
  expect_reason(c, "co-resident");
  c.resident_blocks = 32;
  EXPECT_FALSE(fused_ar_norm_unsupported(c).has_value());
}

TEST(AllReduceGating, GridPrefersManyBlocksWithinCoResidency) {
  // D = 7168: 896 vectors; 128 threads x 1 vector -> 7 chunks per token.
  auto g = fused_ar_norm_grid(1, 7168, 1, 1056);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->vpt, 1);
  EXPECT_EQ(g->chunks, 7);
  g = fused_ar_norm_grid(1, 2304, 1, 1056);  // 288 vectors -> 3 chunks
  ASSERT_TRUE(g);
  EXPECT_EQ(g->chunks, 3);
  // 16 tokens x 8 simulated ranks: 16 x 7 x 8 = 896 blocks fit 1056, 16 x 4 x 8 = 512 fit 600.
  g = fused_ar_norm_grid(16, 7168, 8, 1056);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->vpt, 1);
  g = fused_ar_norm_grid(16, 7168, 8, 600);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->vpt, 2);
  EXPECT_EQ(g->chunks, 4);
  EXPECT_FALSE(fused_ar_norm_grid(16, 7168, 8, 100));
  // D = 8192 at vpt 1 needs exactly kMaxChunks blocks per token.
  g = fused_ar_norm_grid(1, 8192, 1, 0);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->chunks, kMaxChunks);
  g = fused_ar_norm_grid(1, 7168, 1, 0, 4);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->vpt, 4);
  EXPECT_EQ(g->chunks, 2);
}

TEST(AllReduceGating, PeerAllReduceBlocksAreBounded) {
  EXPECT_EQ(peer_all_reduce_blocks(8, 1, 1000), 1);
  EXPECT_EQ(peer_all_reduce_blocks(2 * 7168, 1, 1000), 14);
  EXPECT_EQ(peer_all_reduce_blocks(1 << 24, 1, 1056), 1056);
  // Simulated ranks on one device: all ranks' spinning blocks together stay near one SM in four.
  EXPECT_EQ(peer_all_reduce_blocks(1 << 24, 8, 1056), 4);
  EXPECT_EQ(peer_all_reduce_blocks(1 << 24, 4, 1056), 8);
  EXPECT_EQ(peer_all_reduce_blocks(1 << 24, 16, 100), 1);
  EXPECT_EQ(peer_all_reduce_blocks(1 << 24, 1, 0), 32);
}

TEST(AllReduceGating, KnobParsing) {
  const IntKnob& k = knobs::kFusedFinalizeArNormMaxTokens;
  EXPECT_STREQ(k.name, "DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS");
  EXPECT_EQ(parse_int_knob(k, nullptr), 2);
  EXPECT_EQ(parse_int_knob(k, "0"), 0);
  EXPECT_EQ(parse_int_knob(k, "16"), 16);
  EXPECT_EQ(parse_int_knob(k, "17"), 16);  // clamped, with a warning
  EXPECT_EQ(parse_int_knob(k, "-1"), 0);
  for (const char* bad : {"two", "2.0", "", " 2", "2x", "1e1"}) {
    try {
      parse_int_knob(k, bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS"), std::string::npos) << e.what();
    }
  }
}

TEST(AllReduceGating, BufferLayout) {
  EXPECT_EQ(data_offset_bytes() % 256, 0u);
  EXPECT_GE(data_offset_bytes(), sizeof(ArState) + kSsWords * 4);
  EXPECT_EQ(buffer_bytes(8, 1024), data_offset_bytes() + 2 * 8 * 1024 * 2);
  std::vector<std::vector<char>> mem(4, std::vector<char>(buffer_bytes(4, 64) + 256));
  std::vector<void*> bases;
  for (auto& m : mem) bases.push_back(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(m.data()) + 255) / 256 * 256));
  const RankView v = make_rank_view(bases.data(), 2, 4, 64);
  EXPECT_EQ(static_cast<void*>(v.state), bases[2]);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(reinterpret_cast<char*>(v.peer_data[r]), static_cast<char*>(bases[r]) + data_offset_bytes());
  EXPECT_THROW(make_rank_view(bases.data(), 4, 4, 64), Error);
  EXPECT_THROW(make_rank_view(bases.data(), 0, 4, 60), Error);
}

// The protocol is single-in-flight per buffer set: a call on any other stream than the owner's is refused.
TEST(AllReduceGating, OneStreamPerBufferSet) {
  std::vector<std::vector<char>> mem(2, std::vector<char>(buffer_bytes(2, 64) + 256));
  std::vector<void*> bases;
  for (auto& m : mem) bases.push_back(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(m.data()) + 255) / 256 * 256));
  RankView v = make_rank_view(bases.data(), 0, 2, 64);
  v.owner_stream = reinterpret_cast<cudaStream_t>(0x10);
  alignas(16) static char data[128];
  PeerAllReduceParams a;
  a.count = 8;
  a.in = a.out = data;
  a.comm = v;
  a.stream = reinterpret_cast<cudaStream_t>(0x20);
  try {
    peer_all_reduce(a);
    ADD_FAILURE() << "a second stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("owner stream"), std::string::npos) << e.what();
  }
}

TEST(AllReduceGating, OpsRejectBadCallsWithReasons) {
  FusedArNormParams p;
  p.D = 7168;
  p.TOPK = 8;
  p.T = 1;
  p.dtype = DType::kF32;
  EXPECT_THROW(fused_finalize_ar_norm(p), Error);
  p.dtype = DType::kBF16;
  EXPECT_THROW(fused_finalize_ar_norm(p), Error);  // no buffers in the view
  PeerAllReduceParams a;
  a.count = 12;
  EXPECT_THROW(peer_all_reduce(a), Error);
}

// R = 2, T = 1, D = 8, TOPK = 3: values chosen so every step is exact except the roundings under test.
TEST(AllReduceReference, HandComputedCase) {
  const int D = 8, K = 3;
  std::vector<float> y0(K * D), y1(K * D), w0 = {0.5f, 0.25f, 4.0f}, w1 = {1.0f, 1.0f, 1.0f};
  for (int d = 0; d < D; ++d) {
    y0[0 * D + d] = 1.0f;
    y0[1 * D + d] = 2.0f;
    y0[2 * D + d] = 100.0f;  // dropped route: must not count
    y1[0 * D + d] = 0.5f;
    y1[1 * D + d] = 0.00390625f;  // 2^-8: 0.5 + 2^-8 + 1 (shared) rounds to 1.5 in bf16 (8-bit significand)
    y1[2 * D + d] = 0.0f;
  }
  const std::vector<int32_t> e0 = {0, 1, -1}, e1 = {3, 4, 5};
  const std::vector<float> shared1(D, 1.0f), residual(D, 3.0f), nw(D, 2.0f);
  std::vector<float> sum(D), res(D), out(D);
  FusedArNormRefArgs a;
  a.T = 1;
  a.D = D;
  a.TOPK = K;
  a.eps = 0.0f;
  a.expert_out = {y0.data(), y1.data()};
  a.expanded_to_permuted = {e0.data(), e1.data()};
  a.topk_weights = {w0.data(), w1.data()};
  a.shared_out = {nullptr, shared1.data()};  // a replicated shared expert: added on one rank only
  a.residual = residual.data();
  a.norm_w = nw.data();
  a.sum = sum.data();
  a.residual_out = res.data();
  a.y = out.data();
  fused_ar_norm_ref(a);
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(sum[d], 2.5f);   // rank 0: 0.5 + 0.5 = 1; rank 1: bf16(1.50390625) = 1.5
    EXPECT_EQ(res[d], 5.5f);   // 3 + 2.5
    EXPECT_NEAR(out[d], 2.0f, 1e-6f);  // constant row: RMSNorm gives 1, times the weight 2
  }
  // fp16 keeps 2^-8 next to 1.5 (11-bit significand): the partial is not rounded away.
  a.dtype = DType::kF16;
  fused_ar_norm_ref(a);
  EXPECT_EQ(sum[0], 2.50390625f);
  EXPECT_EQ(round_act(DType::kBF16, 1.00390625f), 1.0f);
  EXPECT_EQ(round_act(DType::kF16, 1.00390625f), 1.00390625f);
}

}  // namespace
}  // namespace ds::allreduce
