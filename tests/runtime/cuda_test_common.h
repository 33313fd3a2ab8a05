// Helpers of the CUDA forward / engine tests: device models from host weights, hand-built step plans, logits
// statistics (RMS ratio against the fp32 reference, top-1 agreement).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "model/cpu_model.h"
#include "model/embedded.h"
#include "model/weights.h"
#include "runtime/cuda_forward.h"
#include "runtime/sampler.h"
#include "tests/test_util.h"

namespace ds::test {

inline std::shared_ptr<const DeviceModel> device_model(const ModelConfig& c, const WeightSet& w, bool fp8 = false) {
  DeviceModelOptions o;
  o.fp8 = fp8;
  return std::shared_ptr<const DeviceModel>(upload_model(c, w, o));
}

// One sequence driven by hand: a fixed slot and the pages for its whole life (pages [first, first + n)).
struct HandSeq {
  RequestId id = 0;
  int slot = 0;
  std::vector<int32_t> pages;
  int64_t pos = 0;  // tokens already in its state
};

inline HandSeq hand_seq(RequestId id, int slot, int first_page, int num_pages) {
  HandSeq s;
  s.id = id;
  s.slot = slot;
  for (int i = 0; i < num_pages; ++i) s.pages.push_back(first_page + i);
  return s;
}

// A plan step for one sequence part: n tokens from s.pos (prefill when `prefill`), sampling when `samples`.
struct Part {
  HandSeq* seq;
  int n;
  bool prefill;
  bool samples;
};
inline StepPlan hand_plan(const std::vector<Part>& parts) {
  std::vector<ScheduledSeq> seqs;
  std::vector<std::vector<int32_t>> pages;
  for (const Part& p : parts) {
    seqs.push_back({p.seq->id, p.seq->slot, p.seq->pos, p.n, p.prefill, p.samples});
    pages.push_back(p.seq->pages);
  }
  StepPlan plan = make_step_plan(seqs, pages);
  for (const Part& p : parts) p.seq->pos += p.n;
  return plan;
}

inline SampleSpec greedy_spec() { return SampleSpec{}; }

inline int top1(const float* logits, int V) { return argmax(logits, V); }

// Per-step RMS ratios and top-1 agreement of a run against its fp32 reference, with percentile summaries.
struct LogitsAgreement {
  std::vector<double> rms;
  int agree = 0;
  int steps = 0;

  void add(const std::string& what, const float* got, const std::vector<float>& ref) {
    const int V = static_cast<int>(ref.size());
    const ErrorStats s = compare(what, got, ref.data(), V);
    EXPECT_EQ(s.nan_count, 0) << what;
    rms.push_back(s.rms_ratio);
    agree += top1(got, V) == top1(ref.data(), V) ? 1 : 0;
    ++steps;
  }
  double percentile(double q) const {
    std::vector<double> v = rms;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
  }
  int count_above(double bar) const {
    return static_cast<int>(std::count_if(rms.begin(), rms.end(), [bar](double r) { return r > bar; }));
  }
  double top1_rate() const { return steps ? static_cast<double>(agree) / steps : 0.0; }
  void print(const char* what) const {
    std::printf("[agree] %-36s steps=%d top1=%.3f rms median=%.3e p90=%.3e max=%.3e\n", what, steps, top1_rate(),
                percentile(0.5), percentile(0.9), percentile(1.0));
    std::fflush(stdout);
  }
};

}  // namespace ds::test
