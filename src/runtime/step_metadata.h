// Host-side step metadata of the CUDA forward: decode batch buckets (CUDA graph shapes), page-table width classes,
// MLA prefill groups, and the one byte blob a step copies to the device. No CUDA here: CPU tests cover it.
//
// A step's blob holds every per-token and per-sequence array the kernels read (token ids, cache slot mapping, KDA
// pool rows, context lengths, page table, prefill offsets, sampled rows and sampling parameters). Its layout is a
// pure function of the capacities it is built for (meta_layout), so a decode step padded to a bucket B with page
// width W always finds its arrays at the same offsets: a CUDA graph captured for (B, W) replays after one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/scheduler.h"

namespace ds {

// Sampling parameters of one sampled row (runtime/sampler.h semantics; the GPU sampler's Philox counter is `step`,
// the index of the token being sampled in its request).
struct SampleSpec {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int64_t step = 0;
};

// Decode batch sizes that get a CUDA graph: 1, 2, 4, ..., 256, capped at max_seqs, with max_seqs itself last when
// it is not a power of two (every decode batch of up to max_seqs rows has a bucket).
std::vector<int> decode_buckets(int max_seqs);
// Smallest bucket >= n; 0 when n exceeds the largest.
int bucket_for(const std::vector<int>& buckets, int n);
// Page-table row width of a graph: the next power of two >= pages (at least 1), capped at max_width. Few classes
// keep the number of graphs small; a bounded width keeps the per-step copy and the MLA decode split count sized
// to the contexts actually running rather than to max_model_len.
int page_width_class(int pages, int max_width);

// Sequences of the prefill part that one MLA prefill call expands together (the workspace holds at most
// `cap` context rows; a step whose prefills exceed it runs several calls).
struct MlaPrefillGroup {
  int seq0 = 0;          // first sequence, counted from the first prefill sequence
  int num_seqs = 0;
  int tok0 = 0;          // first token, counted from the first prefill token
  int num_tokens = 0;
  int total_ctx = 0;     // sum of context rows (the workspace rows this call expands)
  int max_new_tokens = 0;
  int arr = 0;           // offset (elements) of this group's cu_seqlens / cu_ctx arrays ([num_seqs + 1] each)
};
// Groups in plan order, each with total_ctx <= cap (cap <= 0: one group). Throws if one sequence alone exceeds cap.
std::vector<MlaPrefillGroup> mla_prefill_groups(const std::vector<int>& new_tokens, const std::vector<int>& ctx_lens,
                                                int64_t cap);

// Byte offsets of every array in the blob, each 64-byte aligned. tokens / seqs / samples are capacities; arrays:
//   ids          i32 [tokens]            token ids (-1: padding row -> zero embedding)
//   slot_mapping i64 [tokens]            latent-cache row of each token (page * page_size + offset; -1: padding)
//   kda_slots    i32 [seqs]              KDA pool row of each sequence (-1: padding)
//   ctx_lens     i32 [seqs]              cached rows after this step (0: padding)
//   page_table   i32 [seqs, width]       latent pages of each sequence (-1 padded)
//   pf_cu        i32 [prefills + 1]      KDA prefill token offsets (from the first prefill token)
//   pf_chunks    i32 [prefills + 1]      KDA prefill chunk offsets (kda_chunk_offsets)
//   grp_cu       i32 [prefills + groups] MLA prefill groups: token offsets, one [n + 1] array per group
//   grp_cu_ctx   i32 [prefills + groups] MLA prefill groups: context-row offsets
//   sample_rows  i32 [samples]           token row whose logits are sampled (-1: padding)
//   temperature f32, top_k i32, top_p f32, seed u64, step i64 [samples]
struct MetaLayout {
  size_t ids = 0, slot_mapping = 0, kda_slots = 0, ctx_lens = 0, page_table = 0, pf_cu = 0, pf_chunks = 0,
         grp_cu = 0, grp_cu_ctx = 0, sample_rows = 0, temperature = 0, top_k = 0, top_p = 0, seed = 0, step = 0;
  size_t bytes = 0;
};
MetaLayout meta_layout(int tokens, int seqs, int width, int prefills, int groups, int samples);

struct StepMetaOptions {
  int kda_slot_stride = 1;         // KDA pool row of slot s = s * kda_slot_stride (pools interleave layers per slot)
  int page_size = 64;
  int64_t mla_prefill_ctx_cap = 0; // context rows one MLA prefill call may expand (<= 0: unbounded)
  int bucket = 0;                  // > 0: a decode-only step padded to `bucket` rows (the CUDA graph shape)
  int width = 0;                   // page-table width (>= plan.max_pages_per_seq; 0: the plan's)
};

// Everything the forward needs to launch one step: the blob plus the host-side sizes that size grids.
struct StepMetadata {
  MetaLayout layout;
  std::vector<uint8_t> blob;       // layout.bytes; copied to the device in one transfer
  int rows = 0;                    // token rows the layers run on (num_tokens, or the bucket)
  int num_tokens = 0;              // real tokens
  int num_seqs = 0;                // rows of the per-sequence arrays (plan sequences, or the bucket)
  int num_decodes = 0;             // decode rows [0, num_decodes) (the bucket when padded)
  int num_prefills = 0;            // prefill sequences, rows [num_decodes, num_decodes + num_prefills)
  int prefill_tokens = 0;          // their tokens, token rows [num_decodes, num_decodes + prefill_tokens)
  int num_chunks = 0;              // KDA prefill chunks (host value sizing the grid)
  int width = 0;                   // page-table row width
  int max_decode_ctx = 0;          // longest decode context (MLA decode split count of eager steps)
  int num_samples = 0;             // rows of sample_rows / logits (the bucket when padded)
  int real_samples = 0;            // sampled rows that belong to requests: [0, real_samples)
  int bucket = 0;                  // as in the options
  std::vector<MlaPrefillGroup> mla_groups;
  std::vector<int> fresh_slots;    // slots starting a new sequence this step (their KDA state is zeroed first)
  std::vector<int> sample_seq;     // plan index of each real sampled row

  template <class T> T* at(size_t offset) { return reinterpret_cast<T*>(blob.data() + offset); }
};

// Builds the step's metadata. tokens: the plan's token ids in row order [plan.num_tokens]; samples: one entry per
// plan sequence (read where seqs[i].samples). With o.bucket > 0 the plan must be decode-only with at most
// `bucket` sequences (an empty plan gives the all-padding step that warms a graph up before its capture).
StepMetadata build_step_metadata(const StepPlan& plan, const std::vector<int32_t>& tokens,
                                 const std::vector<SampleSpec>& samples, const StepMetaOptions& o);

}  // namespace ds
