// GPU token sampling: greedy, temperature, top-k, top-p, per-request seed; one block per request row (a few rows: the
// first pass of each over several blocks, SampleParams::counters / partials).
//
// Candidate set and probabilities follow runtime/sampler.h (the CPU definition):
//   greedy   temperature <= 0 or top_k == 1: argmax, ties -> the lowest id, NaN never wins;
//   valid    NaN and -inf logits are never candidates (all invalid -> the argmax);
//   top_k    the k largest logits, ties at the k-th value -> lower ids first (0 or >= valid count = off);
//   top_p    over the top-k set sorted by probability (ties -> lower id first), the smallest prefix whose mass is
//            >= top_p (at least one token); 1 = off;
//   probs    p_i ~ exp((logit_i - max) / temperature) over the kept set.
// The draw differs from the CPU sampler on purpose: u = philox_uniform(seed, step) (counter-based, so a request
// replays the same tokens for the same (seed, step) in any batch order or graph replay), and the token is the
// first index, in id order, whose cumulative kept probability exceeds u. Same distribution as the CPU sampler,
// not the same token for a given seed.
// Deterministic: every reduction has a fixed order (top-p masses are summed in 2^-40 fixed point), so the same
// logits, parameters, seed and step give the same token on every run.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

#if defined(__CUDACC__)
#define DS_SAMPLING_HD __host__ __device__
#else
#define DS_SAMPLING_HD
#endif

namespace ds::sampling {

struct SampleParams {
  const float* logits = nullptr;       // [B, V] rows of stride ld (elements), fp32
  int64_t ld = 0;
  const float* temperature = nullptr;  // [B]  <= 0: greedy
  const int32_t* top_k = nullptr;      // [B]  0: off
  const float* top_p = nullptr;        // [B]  1: off, in (0, 1]
  const uint64_t* seed = nullptr;      // [B]
  const int64_t* step = nullptr;       // [B]  the request's token counter (the Philox counter)
  int32_t* out = nullptr;              // [B]  sampled token ids
  int B = 0, V = 0;
  // Optional, both or neither: the first pass (argmax and valid count) of each row runs on sample_slices(B, V)
  // blocks, the last of which finishes the row. Same tokens; null: one block per row.
  int32_t* counters = nullptr;  // [B] arrival counters: zero before the first call, every call leaves them zero
  void* partials = nullptr;     // sample_partials_bytes(B, V) bytes, 16-byte aligned (scratch)
  size_t partials_bytes = 0;
};
void sample(const SampleParams& p, CUstream_st* stream);
int sample_slices(int B, int V);
size_t sample_partials_bytes(int B, int V);  // 0 where one block per row is used anyway

// Philox4x32-10 (Salmon et al., SC'11): counter (step, 0x5eed, 0) under key seed; the first output word's top 24
// bits give u in [0, 1).
DS_SAMPLING_HD inline float philox_uniform(uint64_t seed, uint64_t step) {
  uint32_t c0 = static_cast<uint32_t>(step), c1 = static_cast<uint32_t>(step >> 32), c2 = 0x5eedu, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0, p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return static_cast<float>(c0 >> 8) * (1.0f / 16777216.0f);
}

}  // namespace ds::sampling
