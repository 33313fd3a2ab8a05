// Greedy and seeded temperature / top-k / top-p sampling (definitions in sampler.h).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ds {

void SamplingParams::validate() const {
  if (max_tokens < 1) DS_THROW("max_tokens must be >= 1 (got {})", max_tokens);
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    DS_THROW("temperature must be a finite number >= 0 (got {})", temperature);
  if (top_k < 0) DS_THROW("top_k must be >= 0 (0 = off; got {})", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) DS_THROW("top_p must be in (0, 1] (got {})", top_p);
  for (int32_t id : stop_token_ids)
    if (id < 0) DS_THROW("stop_token_ids must be >= 0 (got {})", id);
}

int32_t argmax(const float* logits, int n) {
  int32_t best = -1;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;  // strict '>': the first (lowest) id keeps a tie
  }
  return best < 0 ? 0 : best;
}

std::vector<Candidate> candidate_distribution(const float* logits, int n, const SamplingParams& p) {
  std::vector<int32_t> ids;
  ids.reserve(n);
  for (int i = 0; i < n; ++i)
    if (!std::isnan(logits[i]) && logits[i] != -INFINITY) ids.push_back(i);
  if (ids.empty()) return {{argmax(logits, n), 1.0}};
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  // Sorting by logit is sorting by probability (softmax is monotone), so one order serves top-k and top-p.
  size_t keep = ids.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) keep = p.top_k;
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  ids.resize(keep);

  const double inv_t = 1.0 / std::max(p.temperature, 1e-6f);
  const double top = static_cast<double>(logits[ids[0]]) * inv_t;
  std::vector<Candidate> c(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    c[i] = {ids[i], std::exp(static_cast<double>(logits[ids[i]]) * inv_t - top)};
    total += c[i].prob;
  }
  size_t cut = keep;
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (cut = 0; cut < keep;) {
      mass += c[cut].prob / total;
      ++cut;
      if (mass >= static_cast<double>(p.top_p)) break;
    }
  }
  c.resize(cut);
  double kept = 0.0;
  for (auto& x : c) kept += x.prob;
  for (auto& x : c) x.prob /= kept;
  return c;
}

Sampler::Sampler(const SamplingParams& p, uint64_t seed) : params_(p), rng_(seed) {}

int32_t Sampler::sample(const float* logits, int n) {
  if (params_.greedy()) return argmax(logits, n);
  const auto c = candidate_distribution(logits, n, params_);
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // uniform in [0, 1), 53 bits
  double cum = 0.0;
  for (const auto& x : c) {
    cum += x.prob;
    if (u < cum) return x.id;
  }
  return c.back().id;  // u within rounding of 1
}

}  // namespace ds
