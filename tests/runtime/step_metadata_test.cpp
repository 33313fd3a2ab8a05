// Host-side step metadata of the CUDA forward (no GPU): buckets, width classes, MLA prefill groups, the blob.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/step_metadata.h"

namespace ds {
namespace {

TEST(StepMetadata, DecodeBucketsCoverEveryBatchUpToMaxSeqs) {
  EXPECT_EQ(decode_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(decode_buckets(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(decode_buckets(100), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(decode_buckets(256), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_EQ(decode_buckets(300), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256, 300}));
  const auto b = decode_buckets(100);
  EXPECT_EQ(bucket_for(b, 1), 1);
  EXPECT_EQ(bucket_for(b, 3), 4);
  EXPECT_EQ(bucket_for(b, 64), 64);
  EXPECT_EQ(bucket_for(b, 65), 100);
  EXPECT_EQ(bucket_for(b, 100), 100);
  EXPECT_EQ(bucket_for(b, 101), 0);
  for (int max_seqs : {1, 3, 8, 100, 256, 300})
    for (int n = 1; n <= max_seqs; ++n) {
      const int k = bucket_for(decode_buckets(max_seqs), n);
      ASSERT_GE(k, n);
      ASSERT_LE(k, max_seqs);
    }
}

TEST(StepMetadata, PageWidthClassesArePowersOfTwoCapped) {
  EXPECT_EQ(page_width_class(0, 64), 1);
  EXPECT_EQ(page_width_class(1, 64), 1);
  EXPECT_EQ(page_width_class(3, 64), 4);
  EXPECT_EQ(page_width_class(20, 64), 32);
  EXPECT_EQ(page_width_class(64, 64), 64);
  EXPECT_EQ(page_width_class(50, 40), 40);  // capped at the page-table capacity
}

TEST(StepMetadata, MlaPrefillGroupsRespectTheWorkspaceBound) {
  // contexts 300, 100, 17, 3 with a 320-row cap: {300}, {100, 17, 3}
  const auto g = mla_prefill_groups({100, 100, 17, 3}, {300, 100, 17, 3}, 320);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].seq0, 0);
  EXPECT_EQ(g[0].num_seqs, 1);
  EXPECT_EQ(g[0].total_ctx, 300);
  EXPECT_EQ(g[0].tok0, 0);
  EXPECT_EQ(g[0].arr, 0);
  EXPECT_EQ(g[1].seq0, 1);
  EXPECT_EQ(g[1].num_seqs, 3);
  EXPECT_EQ(g[1].tok0, 100);
  EXPECT_EQ(g[1].num_tokens, 120);
  EXPECT_EQ(g[1].total_ctx, 120);
  EXPECT_EQ(g[1].max_new_tokens, 100);
  EXPECT_EQ(g[1].arr, 2);  // after group 0's [1 + 1] offsets
  EXPECT_EQ(mla_prefill_groups({5, 6}, {5, 6}, 0).size(), 1u);  // unbounded
  EXPECT_THROW(mla_prefill_groups({10}, {400}, 320), Error);   // one sequence alone exceeds the workspace
}

// A mixed plan: one decode (slot 2, 9 cached tokens) and two prefill chunks (slot 0 new, slot 1 continuing).
StepPlan mixed_plan() {
  std::vector<ScheduledSeq> seqs = {
      {7, 2, 9, 1, false, true},    // decode at position 9
      {8, 0, 0, 5, true, false},    // first 5 prompt tokens of a new sequence
      {9, 1, 70, 3, true, true},    // the last 3 of a 73-token prompt
  };
  return make_step_plan(seqs, {{4, 5, 6}, {0, 1}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}});
}

TEST(StepMetadata, MixedStepArrays) {
  const StepPlan plan = mixed_plan();
  ASSERT_EQ(plan.num_decodes, 1);
  ASSERT_EQ(plan.num_tokens, 9);
  const std::vector<int32_t> tokens = {100, 1, 2, 3, 4, 5, 60, 61, 62};
  std::vector<SampleSpec> samples(3);
  samples[0] = {0.0f, 0, 1.0f, 11, 4};
  samples[2] = {0.7f, 5, 0.9f, 33, 0};
  StepMetaOptions o;
  o.kda_slot_stride = 3;
  o.page_size = 8;
  o.mla_prefill_ctx_cap = 1000;
  StepMetadata m = build_step_metadata(plan, tokens, samples, o);
  EXPECT_EQ(m.rows, 9);
  EXPECT_EQ(m.num_seqs, 3);
  EXPECT_EQ(m.num_decodes, 1);
  EXPECT_EQ(m.num_prefills, 2);
  EXPECT_EQ(m.prefill_tokens, 8);
  EXPECT_EQ(m.num_chunks, 2);  // ceil(5/64) + ceil(3/64)
  EXPECT_EQ(m.width, 10);
  EXPECT_EQ(m.max_decode_ctx, 10);
  EXPECT_EQ(m.num_samples, 2);
  EXPECT_EQ(m.real_samples, 2);
  EXPECT_EQ(m.sample_seq, (std::vector<int>{0, 2}));
  EXPECT_EQ(m.fresh_slots, (std::vector<int>{0}));
  const MetaLayout& L = m.layout;
  for (size_t off : {L.ids, L.slot_mapping, L.kda_slots, L.ctx_lens, L.page_table, L.pf_cu, L.pf_chunks, L.grp_cu,
                     L.grp_cu_ctx, L.sample_rows, L.temperature, L.top_k, L.top_p, L.seed, L.step})
    EXPECT_EQ(off % 64, 0u);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(m.at<int32_t>(L.ids)[i], tokens[i]);
  const int64_t* sm = m.at<int64_t>(L.slot_mapping);
  EXPECT_EQ(sm[0], 5 * 8 + 1);  // position 9 -> page index 1 (page 5), offset 1
  for (int j = 0; j < 5; ++j) EXPECT_EQ(sm[1 + j], 0 * 8 + j);
  EXPECT_EQ(sm[6], 18 * 8 + 6);  // position 70 -> page index 8 (page 18), offset 6
  EXPECT_EQ(sm[7], 18 * 8 + 7);
  EXPECT_EQ(sm[8], 19 * 8 + 0);  // position 72 starts page index 9
  EXPECT_EQ(m.at<int32_t>(L.kda_slots)[0], 6);
  EXPECT_EQ(m.at<int32_t>(L.kda_slots)[1], 0);
  EXPECT_EQ(m.at<int32_t>(L.kda_slots)[2], 3);
  EXPECT_EQ(m.at<int32_t>(L.ctx_lens)[0], 10);
  EXPECT_EQ(m.at<int32_t>(L.ctx_lens)[1], 5);
  EXPECT_EQ(m.at<int32_t>(L.ctx_lens)[2], 73);
  const int32_t* pt = m.at<int32_t>(L.page_table);
  EXPECT_EQ(pt[0], 4);
  EXPECT_EQ(pt[3], -1);
  EXPECT_EQ(pt[10], 0);
  EXPECT_EQ(pt[29], 19);
  EXPECT_EQ(m.at<int32_t>(L.pf_cu)[1], 5);
  EXPECT_EQ(m.at<int32_t>(L.pf_cu)[2], 8);
  EXPECT_EQ(m.at<int32_t>(L.pf_chunks)[2], 2);
  ASSERT_EQ(m.mla_groups.size(), 1u);
  EXPECT_EQ(m.mla_groups[0].total_ctx, 78);
  EXPECT_EQ(m.at<int32_t>(L.grp_cu)[2], 8);
  EXPECT_EQ(m.at<int32_t>(L.grp_cu_ctx)[1], 5);
  EXPECT_EQ(m.at<int32_t>(L.grp_cu_ctx)[2], 78);
  EXPECT_EQ(m.at<int32_t>(L.sample_rows)[0], 0);
  EXPECT_EQ(m.at<int32_t>(L.sample_rows)[1], 8);
  EXPECT_FLOAT_EQ(m.at<float>(L.temperature)[1], 0.7f);
  EXPECT_EQ(m.at<int32_t>(L.top_k)[1], 5);
  EXPECT_EQ(m.at<uint64_t>(L.seed)[0], 11u);
  EXPECT_EQ(m.at<int64_t>(L.step)[0], 4);
}

TEST(StepMetadata, PaddedDecodeStepHasTheGraphLayoutForAnyBatchInTheBucket) {
  StepMetaOptions o;
  o.page_size = 16;
  o.bucket = 8;
  o.width = 4;
  MetaLayout first;
  for (int n = 0; n <= 8; ++n) {  // n = 0: the all-padding warm-up step
    std::vector<ScheduledSeq> seqs;
    std::vector<std::vector<int32_t>> pages;
    for (int i = 0; i < n; ++i) {
      seqs.push_back({static_cast<RequestId>(i + 1), i, 20 + i, 1, false, true});
      pages.push_back({3 * i, 3 * i + 1});
    }
    const StepPlan plan = make_step_plan(seqs, pages);
    std::vector<int32_t> tokens(n, 7);
    const StepMetadata m = build_step_metadata(plan, tokens, std::vector<SampleSpec>(n), o);
    if (n == 0) first = m.layout;
    EXPECT_EQ(m.layout.bytes, first.bytes);
    EXPECT_EQ(m.layout.page_table, first.page_table);
    EXPECT_EQ(m.layout.step, first.step);
    EXPECT_EQ(m.rows, 8);
    EXPECT_EQ(m.num_decodes, 8);
    EXPECT_EQ(m.num_samples, 8);
    EXPECT_EQ(m.real_samples, n);
    StepMetadata& mm = const_cast<StepMetadata&>(m);
    for (int r = n; r < 8; ++r) {  // padding rows: the contract of every kernel
      EXPECT_EQ(mm.at<int32_t>(m.layout.ids)[r], -1);
      EXPECT_EQ(mm.at<int64_t>(m.layout.slot_mapping)[r], -1);
      EXPECT_EQ(mm.at<int32_t>(m.layout.kda_slots)[r], -1);
      EXPECT_EQ(mm.at<int32_t>(m.layout.ctx_lens)[r], 0);
      EXPECT_EQ(mm.at<int32_t>(m.layout.sample_rows)[r], -1);
      EXPECT_FLOAT_EQ(mm.at<float>(m.layout.top_p)[r], 1.0f);
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(mm.at<int32_t>(m.layout.sample_rows)[r], r);
  }
}

TEST(StepMetadata, RejectsInconsistentInput) {
  StepMetaOptions o;
  o.page_size = 8;
  const StepPlan plan = mixed_plan();
  EXPECT_THROW(build_step_metadata(plan, {1, 2}, std::vector<SampleSpec>(3), o), Error);           // tokens
  EXPECT_THROW(build_step_metadata(plan, std::vector<int32_t>(9), {}, o), Error);                  // samples
  o.bucket = 4;
  EXPECT_THROW(build_step_metadata(plan, std::vector<int32_t>(9), std::vector<SampleSpec>(3), o), Error);  // mixed
  o.bucket = 0;
  o.width = 5;  // narrower than the plan's 10 pages
  EXPECT_THROW(build_step_metadata(plan, std::vector<int32_t>(9), std::vector<SampleSpec>(3), o), Error);
  // A position past the sequence's pages.
  const StepPlan short_pages = make_step_plan({{1, 0, 16, 1, false, true}}, {{0, 1}});
  o.width = 0;
  EXPECT_THROW(build_step_metadata(short_pages, {5}, std::vector<SampleSpec>(1), o), Error);
  // Decodes must come first.
  EXPECT_THROW(make_step_plan({{1, 0, 0, 4, true, false}, {2, 1, 3, 1, false, true}}, {{0}, {1}}), Error);
}

}  // namespace
}  // namespace ds
