// GPU sampler against the CPU definitions of runtime/sampler.h: greedy == argmax (lowest-id ties, NaN ignored),
// top-k = 1 == greedy, seeded reproducibility, and sample frequencies / supports for temperature, top-k, top-p.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "core/cuda_utils.h"
#include "kernels/sampling/sampling.h"
#include "runtime/sampler.h"
#include "tests/test_util.h"

namespace ds::sampling {
namespace {


struct Batch {
  int B = 0, V = 0;
  std::vector<float> logits, temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seed;
  std::vector<int64_t> step;
};

// split: the first pass on several blocks per row (SampleParams::counters / partials); the counters must be left
// zero (checked).
std::vector<int32_t> run(const Batch& b, bool split = false) {
  auto dl = upload(b.logits), dt = upload(b.temperature), dk = upload(b.top_k), dp = upload(b.top_p),
       ds = upload(b.seed), dst = upload(b.step);
  std::vector<int32_t> out(b.B, -7);  // poison: every row must be written
  auto dout = upload(out);
  SampleParams p;
  p.logits = dl.get<float>();
  p.ld = b.V;
  p.temperature = dt.get<float>();
  p.top_k = dk.get<int32_t>();
  p.top_p = dp.get<float>();
  p.seed = ds.get<uint64_t>();
  p.step = dst.get<int64_t>();
  p.out = dout.get<int32_t>();
  p.B = b.B;
  p.V = b.V;
  DeviceBuffer counters(b.B * sizeof(int32_t)), partials(std::max<size_t>(16, sample_partials_bytes(b.B, b.V)));
  if (split) {
    CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
    CUDA_CHECK(cudaMemset(partials.get(), 0xff, partials.bytes()));  // scratch: poisoned
    p.counters = counters.get<int32_t>();
    p.partials = partials.get();
    p.partials_bytes = partials.bytes();
  }
  sample(p, nullptr);
  CUDA_CHECK(cudaMemcpy(out.data(), dout.get(), b.B * sizeof(int32_t), cudaMemcpyDeviceToHost));
  if (split) {
    std::vector<int32_t> left(b.B, -1);
    CUDA_CHECK(cudaMemcpy(left.data(), counters.get(), counters.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(left, std::vector<int32_t>(b.B, 0)) << "the split pass must re-arm its counters";
  }
  return out;
}

// B rows sharing one logit vector, seeds 0..B-1 (so the rows are independent draws of one distribution).
Batch replicate(const std::vector<float>& logits, int B, float t, int k, float top_p) {
  Batch b;
  b.B = B;
  b.V = static_cast<int>(logits.size());
  for (int i = 0; i < B; ++i) b.logits.insert(b.logits.end(), logits.begin(), logits.end());
  b.temperature.assign(B, t);
  b.top_k.assign(B, k);
  b.top_p.assign(B, top_p);
  for (int i = 0; i < B; ++i) b.seed.push_back(0x1234567800000000ull + i), b.step.push_back(i % 5);
  return b;
}

// Every sample lies in the CPU candidate set and every candidate's frequency is within 5 standard deviations
// (plus one count) of B * p: a wrong temperature, cut or draw shifts frequencies by far more at B = 20000.
void expect_distribution(const std::string& what, const std::vector<float>& logits, float t, int k, float top_p) {
  const int B = 20000;
  const auto out = run(replicate(logits, B, t, k, top_p));
  SamplingParams sp;
  sp.temperature = t;
  sp.top_k = k;
  sp.top_p = top_p;
  const auto cand = candidate_distribution(logits.data(), static_cast<int>(logits.size()), sp);
  std::map<int, int> hist;
  for (int v : out) ++hist[v];
  std::map<int, double> prob;
  for (const auto& c : cand) prob[c.id] = c.prob;
  int outside = 0, off = 0;
  double worst = 0.0;
  for (auto [id, n] : hist)
    if (!prob.count(id)) outside += n;
  for (auto [id, pr] : prob) {
    const double expect = B * pr, sd = std::sqrt(B * pr * (1.0 - pr));
    const double dev = std::fabs(hist[id] - expect);
    worst = std::max(worst, sd > 0 ? dev / sd : dev);
    off += dev > 5.0 * sd + 1.0;
  }
  std::printf("[err] sampling %-36s candidates=%zu outside=%d worst_dev=%.2f sd\n", what.c_str(), cand.size(), outside,
              worst);
  EXPECT_EQ(outside, 0) << what;
  EXPECT_EQ(off, 0) << what;
}

TEST(SamplingKernels, GreedyIsArgmaxWithLowestIdTies) {
  SKIP_WITHOUT_GPU();
  // The real vocabulary (16-byte vector reads in whole batches of 8 per thread), one with a partial batch, one
  // short of a single batch, and an odd one (scalar reads).
  for (const int V : {163840, 163844, 6000, 1001}) {
  const int B = 37;
  Batch b;
  b.B = B;
  b.V = V;
  b.logits = test::randn(static_cast<size_t>(B) * V, 5, 3.0f);
  std::mt19937 rng(6);
  for (int r = 0; r < B; ++r) {
    float* row = b.logits.data() + static_cast<size_t>(r) * V;
    const int p1 = rng() % V, p2 = rng() % V;
    row[p1] = row[p2] = 50.0f;  // a planted tie: the lower id must win
    if (r % 3 == 0) row[rng() % V] = NAN;  // NaN never wins
    if (r % 5 == 0) row[rng() % V] = -INFINITY;
  }
  for (int r = 0; r < B; ++r) {
    b.temperature.push_back(r % 2 ? 0.0f : 0.9f);  // odd rows: temperature 0; even rows: top_k = 1
    b.top_k.push_back(r % 2 ? 0 : 1);
    b.top_p.push_back(r % 4 == 0 ? 0.5f : 1.0f);
    b.seed.push_back(r);
    b.step.push_back(0);
  }
  for (bool split : {false, true}) {
    const auto out = run(b, split);
    int bad = 0;
    for (int r = 0; r < B; ++r) bad += out[r] != argmax(b.logits.data() + static_cast<size_t>(r) * V, V);
    std::printf("[err] greedy / top_k=1 vs CPU argmax, V=%d, %d blocks per row: %d of %d rows differ\n", V,
                split ? sample_slices(B, V) : 1, bad, B);
    EXPECT_EQ(bad, 0);
  }
  }
}

// The first pass split over several blocks per row gives the same tokens as one block, for greedy and sampled
// rows alike (the last block finishes a sampled row with the folded argmax and count), at batch sizes that give
// 32, 14 and 8 blocks per row, vocabularies with a partial slice and an odd one (scalar reads), planted ties
// across slice borders, NaN and -inf, and a row that is all NaN (argmax 0).
TEST(SamplingKernels, SplitFirstPassGivesTheSameTokens) {
  SKIP_WITHOUT_GPU();
  int rows = 0, differ = 0;
  for (const int V : {163840, 163844, 50001})
    for (const int B : {1, 20, 37}) {
      Batch b;
      b.B = B;
      b.V = V;
      b.logits = test::randn(static_cast<size_t>(B) * V, 11 + B, 3.0f);
      std::mt19937 rng(12);
      for (int r = 0; r < B; ++r) {
        float* row = b.logits.data() + static_cast<size_t>(r) * V;
        row[V - 1 - static_cast<int>(rng() % 8)] = 40.0f;  // a tie between the last slice and an earlier one
        row[rng() % V] = 40.0f;
        if (r % 3 == 1) row[rng() % V] = NAN;
        if (r % 4 == 2) row[rng() % V] = -INFINITY;
        if (r == 5) std::fill(row, row + V, NAN);
        b.temperature.push_back(r % 2 ? 0.0f : 0.8f);
        b.top_k.push_back(r % 4 == 0 ? 50 : 0);
        b.top_p.push_back(r % 3 == 0 ? 0.9f : 1.0f);
        b.seed.push_back(77 + r);
        b.step.push_back(r);
      }
      const auto one = run(b, false), split = run(b, true);
      for (int r = 0; r < B; ++r) differ += one[r] != split[r];
      rows += B;
      EXPECT_EQ(one, split) << "V=" << V << " B=" << B << " (" << sample_slices(B, V) << " blocks per row)";
    }
  std::printf("[err] split first pass vs one block per row: %d of %d tokens differ\n", differ, rows);
  EXPECT_EQ(sample_slices(1, 163840), 32);
  EXPECT_EQ(sample_slices(512, 163840), 1);
}

TEST(SamplingKernels, SeededRunsReproduce) {
  SKIP_WITHOUT_GPU();
  const int V = 163840, B = 64;
  Batch b;
  b.B = B;
  b.V = V;
  b.logits = test::randn(static_cast<size_t>(B) * V, 8, 2.0f);
  for (int r = 0; r < B; ++r) {
    b.temperature.push_back(0.6f + 0.01f * r);
    b.top_k.push_back(r % 3 == 0 ? 0 : 40);
    b.top_p.push_back(r % 2 ? 0.9f : 1.0f);
    b.seed.push_back(1000 + r);
    b.step.push_back(r);
  }
  const auto a1 = run(b), a2 = run(b);
  EXPECT_EQ(a1, a2) << "same (logits, params, seed, step) must give the same tokens";
  for (auto& s : b.step) s += 1;
  const auto a3 = run(b);
  int same = 0;
  for (int r = 0; r < B; ++r) same += a1[r] == a3[r];
  std::printf("[err] sampling reproducibility: identical reruns; %d of %d rows unchanged after step+1\n", same, B);
  EXPECT_LT(same, B) << "the step counter must change the draw";
}

TEST(SamplingKernels, TemperatureFrequencies) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> l = {0.1f, 1.3f, -0.4f, 0.9f, 2.0f, 0.0f, -1.5f, 1.1f, 0.5f, 1.9f};
  expect_distribution("T=0.7", l, 0.7f, 0, 1.0f);
  expect_distribution("T=1.5", l, 1.5f, 0, 1.0f);
}

TEST(SamplingKernels, TopKTopPSupportAndFrequencies) {
  SKIP_WITHOUT_GPU();
  const auto l = test::randn(1003, 9, 2.0f);  // awkward vocabulary size
  expect_distribution("top_k=20", l, 1.0f, 20, 1.0f);
  expect_distribution("top_p=0.5", l, 1.0f, 0, 0.5f);
  expect_distribution("top_k=20 top_p=0.7 T=0.8", l, 0.8f, 20, 0.7f);
  // Ties at the k-th value: the lower ids are kept (ids 0..2 of 100 equal logits).
  std::vector<float> flat(100, 0.25f);
  flat[50] = NAN;
  flat[60] = -INFINITY;
  expect_distribution("top_k=3 over equal logits", flat, 1.0f, 3, 1.0f);
  expect_distribution("equal logits, NaN and -inf excluded", flat, 1.0f, 0, 1.0f);
}

// Host side of the split first pass (no GPU needed): about two blocks per SM in all, at most 32 per row, at least
// 4,096 logits per slice, one block per row once the rows fill the device; partials only where it splits.
TEST(SamplingKernels, SliceCountsAndPartialsSizing) {
  EXPECT_EQ(sample_slices(1, 163840), 32);
  EXPECT_EQ(sample_slices(8, 163840), 32);   // 264 / 8 = 33, capped
  EXPECT_EQ(sample_slices(9, 163840), 30);   // ceil(264 / 9)
  EXPECT_EQ(sample_slices(64, 163840), 5);
  EXPECT_EQ(sample_slices(264, 163840), 1);
  EXPECT_EQ(sample_slices(512, 163840), 1);
  EXPECT_EQ(sample_slices(1, 20000), 4);     // 4,096 logits per slice at least
  EXPECT_EQ(sample_slices(1, 4095), 1);
  EXPECT_EQ(sample_partials_bytes(512, 163840), 0u);
  EXPECT_EQ(sample_partials_bytes(1, 4095), 0u);
  EXPECT_EQ(sample_partials_bytes(3, 163840), 3u * 32 * 16);  // 16-byte partials
}

TEST(SamplingKernels, PhiloxIsCounterBased) {
  // Host side of the same function the kernel uses: a pure function of (seed, step), roughly uniform.
  EXPECT_EQ(philox_uniform(42, 7), philox_uniform(42, 7));
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(42, 8));
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(43, 7));
  double sum = 0.0;
  for (int i = 0; i < 100000; ++i) {
    const float u = philox_uniform(5, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

}  // namespace
}  // namespace ds::sampling
