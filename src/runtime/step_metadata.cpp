// Step metadata of the CUDA forward: buckets, width classes, MLA prefill groups and the per-step blob.
#include "runtime/step_metadata.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/kda/kda.h"

namespace ds {

std::vector<int> decode_buckets(int max_seqs) {
  CHECK_GT(max_seqs, 0);
  std::vector<int> b;
  for (int n = 1; n <= std::min(max_seqs, 256); n *= 2) b.push_back(n);
  if (b.back() != max_seqs) b.push_back(max_seqs);  // e.g. 100 -> ..., 64, 100; 300 -> ..., 256, 300
  return b;
}

int bucket_for(const std::vector<int>& buckets, int n) {
  for (int b : buckets)
    if (b >= n) return b;
  return 0;
}

int page_width_class(int pages, int max_width) {
  CHECK_GT(max_width, 0);
  int w = 1;
  while (w < pages && w < max_width) w *= 2;
  return std::min(w, max_width);
}

std::vector<MlaPrefillGroup> mla_prefill_groups(const std::vector<int>& new_tokens, const std::vector<int>& ctx_lens,
                                                int64_t cap) {
  CHECK_EQ(new_tokens.size(), ctx_lens.size());
  std::vector<MlaPrefillGroup> groups;
  int tok = 0;
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    if (cap > 0 && ctx_lens[i] > cap)
      DS_THROW("MLA prefill: a sequence with {} context rows exceeds the prefill workspace ({} rows)", ctx_lens[i],
               cap);
    if (groups.empty() || (cap > 0 && groups.back().total_ctx + static_cast<int64_t>(ctx_lens[i]) > cap)) {
      MlaPrefillGroup g;
      g.seq0 = static_cast<int>(i);
      g.tok0 = tok;
      if (!groups.empty()) g.arr = groups.back().arr + groups.back().num_seqs + 1;
      groups.push_back(g);
    }
    MlaPrefillGroup& g = groups.back();
    ++g.num_seqs;
    g.num_tokens += new_tokens[i];
    g.total_ctx += ctx_lens[i];
    g.max_new_tokens = std::max(g.max_new_tokens, new_tokens[i]);
    tok += new_tokens[i];
  }
  return groups;
}

MetaLayout meta_layout(int tokens, int seqs, int width, int prefills, int groups, int samples) {
  MetaLayout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = (off + 63) / 64 * 64;
    const size_t at = off;
    off += bytes;
    return at;
  };
  const size_t T = tokens, N = seqs, P = prefills, S = samples;
  l.ids = take(T * 4);
  l.slot_mapping = take(T * 8);
  l.kda_slots = take(N * 4);
  l.ctx_lens = take(N * 4);
  l.page_table = take(N * static_cast<size_t>(width) * 4);
  l.pf_cu = take((P + 1) * 4);
  l.pf_chunks = take((P + 1) * 4);
  l.grp_cu = take((P + groups) * 4);
  l.grp_cu_ctx = take((P + groups) * 4);
  l.sample_rows = take(S * 4);
  l.temperature = take(S * 4);
  l.top_k = take(S * 4);
  l.top_p = take(S * 4);
  l.seed = take(S * 8);
  l.step = take(S * 8);
  l.bytes = (off + 63) / 64 * 64;
  return l;
}

StepMetadata build_step_metadata(const StepPlan& plan, const std::vector<int32_t>& tokens,
                                 const std::vector<SampleSpec>& samples, const StepMetaOptions& o) {
  const int n_plan = static_cast<int>(plan.seqs.size());
  CHECK_EQ(static_cast<int>(tokens.size()), plan.num_tokens);
  CHECK_EQ(static_cast<int>(samples.size()), n_plan);
  CHECK_EQ(static_cast<int>(plan.cu_seqlens.size()), n_plan + 1);
  CHECK_GT(o.page_size, 0);
  CHECK_GT(o.kda_slot_stride, 0);

  StepMetadata m;
  m.bucket = o.bucket;
  m.num_tokens = plan.num_tokens;
  m.width = o.width > 0 ? o.width : std::max(plan.max_pages_per_seq, 1);
  CHECK(plan.max_pages_per_seq <= m.width, "page table of {} pages does not fit width {}", plan.max_pages_per_seq,
        m.width);
  if (o.bucket > 0) {
    CHECK(plan.num_decodes == n_plan && n_plan <= o.bucket,
          "a padded (graph) step must be decode-only with at most {} sequences (got {} decodes of {})", o.bucket,
          plan.num_decodes, n_plan);
    m.rows = m.num_seqs = m.num_decodes = m.num_samples = o.bucket;
  } else {
    CHECK_GT(n_plan, 0);
    m.rows = plan.num_tokens;
    m.num_seqs = n_plan;
    m.num_decodes = plan.num_decodes;
    m.num_samples = 0;
    for (const auto& q : plan.seqs) m.num_samples += q.samples ? 1 : 0;
  }
  m.num_prefills = n_plan - plan.num_decodes;
  m.prefill_tokens = plan.num_tokens - plan.num_decodes;

  // Host-side plans of the prefill part: KDA chunk offsets and MLA groups.
  std::vector<int32_t> pf_cu{0};
  std::vector<int> new_tokens, ctx;
  for (int i = plan.num_decodes; i < n_plan; ++i) {
    pf_cu.push_back(pf_cu.back() + plan.seqs[i].num_tokens);
    new_tokens.push_back(plan.seqs[i].num_tokens);
    ctx.push_back(plan.context_lens[i]);
  }
  const std::vector<int32_t> pf_chunks = kda::kda_chunk_offsets(pf_cu);
  m.num_chunks = pf_chunks.back();
  if (m.num_prefills > 0) m.mla_groups = mla_prefill_groups(new_tokens, ctx, o.mla_prefill_ctx_cap);
  const int G = static_cast<int>(m.mla_groups.size());

  m.layout = meta_layout(m.rows, m.num_seqs, m.width, m.num_prefills, G, m.num_samples);
  m.blob.assign(m.layout.bytes, 0);
  const MetaLayout& L = m.layout;

  // Padding defaults everywhere, then the real rows.
  std::fill_n(m.at<int32_t>(L.ids), m.rows, -1);
  std::fill_n(m.at<int64_t>(L.slot_mapping), m.rows, int64_t{-1});
  std::fill_n(m.at<int32_t>(L.kda_slots), m.num_seqs, -1);
  std::fill_n(m.at<int32_t>(L.ctx_lens), m.num_seqs, 0);
  std::fill_n(m.at<int32_t>(L.page_table), static_cast<size_t>(m.num_seqs) * m.width, -1);
  std::fill_n(m.at<int32_t>(L.sample_rows), m.num_samples, -1);
  std::fill_n(m.at<float>(L.top_p), m.num_samples, 1.0f);

  std::copy(tokens.begin(), tokens.end(), m.at<int32_t>(L.ids));  // (memcpy from an empty vector's null data(): UB)
  int32_t* const table = m.at<int32_t>(L.page_table);
  int64_t* const slot_mapping = m.at<int64_t>(L.slot_mapping);
  for (int i = 0; i < n_plan; ++i) {
    const ScheduledSeq& q = plan.seqs[i];
    CHECK(q.slot >= 0, "sequence {} has no state slot", q.id);
    m.at<int32_t>(L.kda_slots)[i] = q.slot * o.kda_slot_stride;
    m.at<int32_t>(L.ctx_lens)[i] = plan.context_lens[i];
    const int32_t* pages = plan.page_table.data() + static_cast<size_t>(i) * plan.max_pages_per_seq;
    std::copy_n(pages, plan.max_pages_per_seq, table + static_cast<size_t>(i) * m.width);
    for (int j = 0; j < q.num_tokens; ++j) {
      const int64_t pos = q.start + j;
      const int64_t pi = pos / o.page_size;
      CHECK(pi < plan.max_pages_per_seq && pages[pi] >= 0, "sequence {}: position {} has no latent page", q.id, pos);
      slot_mapping[plan.cu_seqlens[i] + j] = static_cast<int64_t>(pages[pi]) * o.page_size + pos % o.page_size;
    }
    if (q.prefill && q.start == 0) m.fresh_slots.push_back(q.slot);
    if (i < plan.num_decodes) m.max_decode_ctx = std::max(m.max_decode_ctx, plan.context_lens[i]);
    if (q.samples) {
      const int r = m.real_samples++;
      m.sample_seq.push_back(i);
      const SampleSpec& s = samples[i];
      m.at<int32_t>(L.sample_rows)[r] = plan.cu_seqlens[i + 1] - 1;
      m.at<float>(L.temperature)[r] = s.temperature;
      m.at<int32_t>(L.top_k)[r] = s.top_k;
      m.at<float>(L.top_p)[r] = s.top_p;
      m.at<uint64_t>(L.seed)[r] = s.seed;
      m.at<int64_t>(L.step)[r] = s.step;
    }
  }
  std::copy(pf_cu.begin(), pf_cu.end(), m.at<int32_t>(L.pf_cu));
  std::copy(pf_chunks.begin(), pf_chunks.end(), m.at<int32_t>(L.pf_chunks));
  for (const MlaPrefillGroup& g : m.mla_groups) {
    int32_t* cu = m.at<int32_t>(L.grp_cu) + g.arr;
    int32_t* cc = m.at<int32_t>(L.grp_cu_ctx) + g.arr;
    cu[0] = cc[0] = 0;
    for (int k = 0; k < g.num_seqs; ++k) {
      cu[k + 1] = cu[k] + new_tokens[g.seq0 + k];
      cc[k + 1] = cc[k] + ctx[g.seq0 + k];
    }
  }
  return m;
}

}  // namespace ds
