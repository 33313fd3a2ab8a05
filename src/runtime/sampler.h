// Token sampling: request sampling parameters, greedy argmax, and a seeded temperature / top-k / top-p sampler.
//
// Definitions (shared with the GPU sampler):
//   greedy      temperature <= 0 or top_k == 1: argmax, ties -> the lowest id; NaN logits never win.
//   temperature p_i = softmax(logit_i / temperature), computed in double.
//   top_k       keep the k largest logits (ties -> lower ids first); 0 = off.
//   top_p       over the (top-k) candidates sorted by probability, descending (ties -> lower id first), keep the
//               smallest prefix whose probability mass is >= top_p (at least one token); 1 = off.
//   draw        renormalise the kept probabilities; u = (rng() >> 11) * 2^-53 from a per-request
//               std::mt19937_64 seeded with the request seed; pick the first candidate whose cumulative
//               probability exceeds u. The bit-level recipe (no std::uniform_real_distribution, whose output is
//               implementation-defined) makes a seed reproduce the same tokens on every platform.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace ds {

struct SamplingParams {
  int max_tokens = 16;                  // generated tokens (the stop token counts) before finish reason "length"
  float temperature = 0.0f;             // 0 = greedy
  int top_k = 0;                        // 0 = off
  float top_p = 1.0f;                   // 1 = off, (0, 1]
  std::optional<uint64_t> seed;         // unset: the engine derives one (reproducible per engine and request)
  std::vector<int32_t> stop_token_ids;  // extra ids that finish with reason "stop" (kept even with ignore_eos)
  bool ignore_eos = false;              // do not stop on the model's end-of-sequence ids

  // Throws ds::Error naming the bad field (negative temperature, top_p outside (0, 1], ...).
  void validate() const;
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// Index of the largest logit; ties -> the lowest index; NaN ignored (returns 0 if every value is NaN).
int32_t argmax(const float* logits, int n);

struct Candidate {
  int32_t id;
  double prob;
};

// The distribution a non-greedy draw samples from: kept candidates after temperature, top-k and top-p, sorted
// by probability descending (ties -> lower id first), probabilities renormalised to sum 1.
std::vector<Candidate> candidate_distribution(const float* logits, int n, const SamplingParams& p);

// Per-request sampler; holds its random generator, so one Sampler per sequence.
class Sampler {
 public:
  Sampler(const SamplingParams& p, uint64_t seed);
  int32_t sample(const float* logits, int n);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace ds
