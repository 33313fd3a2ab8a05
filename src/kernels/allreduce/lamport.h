// The one-shot push all-reduce protocol (Lamport style, flag-free), written once for the CUDA kernels and the
// CPU thread simulation: every step is a template on a memory-access policy `Mem` (see below).
//
// Protocol, per rank and call (docs/parallel.md has the reasoning):
//   1. epoch = state->epoch (one value for every block of the call); parity = epoch & 1.
//   2. push: each 16-byte vector of this rank's contribution is stored into slot [parity][me] of every rank's
//      receive buffer (its own included), values equal to the sentinel replaced by a quiet NaN first.
//   3. gather: each vector is polled in slot [parity][r] of the own buffer for r = 0..R-1, in rank order,
//      until no 16-bit lane holds the sentinel (0xFFFF, a NaN no publisher writes); the caller sums the R
//      vectors in that fixed order (so every rank computes bit-identical sums); each slot is reset to the
//      sentinel right after it was read.
//   4. end: the last block of the call (a per-rank arrival counter) advances state->epoch.
// Why two parities suffice: a peer writes slot [p][me] of my buffer again only in call n+2; it can start call
// n+2 only after it read my call n+1 contribution, which I push after my call n (and its resets) completed.
// Resets are local stores followed by a system-scope fence before the block arrives.
//
// Every wait is bounded: after `timeout_ns` (or as soon as another block has failed) the waiter records an
// error code in state->error and gives up; a kernel that starts with state->error set does no work. The error
// is sticky (the buffers are then inconsistent): the owner reports it and re-creates the buffer set.
//
// C++17, no fmt: included by .cu files and by the CPU simulation.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define DS_HD __host__ __device__ __forceinline__
#else
#define DS_HD inline
#endif

namespace ds::allreduce {

inline constexpr int kMaxRanks = 16;
inline constexpr int kMaxTokens = 16;  // largest T of the fused op (the knob's upper clamp)
inline constexpr int kMaxChunks = 8;   // blocks per token of the fused op (their RMSNorm partial sums meet)
inline constexpr uint32_t kEmptyWord = 0xFFFFFFFFu;  // two sentinel halves / one sentinel fp32 partial

// Per-rank protocol state (device memory of the rank itself; never accessed by peers).
struct ArState {
  uint32_t epoch;    // calls completed on this buffer set
  uint32_t arrived;  // blocks of the current call that finished (reset by the last one)
  uint32_t error;    // 0, or the first failure: kErrPeer | rank waited on, kErrChunk | chunk waited on
  uint32_t pad;
};
inline constexpr uint32_t kErrPeer = 1u << 24;   // a peer's contribution did not arrive within the timeout
inline constexpr uint32_t kErrChunk = 2u << 24;  // a sibling block's RMSNorm partial did not arrive
inline constexpr uint32_t kErrAbort = 3u << 24;  // gave up because another block of this rank had failed

// 8 half-precision values (bf16 or fp16), one 16-byte vector.
struct Vec4 {
  uint32_t w[4];
};

DS_HD bool word_has_empty_half(uint32_t w) { return (w & 0xFFFFu) == 0xFFFFu || (w >> 16) == 0xFFFFu; }
DS_HD bool vec_empty(const Vec4& v) {
  return word_has_empty_half(v.w[0]) || word_has_empty_half(v.w[1]) || word_has_empty_half(v.w[2]) ||
         word_has_empty_half(v.w[3]);
}
// A published half never equals the sentinel: 0xFFFF (a negative NaN) becomes 0x7FFF (still NaN).
DS_HD uint32_t publishable_word(uint32_t w) {
  if ((w & 0xFFFFu) == 0xFFFFu) w = (w & 0xFFFF0000u) | 0x7FFFu;
  if ((w >> 16) == 0xFFFFu) w = (w & 0x0000FFFFu) | 0x7FFF0000u;
  return w;
}
DS_HD Vec4 publishable(Vec4 v) {
  for (int i = 0; i < 4; ++i) v.w[i] = publishable_word(v.w[i]);
  return v;
}
// fp32 partial sums of squares use the all-ones NaN as sentinel.
DS_HD uint32_t publishable_f32(uint32_t bits) { return bits == kEmptyWord ? 0x7FFFFFFFu : bits; }

// Where things live in one rank's buffer, in 32-bit words from the start of the data region.
struct Layout {
  int world = 0;          // R
  size_t slot_words = 0;  // words per (parity, source) slot: capacity in half elements / 2
  DS_HD size_t slot(int parity, int src) const { return (static_cast<size_t>(parity) * world + src) * slot_words; }
};
// Sum-of-squares exchange slots of the fused op: [parity][token][chunk] fp32 bits.
DS_HD size_t ss_slot(int parity, int t, int c) {
  return (static_cast<size_t>(parity) * kMaxTokens + t) * kMaxChunks + c;
}
inline constexpr size_t kSsWords = 2 * kMaxTokens * kMaxChunks;

// Memory-access policy concept:
//   static Vec4 load(const uint32_t* p);              not served from a stale private cache
//   static void store(uint32_t* p, const Vec4& v);
//   static uint32_t load_word(const uint32_t* p);
//   static void store_word(uint32_t* p, uint32_t v);
//   static uint32_t cas_word(uint32_t* p, uint32_t expected, uint32_t desired);  returns the old value
//   static uint32_t add_word(uint32_t* p, uint32_t v);                           returns the old value
//   static void fence();                               orders this thread's earlier stores before later ones
//                                                      for every observer (system scope)
//   static uint64_t now_ns();
//   static void relax();                               between two polls
template <class Mem>
struct Protocol {
  // Records `code` unless an earlier failure is already recorded.
  static DS_HD void fail(ArState* st, uint32_t code) { Mem::cas_word(&st->error, 0u, code); }
  static DS_HD bool failed(const ArState* st) { return Mem::load_word(&st->error) != 0u; }

  // Polls one 16-byte vector until it holds no sentinel. False on timeout (error recorded as `code`) or when
  // another waiter of this rank has failed.
  static DS_HD bool poll(const uint32_t* p, Vec4& v, ArState* st, uint64_t timeout_ns, uint32_t code) {
    uint64_t start = 0;
    for (uint32_t spin = 0;; ++spin) {
      v = Mem::load(p);
      if (!vec_empty(v)) return true;
      if ((spin & 63u) == 63u) {
        if (failed(st)) return false;
        const uint64_t now = Mem::now_ns();
        if (start == 0) {
          start = now;
        } else if (now - start > timeout_ns) {
          fail(st, code);
          return false;
        }
      }
      Mem::relax();
    }
  }

  // Step 2: stores vector `v` of this rank's contribution at word offset `off` of slot [parity][me] in every
  // rank's buffer. Ranks are visited from me + 1 on, so R pushers do not all start on the same target.
  static DS_HD void push(uint32_t* const* peer_data, const Layout& L, int me, int parity, size_t off, Vec4 v) {
    v = publishable(v);
    const size_t at = L.slot(parity, me) + off;
    for (int i = 1; i <= L.world; ++i) {
      const int r = (me + i) % L.world;
      Mem::store(peer_data[r] + at, v);
    }
  }

  // Step 3: calls f(r, vec) for r = 0..R-1 in rank order with the vector at word offset `off` of slot
  // [parity][r] of the own buffer, resetting each slot after reading it. False on failure (f is then not
  // called for the remaining ranks).
  template <class F>
  static DS_HD bool gather(uint32_t* own_data, const Layout& L, int parity, size_t off, ArState* st,
                           uint64_t timeout_ns, F&& f) {
    for (int r = 0; r < L.world; ++r) {
      uint32_t* p = own_data + L.slot(parity, r) + off;
      Vec4 v;
      if (!poll(p, v, st, timeout_ns, kErrPeer | static_cast<uint32_t>(r))) return false;
      Mem::store(p, Vec4{{kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord}});
      f(r, v);
    }
    return true;
  }

  // The fused op's cross-block RMSNorm reduction: block `c` of the C blocks of token t publishes its partial
  // sum of squares and reads all C partials, summed in chunk order (every block gets the same total).
  static DS_HD bool exchange_ss(uint32_t* ss, int parity, int t, int c, int C, uint32_t mine_bits, float& total,
                                ArState* st, uint64_t timeout_ns) {
    Mem::store_word(ss + ss_slot(parity, t, c), publishable_f32(mine_bits));
    total = 0.0f;
    for (int j = 0; j < C; ++j) {
      const uint32_t* p = ss + ss_slot(parity, t, j);
      uint64_t start = 0;
      uint32_t bits;
      for (uint32_t spin = 0;; ++spin) {
        bits = Mem::load_word(p);
        if (bits != kEmptyWord) break;
        if ((spin & 63u) == 63u) {
          if (failed(st)) return false;
          const uint64_t now = Mem::now_ns();
          if (start == 0) {
            start = now;
          } else if (now - start > timeout_ns) {
            fail(st, kErrChunk | static_cast<uint32_t>(j));
            return false;
          }
        }
        Mem::relax();
      }
      float v;
      static_assert(sizeof v == sizeof bits, "fp32");
      __builtin_memcpy(&v, &bits, sizeof v);
      total = j == 0 ? v : total + v;
    }
    return true;
  }

  // Every call resets the other parity's sum-of-squares slots (used two calls ago, whichever op ran since):
  // worker w of W resets words w, w + W, ...
  static DS_HD void reset_ss(uint32_t* ss, int parity, int w, int W) {
    uint32_t* base = ss + ss_slot(parity ^ 1, 0, 0);
    for (int i = w; i < kMaxTokens * kMaxChunks; i += W) Mem::store_word(base + i, kEmptyWord);
  }

  // Step 4, by one thread per block once the whole block is done (its resets fenced).
  static DS_HD void arrive(ArState* st, uint32_t epoch, uint32_t nblocks) {
    Mem::fence();
    if (Mem::add_word(&st->arrived, 1u) == nblocks - 1) {
      Mem::store_word(&st->arrived, 0u);
      Mem::store_word(&st->epoch, epoch + 1u);
      Mem::fence();
    }
  }
};

}  // namespace ds::allreduce
