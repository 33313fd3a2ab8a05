// MLA references: absorbed == expanded on a paged varlen batch; prefill == token-by-token decode; latent append.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "../test_util.h"
#include "kernels/mla/mla_ref.h"
#include "kernels/norm/norm_ref.h"

namespace ds {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng) * scale;
  return v;
}

// Small dims with the real proportions (L > Dn, Dr < Dn), awkward sizes.
struct Dims {
  int H = 3, L = 40, Dn = 24, Dr = 8, Dv = 20;
  int R() const { return L + Dr; }
  int Dq() const { return Dn + Dr; }
};

TEST(MlaRef, AppendNormalisesLatentAndCopiesKpe) {
  Dims d;
  std::mt19937 rng(3);
  const int T = 3;
  auto ckv = randn(static_cast<size_t>(T) * d.R(), rng);
  auto w = randn(d.L, rng);
  std::vector<float> cache(8 * d.R(), 12345.0f);  // poison
  const std::vector<int64_t> slots = {5, -1, 2};  // -1: padding row, must touch nothing
  mla::append_latent_ref(ckv.data(), w.data(), 1e-5f, slots.data(), T, d.L, d.Dr, cache.data());
  for (int t : {0, 2}) {
    std::vector<float> ref(d.L);
    norm::rmsnorm_ref(ckv.data() + t * d.R(), w.data(), 1, d.L, 1e-5f, ref.data());
    const float* row = cache.data() + slots[t] * d.R();
    for (int l = 0; l < d.L; ++l) EXPECT_EQ(row[l], ref[l]);
    for (int r = 0; r < d.Dr; ++r) EXPECT_EQ(row[d.L + r], ckv[t * d.R() + d.L + r]);
  }
  for (int r : {0, 1, 3, 4, 6, 7})
    for (int i = 0; i < d.R(); ++i) EXPECT_EQ(cache[r * d.R() + i], 12345.0f) << "row " << r;
}

TEST(MlaRef, AbsorbedEqualsExpandedPagedVarlen) {
  Dims d;
  std::mt19937 rng(4);
  // Sequences: (past rows, new tokens): a prefill from empty, a decode, a sequence with no new token, a chunk
  // appended to a long past.
  const std::vector<std::pair<int, int>> seqs = {{0, 9}, {13, 1}, {5, 0}, {21, 6}};
  const int N = static_cast<int>(seqs.size()), block = 4, max_blocks = 8;
  std::vector<int32_t> cu = {0}, ctx;
  for (auto [past, tn] : seqs) {
    cu.push_back(cu.back() + tn);
    ctx.push_back(past + tn);
  }
  // Shuffled block table: pages of one sequence are not adjacent.
  std::vector<int32_t> table(N * max_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  auto cache = randn(static_cast<size_t>(N) * max_blocks * block * d.R(), rng);
  const int T = cu.back();
  auto q = randn(static_cast<size_t>(T) * d.H * d.Dq(), rng);
  auto wkv_b = randn(static_cast<size_t>(d.H) * (d.Dn + d.Dv) * d.L, rng, 1.0f / std::sqrt(float(d.L)));

  mla::AttentionArgs a;
  a.q = q.data();
  a.cu_seqlens = cu.data();
  a.ctx_lens = ctx.data();
  a.cache = {cache.data(), table.data(), block, max_blocks};
  a.wkv_b = wkv_b.data();
  a.N = N, a.H = d.H, a.L = d.L, a.Dn = d.Dn, a.Dr = d.Dr, a.Dv = d.Dv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d.Dq()));
  const size_t out_n = static_cast<size_t>(T) * d.H * d.Dv;
  std::vector<float> expanded(out_n, NAN);
  std::vector<float> absorbed(out_n, NAN);
  a.out = expanded.data();
  mla::attention_expanded_ref(a);
  a.out = absorbed.data();
  mla::attention_absorbed_ref(a);
  EXPECT_TRUE(test::expect_close("mla absorbed vs expanded", absorbed, expanded, 1e-5));
  for (float v : expanded) ASSERT_TRUE(std::isfinite(v));  // every output element written
}

TEST(MlaRef, PrefillEqualsTokenByTokenDecode) {
  Dims d;
  std::mt19937 rng(5);
  const int T = 11;
  auto ckv = randn(static_cast<size_t>(T) * d.R(), rng);
  auto norm_w = randn(d.L, rng);
  auto q = randn(static_cast<size_t>(T) * d.H * d.Dq(), rng);
  auto wkv_b = randn(static_cast<size_t>(d.H) * (d.Dn + d.Dv) * d.L, rng, 0.2f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.Dq()));
  const int32_t table[1] = {0};

  // Prefill: append all T rows, then attend causally in one call (expanded form).
  std::vector<float> cache(static_cast<size_t>(T) * d.R());
  std::vector<int64_t> slots(T);
  std::iota(slots.begin(), slots.end(), 0);
  mla::append_latent_ref(ckv.data(), norm_w.data(), 1e-5f, slots.data(), T, d.L, d.Dr, cache.data());
  std::vector<float> prefill(static_cast<size_t>(T) * d.H * d.Dv);
  const int32_t cu[2] = {0, T}, ctx[1] = {T};
  mla::AttentionArgs a;
  a.q = q.data(), a.cu_seqlens = cu, a.ctx_lens = ctx, a.cache = {cache.data(), table, T, 1};
  a.wkv_b = wkv_b.data(), a.N = 1, a.H = d.H, a.L = d.L, a.Dn = d.Dn, a.Dr = d.Dr, a.Dv = d.Dv, a.scale = scale;
  a.out = prefill.data();
  mla::attention_expanded_ref(a);

  // Decode: one row appended and one absorbed attention per token, into a fresh cache.
  std::vector<float> cache2(cache.size(), NAN), decode(prefill.size());
  for (int t = 0; t < T; ++t) {
    const int64_t slot = t;
    mla::append_latent_ref(ckv.data() + t * d.R(), norm_w.data(), 1e-5f, &slot, 1, d.L, d.Dr, cache2.data());
    const int32_t cu1[2] = {0, 1}, ctx1[1] = {t + 1};
    mla::AttentionArgs b = a;
    b.q = q.data() + static_cast<size_t>(t) * d.H * d.Dq();
    b.cu_seqlens = cu1, b.ctx_lens = ctx1, b.cache.data = cache2.data();
    b.out = decode.data() + static_cast<size_t>(t) * d.H * d.Dv;
    mla::attention_absorbed_ref(b);
  }
  EXPECT_TRUE(test::expect_close("mla prefill(expanded) vs decode(absorbed)", decode, prefill, 1e-5));
}

TEST(MlaRef, SingleRowAttentionReturnsItsValue) {
  // One cached row: softmax is exactly 1, so out = v = Wuv c_n whatever the query.
  Dims d;
  std::mt19937 rng(6);
  auto cache = randn(d.R(), rng);
  auto q = randn(static_cast<size_t>(d.H) * d.Dq(), rng, 100.0f);  // huge scores must not overflow
  auto wkv_b = randn(static_cast<size_t>(d.H) * (d.Dn + d.Dv) * d.L, rng);
  const int32_t cu[2] = {0, 1}, ctx[1] = {1}, table[1] = {0};
  mla::AttentionArgs a;
  a.q = q.data(), a.cu_seqlens = cu, a.ctx_lens = ctx, a.cache = {cache.data(), table, 1, 1};
  a.wkv_b = wkv_b.data(), a.N = 1, a.H = d.H, a.L = d.L, a.Dn = d.Dn, a.Dr = d.Dr, a.Dv = d.Dv, a.scale = 0.1f;
  std::vector<float> out(static_cast<size_t>(d.H) * d.Dv), ref(out.size());
  a.out = out.data();
  mla::attention_expanded_ref(a);
  for (int h = 0; h < d.H; ++h)
    for (int v = 0; v < d.Dv; ++v) {
      const float* w = wkv_b.data() + (static_cast<size_t>(h) * (d.Dn + d.Dv) + d.Dn + v) * d.L;
      double s = 0;
      for (int l = 0; l < d.L; ++l) s += double(w[l]) * cache[l];
      ref[h * d.Dv + v] = static_cast<float>(s);
    }
  EXPECT_TRUE(test::expect_close("mla single row = value", out, ref, 1e-5));
}

}  // namespace
}  // namespace ds
