// KDA decode layout selection (host only, runs in CI): the selector per architecture, the knob override,
// rejection of uninstantiated head counts, capability checks and the prefill chunk plan.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/kda/kda.h"

namespace ds::kda {
namespace {

TEST(KdaDispatch, CompactHeadListIsTheSupportedTpSplits) {
  for (int h : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}) EXPECT_TRUE(is_compact_head_count(h)) << h;
  for (int h : {0, 5, 7, 10, 20, 33, 100, 256}) EXPECT_FALSE(is_compact_head_count(h)) << h;
}

TEST(KdaDispatch, LegacyRuleOffHopper) {
  for (int arch : {80, 100, 103}) {
    for (int n : {1, 8, 64, 512}) {
      EXPECT_TRUE(should_use_compact_heads(arch, n, 2)) << arch << " " << n;
      for (int h : {1, 3, 4, 8, 32, 96, 128}) EXPECT_FALSE(should_use_compact_heads(arch, n, h)) << arch << " " << h;
    }
  }
}

TEST(KdaDispatch, HopperUsesMeasuredThresholds) {
  // Measured on an H200 (docs/perf.md): many-heads was as fast or faster for every instantiated H and N in
  // 1..512, so arch 90 never picks compact -- unlike the legacy rule, which would for H == 2 (1.5x slower).
  for (int h : kCompactHeadCounts)
    for (int n : {1, 2, 4, 8, 64, 512}) EXPECT_FALSE(should_use_compact_heads(90, n, h)) << h << " " << n;
  for (int n : {1, 16, 512}) EXPECT_FALSE(should_use_compact_heads(90, n, 5)) << "no instantiation for H=5";
  // Monotone in N: once many-heads wins it keeps winning for larger batches.
  for (int h : kCompactHeadCounts) {
    bool seen_many = false;
    for (int n = 1; n <= 1024; n *= 2) {
      const bool c = should_use_compact_heads(90, n, h);
      EXPECT_FALSE(seen_many && c) << "H=" << h << " N=" << n;
      seen_many = seen_many || !c;
    }
  }
}

// The streaming layout from the measured item count on arch 90 (docs/perf.md), for any head count; monotone in N.
TEST(KdaDispatch, StreamFromMeasuredItemCount) {
  EXPECT_FALSE(should_use_stream(90, 128, 32));  // 4,096 items: stream 1-3 % slower on the H200
  EXPECT_FALSE(should_use_stream(90, 191, 32));
  EXPECT_TRUE(should_use_stream(90, 192, 32));
  EXPECT_TRUE(should_use_stream(90, 64, 96));
  EXPECT_TRUE(should_use_stream(90, 1024, 8));
  EXPECT_FALSE(should_use_stream(90, 512, 8));
  EXPECT_TRUE(should_use_stream(90, 2048, 5)) << "no compact instantiation needed";
  for (int arch : {80, 100, 103}) EXPECT_FALSE(should_use_stream(arch, 512, 96)) << arch;
  for (int h : {1, 2, 8, 32, 96, 128}) {
    bool seen = false;
    for (int n = 1; n <= 65536; n *= 2) {
      const bool s = should_use_stream(90, n, h);
      EXPECT_FALSE(seen && !s) << "H=" << h << " N=" << n;
      seen = seen || s;
    }
  }
}

TEST(KdaDispatch, KnobOverride) {
  const KdaDecodeSetup many{90, KdaLayout::kMany}, compact{90, KdaLayout::kCompact}, autos{90, KdaLayout::kAuto};
  const KdaDecodeSetup stream{90, KdaLayout::kStream};
  EXPECT_EQ(kda_decode_layout(many, 1, 32), KdaLayout::kMany);
  EXPECT_EQ(kda_decode_layout(compact, 512, 32), KdaLayout::kCompact);
  EXPECT_EQ(kda_decode_layout(autos, 1, 32), KdaLayout::kMany);
  EXPECT_EQ(kda_decode_layout(KdaDecodeSetup{80, KdaLayout::kAuto}, 1, 2), KdaLayout::kCompact)
      << "legacy rule off Hopper";
  EXPECT_EQ(kda_decode_layout(many, 1, 5), KdaLayout::kMany);
  EXPECT_EQ(kda_decode_layout(autos, 1, 5), KdaLayout::kMany);
  EXPECT_EQ(kda_decode_layout(stream, 512, 5), KdaLayout::kStream) << "the streaming kernel takes any head count";
  EXPECT_EQ(kda_decode_layout(autos, 512, 32), KdaLayout::kStream) << "16,384 items";
  EXPECT_EQ(kda_decode_layout(autos, 64, 32), KdaLayout::kMany) << "2,048 items";
  EXPECT_EQ(kda_decode_layout(KdaDecodeSetup{100, KdaLayout::kAuto}, 512, 32), KdaLayout::kMany)
      << "not measured off Hopper";
  try {
    kda_decode_layout(compact, 4, 5);
    FAIL() << "forcing compact with H=5 must be rejected";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("H=5"), std::string::npos) << m;
    EXPECT_NE(m.find("DELTASERVE_KDA_LAYOUT"), std::string::npos) << m;
    std::printf("rejection message: %s\n", m.c_str());
  }
  EXPECT_EQ(parse_kda_layout("compact"), KdaLayout::kCompact);
  EXPECT_EQ(parse_kda_layout("stream"), KdaLayout::kStream);
  EXPECT_STREQ(kda_layout_name(KdaLayout::kStream), "stream");
  EXPECT_THROW(parse_kda_layout("fast"), Error);
}

TEST(KdaDispatch, CapabilityCheckGivesReasons) {
  KdaDecodeParams p;
  p.N = 4, p.H = 8, p.K = 64;
  auto why = kda_decode_unsupported(p);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("K = V = 128"), std::string::npos) << *why;
  p.K = 128;
  why = kda_decode_unsupported(p);
  ASSERT_TRUE(why.has_value());  // null pointers
  std::printf("reason: %s\n", why->c_str());
  p.N = 0;
  EXPECT_FALSE(kda_decode_unsupported(p).has_value()) << "an empty batch needs no buffers";
  KdaPrefillParams q;
  q.H = 4, q.V = 96;
  why = kda_prefill_unsupported(q);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("V=96"), std::string::npos) << *why;
}

// A forced scan configuration (benchmarks, tests) must be one the launcher has: others are refused with the list.
TEST(KdaDispatch, ForcedScanConfigurationIsChecked) {
  KdaPrefillParams q;  // null buffers: the configuration is checked before them
  for (const auto& [vt, st] : {std::pair{4, 2}, std::pair{2, 3}, std::pair{8, 1}, std::pair{0, 1}, std::pair{4, 0}}) {
    q.scan_vtiles = vt, q.scan_stages = st;
    const auto why = kda_prefill_unsupported(q);
    ASSERT_TRUE(why.has_value()) << vt << " x " << st;
    EXPECT_NE(why->find("not a scan configuration"), std::string::npos) << *why;
  }
  std::printf("reason: %s\n", kda_prefill_unsupported(q)->c_str());
#ifdef DELTASERVE_WITH_CUDA
  // The scan stage alone (kda_prefill_scan, exposed for tests) refuses it too: no device needed on this path.
  EXPECT_THROW(kda_prefill_scan_config(q), Error);
  q.scan_vtiles = 2, q.scan_stages = 2;
  const KdaScanConfig c = kda_prefill_scan_config(q);
  EXPECT_EQ(std::pair(c.vtiles, c.stages), std::pair(2, 2));
#endif
}

// The scan's factor loader (benchmarks, tests): 0 (the default), cp.async or bulk copies; anything else is refused.
TEST(KdaDispatch, ForcedScanLoaderIsChecked) {
  KdaPrefillParams q;  // null buffers: the loader is checked before them
  for (const int loader : {-1, 3, 7}) {
    q.scan_loader = loader;
    const auto why = kda_prefill_unsupported(q);
    ASSERT_TRUE(why.has_value()) << loader;
    EXPECT_NE(why->find("not a loader"), std::string::npos) << *why;
  }
  std::printf("reason: %s\n", kda_prefill_unsupported(q)->c_str());
  for (const int loader : {0, kKdaScanLoaderCpAsync, kKdaScanLoaderBulk}) {
    q.scan_loader = loader;
    const auto why = kda_prefill_unsupported(q);  // refused for the missing buffers, not for the loader
    ASSERT_TRUE(why.has_value());
    EXPECT_EQ(why->find("scan_loader"), std::string::npos) << *why;
  }
}

// The scan configuration rule at the H200's 132 SMs, on the shapes it was measured on (docs/perf.md, 2026-12-05,
// kda_bench --scan-variants with the bulk loader; each pick was the fastest of the four there, 1024 x 8 within
// 2 %): one 32- or 96-head sequence takes 4 tiles x 3 stages (128 / 384 CTAs, one per SM); 64 heads take 2 x 2
// (128 CTAs at one per SM); the batches take 2 x 1 (512 / 1,024 CTAs at two per SM).
TEST(KdaDispatch, ScanConfigFollowsTheMeasuredRule) {
  auto cfg = [](int64_t head_seqs) {
    const KdaScanConfig c = kda_prefill_scan_config_for(head_seqs, 132);
    return std::pair{c.vtiles, c.stages};
  };
  EXPECT_EQ(cfg(32 * 1), std::pair(4, 3));   // 8192 x 1 and 32768 x 1, H = 32
  EXPECT_EQ(cfg(64 * 1), std::pair(2, 2));   // 8192 x 1, H = 64
  EXPECT_EQ(cfg(96 * 1), std::pair(4, 3));   // 8192 x 1, H = 96 (and the GPU test's three 32-head sequences)
  EXPECT_EQ(cfg(32 * 8), std::pair(2, 1));   // 1024 x 8
  EXPECT_EQ(cfg(32 * 16), std::pair(2, 1));  // 512 x 16 (and the GPU test's 16 sequences)
  EXPECT_EQ(cfg(3 * 8), std::pair(4, 3));    // the GPU varlen test: 3 heads x 8 sequences
  EXPECT_EQ(cfg(0), std::pair(4, 3));
  const KdaScanConfig none = kda_prefill_scan_config_for(100, 0);
  EXPECT_EQ(std::pair(none.vtiles, none.stages), std::pair(4, 3));
}

namespace {
// True when the 4-byte words read by one shared-memory wavefront (byte offsets, each `bytes` long) fall in
// distinct banks, or share a word: no bank conflict.
bool conflict_free(const std::vector<int>& byte_offsets, int bytes) {
  std::map<int, int> word_of_bank;
  for (const int b : byte_offsets)
    for (int w = b / 4; w < (b + bytes) / 4; ++w) {
      const auto [it, fresh] = word_of_bank.emplace(w % 32, w);
      if (!fresh && it->second != w) return false;
    }
  return true;
}
}  // namespace

// The swizzled factor layout (kda.h): every (row, column) of a tile at its own offset; 16-byte chunks move whole
// and each 32-byte sector of a row holds the same columns as in the plain layout (so the intra stage's stores
// stay whole sectors); and the scan's shared-memory reads are conflict-free: ldmatrix's 8 consecutive rows at
// one 16-byte column, and U's float2 reads (a half-warp: rows r0 + 0..3, columns 8 nt + 0..7).
TEST(KdaDispatch, FactorTileLayout) {
  struct Layout {
    const char* name;
    int cols, row_elems, elem_bytes;  // row_elems: the row length in memory (u: a 32-column block)
    int (*offset)(int, int);
  };
  for (const Layout& l : {Layout{"qg/kd/w", kHeadDim, kHeadDim, 2, kda_factor_offset},
                          Layout{"aqk", kChunk, kChunk, 2, kda_aqk_offset},
                          Layout{"u", kHeadDim, kKdaUBlock, 4, kda_u_offset}}) {
    SCOPED_TRACE(l.name);
    const int tile = kChunk * l.cols, per_sector = 32 / l.elem_bytes, per_chunk = 16 / l.elem_bytes;
    std::vector<int> seen(tile, 0);
    for (int r = 0; r < kChunk; ++r)
      for (int c = 0; c < l.cols; ++c) {
        const int o = l.offset(r, c);
        ASSERT_TRUE(o >= 0 && o < tile) << r << "," << c;
        ++seen[o];
        const int plain = (c / l.row_elems) * kChunk * l.row_elems + r * l.row_elems + c % l.row_elems;
        EXPECT_EQ(o / l.row_elems, plain / l.row_elems) << "row " << r << " col " << c;
        EXPECT_EQ(o % per_chunk, plain % per_chunk) << "row " << r << " col " << c;  // 16-byte chunks move whole
        EXPECT_EQ(o / per_sector, l.offset(r, c - c % per_sector) / per_sector) << "row " << r << " col " << c;
      }
    for (int o = 0; o < tile; ++o) ASSERT_EQ(seen[o], 1) << "offset " << o;
  }
  for (int r0 = 0; r0 < kChunk; r0 += 8) {
    for (int c = 0; c < kHeadDim; c += 8) {
      std::vector<int> rows;
      for (int i = 0; i < 8; ++i) rows.push_back(2 * kda_factor_offset(r0 + i, c));
      EXPECT_TRUE(conflict_free(rows, 16)) << "qg/kd/w ldmatrix rows " << r0 << "+, col " << c;
    }
    for (int c = 0; c < kChunk; c += 8) {
      std::vector<int> rows;
      for (int i = 0; i < 8; ++i) rows.push_back(2 * kda_aqk_offset(r0 + i, c));
      EXPECT_TRUE(conflict_free(rows, 16)) << "aqk ldmatrix rows " << r0 << "+, col " << c;
    }
  }
  for (int r0 = 0; r0 < kChunk; r0 += 4)
    for (int nt = 0; nt < kHeadDim / 8; ++nt) {
      std::vector<int> half;  // lanes g = 0..3 (rows), t = 0..3 (columns 8 nt + 2t, 2t + 1)
      for (int g = 0; g < 4; ++g)
        for (int t = 0; t < 4; ++t) half.push_back(4 * kda_u_offset(r0 + g, 8 * nt + 2 * t));
      EXPECT_TRUE(conflict_free(half, 8)) << "u float2 rows " << r0 << "+, nt " << nt;
    }
  // The plain layout fails the same check (the test can tell the two apart).
  std::vector<int> plain_rows;
  for (int i = 0; i < 8; ++i) plain_rows.push_back(2 * i * kHeadDim);
  EXPECT_FALSE(conflict_free(plain_rows, 16));
}

TEST(KdaDispatch, ChunkPlan) {
  const auto off = kda_chunk_offsets({0, 130, 130, 131, 195, 259});
  EXPECT_EQ(off, (std::vector<int32_t>{0, 3, 3, 4, 5, 6}));
  EXPECT_EQ(kda_prefill_workspace_bytes(0, 32), 0u);
  const size_t b = kda_prefill_workspace_bytes(7, 3);
  std::vector<unsigned char> ws(b);
  const auto f = kda_chunk_factors(ws.data(), 7, 3);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(f.kd) - reinterpret_cast<unsigned char*>(f.qg), 21 * 64 * 128 * 2);
  EXPECT_LE(reinterpret_cast<unsigned char*>(f.gl + 21 * 128), ws.data() + b);
}

}  // namespace
}  // namespace ds::kda
