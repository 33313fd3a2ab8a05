// MoE host-side tests (run in CI, no GPU): capability rejections with reasons, workspace sizing, the path
// heuristic for several architectures, bit-exact helpers shared with the kernels, and the format references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_bits.h"
#include "kernels/moe/moe_quant_ref.h"
#include "kernels/moe/moe_stream_rows.h"
#include "kernels/moe/moe_workspace.h"

namespace ds::moe {
namespace {

MoeParams kimi(WeightFormat w = WeightFormat::kBF16, ActFormat a = ActFormat::kBF16) {
  MoeParams p;
  p.D = 2304;
  p.I = 1024;
  p.router = RouterParams{.E = 256, .topk = 8, .routed_scaling_factor = 2.446f};
  p.max_tokens = 1024;
  p.weight_format = w;
  p.act_format = a;
  p.has_shared = true;
  return p;
}

void expect_refused(const MoeParams& p, const std::string& word) {
  const auto why = moe_unsupported(p);
  ASSERT_TRUE(why.has_value()) << "expected a refusal mentioning '" << word << "'";
  EXPECT_NE(why->find(word), std::string::npos) << *why;
  EXPECT_THROW(moe_workspace_bytes(p), ds::Error);
}

TEST(MoeHost, AcceptsEveryImplementedFormatPair) {
  const std::pair<WeightFormat, ActFormat> pairs[] = {
      {WeightFormat::kBF16, ActFormat::kBF16},      {WeightFormat::kFP8Block, ActFormat::kFP8Block},
      {WeightFormat::kMXFP8, ActFormat::kMXFP8},    {WeightFormat::kMXFP4, ActFormat::kBF16},
      {WeightFormat::kNVFP4, ActFormat::kBF16},     {WeightFormat::kNVFP4, ActFormat::kFP8Block}};
  for (auto [w, a] : pairs) {
    EXPECT_FALSE(moe_unsupported(kimi(w, a)).has_value()) << weight_format_name(w);
    MoeParams big = kimi(w, a);  // the larger model: 896 experts, top-16, 7168 / 2048
    big.D = 7168;
    big.I = 2048;
    big.router.E = 896;
    big.router.topk = 16;
    EXPECT_FALSE(moe_unsupported(big).has_value()) << weight_format_name(w);
  }
}

TEST(MoeHost, RefusesWithReasons) {
  MoeParams p = kimi();
  p.arch = 75;
  expect_refused(p, "sm_80");
  p.arch = 89;
  expect_refused(p, "sm_90a");
  p = kimi();
  p.D = 2300;
  expect_refused(p, "multiple of 128");
  p = kimi();
  p.I = 1000;
  expect_refused(p, "multiple of 128");
  p = kimi();
  p.router.E = 2048;
  expect_refused(p, "E=2048");
  p = kimi();
  p.router.topk = 17;
  expect_refused(p, "top-k 17");
  p = kimi();
  p.router.num_expert_group = 3;
  expect_refused(p, "groups");
  p = kimi();
  p.router.num_expert_group = 8;
  p.router.topk_group = 1;
  p.router.topk = 40;  // > 32 experts in one kept group, and > 16
  expect_refused(p, "top-k");
  p = kimi();
  p.expert_begin = 200;
  p.expert_end = 100;
  expect_refused(p, "local expert range");
  p = kimi();
  p.max_tokens = 0;
  expect_refused(p, "max_tokens");
  p = kimi(WeightFormat::kMXFP4, ActFormat::kFP8Block);
  expect_refused(p, "not an implemented pair");
  p = kimi(WeightFormat::kBF16, ActFormat::kMXFP8);
  expect_refused(p, "not an implemented pair");
  p = kimi(WeightFormat::kMXFP4, ActFormat::kBF16);
  p.force_path = GemmPath::kWgmma;
  expect_refused(p, "wgmma");
}

TEST(MoeHost, SeparatedRoutingDoesNotNeedRouterGroupsToBeValid) {
  MoeParams p = kimi();
  p.routing = RoutingMode::kSeparated;
  p.router.num_expert_group = 3;  // the op never routes: the caller's ids are used
  EXPECT_FALSE(moe_unsupported(p).has_value());
  p.routing = RoutingMode::kInKernel;
  EXPECT_TRUE(moe_unsupported(p).has_value());
}

TEST(MoeHost, WorkspaceLayoutIsAlignedDisjointAndSizedForMaxTokens) {
  for (auto [w, a] : {std::pair{WeightFormat::kBF16, ActFormat::kBF16}, std::pair{WeightFormat::kFP8Block, ActFormat::kFP8Block},
                      std::pair{WeightFormat::kMXFP8, ActFormat::kMXFP8}}) {
    MoeParams p = kimi(w, a);
    const auto L = detail::workspace_layout(p);
    const size_t offs[] = {L.logits, L.topk_ids, L.topk_w, L.e2p, L.grp_begin, L.grp_count, L.active,
                           L.num_active, L.tile_prefix, L.row_token, L.row_dest, L.qcounters, L.chunk_hist,
                           L.fcounters, L.xq, L.xscale, L.h, L.hscale, L.h32, L.expert_out, L.shared_out, L.total};
    for (size_t i = 0; i + 1 < std::size(offs); ++i) {
      EXPECT_EQ(offs[i] % 256, 0u);
      EXPECT_LE(offs[i], offs[i + 1]);
    }
    const int64_t Tm = p.max_tokens, R = Tm * 8, P = R + Tm;
    EXPECT_GE(L.row_token + 0, L.tile_prefix + (257 + 1) * 4);
    EXPECT_EQ(L.row_dest - L.row_token, static_cast<size_t>((P * 4 + 255) / 256 * 256));
    EXPECT_EQ(L.shared_out - L.expert_out, static_cast<size_t>(R * 2304 * 2));
    const bool q = a != ActFormat::kBF16;
    EXPECT_EQ(L.h32 == L.hscale, !q) << "fp32 staging only for quantised down inputs";
    EXPECT_EQ(moe_workspace_bytes(p), L.total);
    MoeParams bigger = p;
    bigger.max_tokens = 2048;
    EXPECT_GT(moe_workspace_bytes(bigger), moe_workspace_bytes(p));
    MoeParams deferred = p;
    deferred.do_finalize = false;  // y and the shared output live in the caller's buffers
    EXPECT_EQ(moe_workspace_bytes(p) - moe_workspace_bytes(deferred),
              static_cast<size_t>(R * 2304 * 2 + Tm * 2304 * 2));
    MoeParams sep = p;
    sep.routing = RoutingMode::kSeparated;  // no logits
    EXPECT_EQ(moe_workspace_bytes(p) - moe_workspace_bytes(sep), static_cast<size_t>(Tm * 256 * 4));
  }
}

TEST(MoeHost, PathHeuristicPerArchitecture) {
  MoeParams p = kimi();
  for (int arch : {80, 89, 100, 120}) {
    EXPECT_EQ(moe_choose_path(arch, 1, p), GemmPath::kStream) << arch;
    EXPECT_EQ(moe_choose_path(arch, 16384, p), GemmPath::kStream) << arch << ": no wgmma off sm_90";
  }
  // sm_90: one token with the fused finalize is the gemv decode (bf16 and FP8-block weights only), ...
  EXPECT_EQ(moe_choose_path(90, 1, p), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 1, kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block)), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 1, kimi(WeightFormat::kMXFP4, ActFormat::kBF16)), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 1, kimi(WeightFormat::kNVFP4, ActFormat::kFP8Block)), GemmPath::kStream);
  MoeParams deferred = p;
  deferred.do_finalize = false;
  EXPECT_EQ(moe_choose_path(90, 1, deferred), GemmPath::kStream);
  MoeParams off = p;
  off.gemv_decode = false;
  EXPECT_EQ(moe_choose_path(90, 1, off), GemmPath::kStream);
  deferred.force_path = GemmPath::kGemv;
  expect_refused(deferred, "gemv");
  MoeParams shape = p;
  shape.gemv_up_cols = 3;
  expect_refused(shape, "block shape");
  shape.gemv_up_cols = 4;
  shape.gemv_down_rows = 16;
  expect_refused(shape, "block shape");
  shape.gemv_down_rows = 8;
  EXPECT_FALSE(moe_unsupported(shape).has_value());
  MoeParams mx = kimi(WeightFormat::kMXFP8, ActFormat::kMXFP8);
  mx.force_path = GemmPath::kGemv;
  expect_refused(mx, "gemv");
  // Two tokens stay on the gemv decode while their slots fit one block of 18 warps: top-8 with or without a
  // shared expert (18 or 16), not top-16 (34); three tokens never.
  EXPECT_EQ(moe_choose_path(90, 2, p), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 2, kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block)), GemmPath::kGemv);
  MoeParams no_shared = p;
  no_shared.has_shared = false;
  EXPECT_EQ(moe_choose_path(90, 2, no_shared), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 4, no_shared), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 5, no_shared), GemmPath::kStream);
  // FP8-block experts (read as W8A16) stay on it up to 8 tokens (blocks of two), bf16 up to 4 (measured); FP8
  // then takes the wgmma kernels at every token count (MoeParams::fp8_decode_wgmma), bf16 the stream kernel.
  MoeParams f8 = kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block);
  EXPECT_TRUE(f8.fp8_decode_wgmma) << "the default since the engine measured it (moe.h)";
  EXPECT_EQ(moe_choose_path(90, 4, f8), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 8, f8), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 9, f8), GemmPath::kWgmma);
  EXPECT_EQ(moe_choose_path(90, 64, f8), GemmPath::kWgmma);
  EXPECT_EQ(moe_choose_path(89, 64, f8), GemmPath::kStream) << "no wgmma off sm_90";
  f8.fp8_decode_wgmma = false;
  EXPECT_EQ(moe_choose_path(90, 9, f8), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 512, f8), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 513, f8), GemmPath::kWgmma);
  MoeParams top16 = p;
  top16.router.topk = 16;
  EXPECT_EQ(moe_choose_path(90, 1, top16), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 2, top16), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 2, off), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 2, kimi(WeightFormat::kMXFP4, ActFormat::kBF16)), GemmPath::kStream);
  // MoeParams::gemv_tokens (DELTASERVE_MOE_GEMV_TOKENS) moves the limit, up to 32 tokens in blocks of two.
  MoeParams more = p;
  more.gemv_tokens = 8;
  EXPECT_EQ(moe_choose_path(90, 4, more), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 8, more), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 9, more), GemmPath::kStream);
  more.gemv_tokens = 32;
  EXPECT_EQ(moe_choose_path(90, 32, more), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 33, more), GemmPath::kStream);
  more.gemv_tokens = 1;
  EXPECT_EQ(moe_choose_path(90, 1, more), GemmPath::kGemv);
  EXPECT_EQ(moe_choose_path(90, 2, more), GemmPath::kStream);
  MoeParams top16_more = top16;
  top16_more.gemv_tokens = 8;
  EXPECT_EQ(moe_choose_path(90, 2, top16_more), GemmPath::kStream) << "34 warps do not fit a block";
  more.gemv_tokens = 33;
  expect_refused(more, "gemv_tokens");
  // ... then (bf16) streaming while an expert averages <= 16 routed tokens (T * 8 / 256 <= 16 -> T <= 512).
  EXPECT_EQ(moe_choose_path(90, 5, p), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 64, p), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 512, p), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 513, p), GemmPath::kWgmma);
  EXPECT_EQ(moe_choose_path(90, 16384, p), GemmPath::kWgmma);
  MoeParams ep = p;  // expert parallel: 32 local experts see the same routes 8x denser
  ep.expert_begin = 32;
  ep.expert_end = 64;
  EXPECT_EQ(moe_choose_path(90, 128, ep), GemmPath::kWgmma);
  EXPECT_EQ(moe_choose_path(90, 16384, kimi(WeightFormat::kMXFP4, ActFormat::kBF16)), GemmPath::kStream);
  EXPECT_EQ(moe_choose_path(90, 16384, kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block)), GemmPath::kWgmma);
  p.force_path = GemmPath::kStream;
  EXPECT_EQ(moe_choose_path(90, 16384, p), GemmPath::kStream);
}

TEST(MoeHost, Fp8PrefillTileRows) {
  // 128-row tiles from 64 routed rows per local expert on average (T * 8 / 256 >= 64 -> T >= 2048), else 64.
  MoeParams p = kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block);
  EXPECT_EQ(moe_fp8_prefill_tile_m(1024, p), 64);
  EXPECT_EQ(moe_fp8_prefill_tile_m(2047, p), 64);
  EXPECT_EQ(moe_fp8_prefill_tile_m(2048, p), 128);
  EXPECT_EQ(moe_fp8_prefill_tile_m(16384, p), 128);
  MoeParams ep = p;  // expert parallel: 32 local experts, the same routes 8x denser
  ep.expert_begin = 32;
  ep.expert_end = 64;
  EXPECT_EQ(moe_fp8_prefill_tile_m(255, ep), 64);
  EXPECT_EQ(moe_fp8_prefill_tile_m(256, ep), 128);
  for (int forced : {64, 128}) {
    p.fp8_prefill_tile_m = forced;
    EXPECT_EQ(moe_fp8_prefill_tile_m(1024, p), forced);
    EXPECT_EQ(moe_fp8_prefill_tile_m(16384, p), forced);
    EXPECT_FALSE(moe_unsupported(p).has_value());
  }
  for (int bad : {-1, 32, 96, 256}) {
    p.fp8_prefill_tile_m = bad;
    expect_refused(p, "fp8_prefill_tile_m");
  }
}

TEST(MoeHost, StreamTokenTiles) {
  // The measured rule (moe_dispatch.cpp), at the edges of its token ranges, for every implemented format pair.
  struct Case { WeightFormat w; ActFormat a; int T; int tiles; };
  const Case cases[] = {
      {WeightFormat::kBF16, ActFormat::kBF16, 1, 1},          {WeightFormat::kBF16, ActFormat::kBF16, 64, 1},
      {WeightFormat::kBF16, ActFormat::kBF16, 128, 1},        {WeightFormat::kBF16, ActFormat::kBF16, 129, 4},
      {WeightFormat::kBF16, ActFormat::kBF16, 512, 4},        {WeightFormat::kFP8Block, ActFormat::kFP8Block, 1, 2},
      {WeightFormat::kFP8Block, ActFormat::kFP8Block, 64, 2}, {WeightFormat::kFP8Block, ActFormat::kFP8Block, 512, 2},
      {WeightFormat::kMXFP8, ActFormat::kMXFP8, 2, 1},        {WeightFormat::kMXFP8, ActFormat::kMXFP8, 128, 1},
      {WeightFormat::kMXFP8, ActFormat::kMXFP8, 129, 2},      {WeightFormat::kMXFP8, ActFormat::kMXFP8, 512, 2},
      {WeightFormat::kMXFP4, ActFormat::kBF16, 2, 2},         {WeightFormat::kMXFP4, ActFormat::kBF16, 512, 2},
      {WeightFormat::kNVFP4, ActFormat::kBF16, 2, 2},         {WeightFormat::kNVFP4, ActFormat::kBF16, 512, 2},
      {WeightFormat::kNVFP4, ActFormat::kFP8Block, 2, 1},     {WeightFormat::kNVFP4, ActFormat::kFP8Block, 128, 1},
      {WeightFormat::kNVFP4, ActFormat::kFP8Block, 129, 2},   {WeightFormat::kNVFP4, ActFormat::kFP8Block, 512, 2}};
  for (const Case& c : cases)
    EXPECT_EQ(moe_stream_token_tiles(c.T, kimi(c.w, c.a)), c.tiles)
        << weight_format_name(c.w) << "/" << act_format_name(c.a) << " T = " << c.T;
  MoeParams p = kimi(WeightFormat::kFP8Block, ActFormat::kFP8Block);
  for (int forced : {1, 2, 4, 8}) {
    p.stream_token_tiles = forced;
    EXPECT_EQ(moe_stream_token_tiles(2, p), forced);
    EXPECT_EQ(moe_stream_token_tiles(512, p), forced);
    EXPECT_FALSE(moe_unsupported(p).has_value());
  }
  for (int bad : {-1, 3, 16}) {
    p.stream_token_tiles = bad;
    expect_refused(p, "stream_token_tiles");
  }
}

// The stream GEMM's grid rows on the dispatched plan (moe_stream_rows.h, the kernel's own arithmetic): with the
// plan laid out as moe_plan.cu lays it out (the shared expert's rows [0, T) first, then the routed groups; the
// active list ascending with the shared expert last), every permuted row is covered by exactly one grid row, no
// grid row is empty, and a shared-expert chunk holds at most one pass.
TEST(MoeHost, StreamSlotRowsCoverEveryRowOnce) {
  using namespace ds::moe::detail;
  const std::vector<std::vector<int>> routed = {{}, {3}, {0, 5, 0, 2, 17}, {1, 1, 1, 0, 0, 0, 129}};  // rows per expert
  int cases = 0;
  for (bool has_shared : {true, false})
    for (int T : {1, 7, 8, 9, 16, 40, 64, 65, 512})
      for (int pass : {8, 16, 32, 64})
        for (const std::vector<int>& counts : routed) {
          const int EL = static_cast<int>(counts.size());
          std::vector<int> begin(EL + 1), count(EL + 1), active;
          int row = has_shared ? T : 0;
          for (int g = 0; g < EL; ++g) {
            begin[g] = row;
            count[g] = counts[g];
            row += counts[g];
            if (counts[g] > 0) active.push_back(g);
          }
          begin[EL] = 0;
          count[EL] = T;
          if (has_shared) active.push_back(EL);
          const int na = static_cast<int>(active.size());
          const std::string what = "T = " + std::to_string(T) + ", pass " + std::to_string(pass) + ", " +
                                   std::to_string(EL) + " experts" + (has_shared ? ", shared" : "");
          const int slots = stream_grid_slots(na, has_shared, T, pass);
          EXPECT_EQ(slots, na + (has_shared ? (T + pass - 1) / pass - 1 : 0)) << what;
          std::vector<int> hits(row, 0);
          for (int slot = 0; slot < slots; ++slot) {
            const int g = active[std::min(slot, na - 1)];
            const StreamRows r = stream_slot_rows(slot, na, begin[g], count[g], g == EL, pass);
            EXPECT_GE(r.cnt, 1) << what << ", slot " << slot;
            if (g == EL) {
              EXPECT_LE(r.cnt, pass) << what << ", slot " << slot;
            }
            EXPECT_GE(r.rb, begin[g]) << what << ", slot " << slot;
            EXPECT_LE(r.rb + r.cnt, begin[g] + count[g]) << what << ", slot " << slot;
            for (int i = r.rb; i < r.rb + r.cnt && i >= 0 && i < row; ++i) ++hits[i];
          }
          for (int i = 0; i < row; ++i) EXPECT_EQ(hits[i], 1) << what << ", row " << i;
          ++cases;
        }
  EXPECT_EQ(cases, 2 * 9 * 4 * 4);
}

TEST(MoeHost, MxScaleCodeMatchesCoreDefinition) {
  std::vector<float> vals = {0.0f, 1e-38f, 1e-40f, 1.0f, 448.0f, 448.1f, 6.0f, 6.01f, 1.75f, 1.7500001f, 3.0f,
                             1e30f, 3e38f, NAN};  // (core's function spins on +inf: not compared)
  for (float v : ds::test::randu(2000, 7, -30.0f, 30.0f)) vals.push_back(std::ldexp(1.0f, static_cast<int>(v)) * (1.0f + std::fabs(v - std::trunc(v))));
  for (float v : vals) {
    EXPECT_EQ(mx_scale_code(v, false), e8m0_scale_for_amax(v, kE4M3Max)) << v;
    EXPECT_EQ(mx_scale_code(v, true), e8m0_scale_for_amax(v, kE2M1Max)) << v;
  }
}

TEST(MoeHost, NarrowFloatReencodingsAreExact) {
  for (int p = -149; p <= 127; ++p) EXPECT_EQ(pow2f(p), std::ldexp(1.0f, p)) << p;
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const uint32_t w = e4m3x2_to_bf16x2_scaled(b | (((b + 37) & 0xff) << 16));
    EXPECT_EQ(std::ldexp(bf16_to_f32(static_cast<uint16_t>(w)), 120), e4m3_to_f32(static_cast<uint8_t>(b))) << b;
  }
  for (uint32_t n = 0; n < 16; ++n) {
    const uint32_t w = e2m1x2_to_bf16x2_scaled(n | ((15 - n) << 16) | 0xfff0fff0u);
    EXPECT_EQ(std::ldexp(bf16_to_f32(static_cast<uint16_t>(w)), 126), e2m1_to_f32(static_cast<uint8_t>(n))) << n;
    EXPECT_EQ(std::ldexp(bf16_to_f32(static_cast<uint16_t>(w >> 16)), 126), e2m1_to_f32(static_cast<uint8_t>(15 - n)));
  }
}

TEST(MoeHost, WeightFormatsRoundTripWithTheirExpectedError) {
  const int n = 2, R = 256, K = 256;
  const auto w = ds::test::randn(static_cast<size_t>(n) * R * K, 11, 0.05f);
  const std::pair<WeightFormat, double> tol[] = {{WeightFormat::kBF16, 4e-3},
                                                 {WeightFormat::kFP8Block, 6e-2},
                                                 {WeightFormat::kMXFP8, 6e-2},
                                                 {WeightFormat::kMXFP4, 2.5e-1},
                                                 {WeightFormat::kNVFP4, 2e-1}};
  for (auto [f, t] : tol) {
    std::vector<float> back(w.size());
    dequantize_weights_ref(quantize_weights_ref(w.data(), n, R, K, f), n, R, K, f, back.data());
    EXPECT_CLOSE(std::string("round trip ") + weight_format_name(f), back, w, t);
  }
}

TEST(MoeHost, ActivationQuantisersMatchTheirDefinition) {
  auto x = ds::test::randn(3 * 256, 5, 2.0f);
  x[5] = 1e4f;  // an outlier owns its block's scale
  for (ActFormat f : {ActFormat::kFP8Block, ActFormat::kMXFP8}) {
    std::vector<uint8_t> q(x.size()), s(3 * 256);
    quantize_act_ref(x.data(), 3, 256, f, q.data(), s.data());
    std::vector<float> back(x.size());
    dequantize_act_ref(q.data(), s.data(), 3, 256, f, back.data());
    EXPECT_CLOSE(std::string("act round trip ") + act_format_name(f), back, x, 6e-2);
    if (f == ActFormat::kFP8Block) {
      const float s0 = reinterpret_cast<float*>(s.data())[0];
      EXPECT_EQ(s0, 1e4f / 448.0f);
      EXPECT_EQ(q[5], f32_to_e4m3(448.0f));
    } else {
      EXPECT_EQ(s[0], e8m0_scale_for_amax(1e4f, 448.0f));
    }
  }
}

TEST(MoeHost, DispatchReferenceIsStableAndDropsForeignExperts) {
  const int32_t ids[] = {3, 1, 1, 7, 3, 3, 0, 9};  // T = 4, TOPK = 2; local experts [1, 5)
  std::vector<int32_t> e2p(8);
  std::vector<int> cnt;
  dispatch_ref(ids, 4, 2, 1, 4, /*has_shared=*/true, e2p.data(), &cnt);
  // rows 0..3 shared; expert 1 (local 0): routes 1, 2 -> rows 4, 5; expert 3 (local 2): routes 0, 4, 5 -> 6..8
  EXPECT_EQ(e2p, (std::vector<int32_t>{6, 4, 5, -1, 7, 8, -1, -1}));
  EXPECT_EQ(cnt, (std::vector<int>{2, 0, 3, 0, 4}));
}

TEST(MoeHost, PerCallChecksRefuseBeforeAnyLaunch) {
  MoeParams p = kimi();
  p.T = 4;
  p.do_finalize = false;
  EXPECT_THROW(moe_forward(p), ds::Error);  // no workspace, no outputs: refused on the host
  FinalizeParams f;
  std::vector<uint16_t> y(2 * 8 * 16);
  std::vector<int32_t> map(16);
  std::vector<uint16_t> wrong(16);
  f.expert_out = MoeTensor(y.data(), DType::kBF16, 2, 8, 16);
  f.expanded_to_permuted = MoeTensor(map.data(), DType::kI32, 16);
  f.topk_weights = MoeTensor(wrong.data(), DType::kBF16, 2, 8);  // bf16 weights: refused
  f.out = MoeTensor(y.data(), DType::kBF16, 2, 16);
  try {
    moe_finalize(f);
    ADD_FAILURE() << "bf16 topk_weights accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_weights is bf16, expected f32"), std::string::npos) << e.what();
  }
  f.topk_weights = MoeTensor(map.data(), DType::kF32, 16);  // flat [T*TOPK]: refused
  EXPECT_THROW(moe_finalize(f), ds::Error);
}

}  // namespace
}  // namespace ds::moe
