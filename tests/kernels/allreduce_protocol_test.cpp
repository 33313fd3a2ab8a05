// The one-shot all-reduce protocol (lamport.h) run by std::threads over host memory: R ranks x B "blocks",
// each block a thread, the same Protocol<> code the CUDA kernels instantiate. Sums are compared bit for bit
// with a plain rank-ordered sum, over thousands of calls that reuse the buffers (fast ranks run a call ahead),
// mixing fused-like calls (with the RMSNorm partial exchange) and plain all-reduce calls on one epoch.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "kernels/allreduce/allreduce.h"
#include "kernels/allreduce/lamport.h"

namespace ds::allreduce {
namespace {

// Host policy: atomic_ref on 32-bit words (a 16-byte vector is four independent words: the sentinel test is
// per half, so a torn vector only means one more poll).
struct CpuMem {
  static std::atomic_ref<uint32_t> at(const uint32_t* p) { return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)); }
  static Vec4 load(const uint32_t* p) {
    Vec4 v;
    for (int i = 0; i < 4; ++i) v.w[i] = at(p + i).load(std::memory_order_relaxed);
    return v;
  }
  static void store(uint32_t* p, const Vec4& v) {
    for (int i = 0; i < 4; ++i) at(p + i).store(v.w[i], std::memory_order_relaxed);
  }
  static uint32_t load_word(const uint32_t* p) { return at(p).load(std::memory_order_acquire); }
  static void store_word(uint32_t* p, uint32_t v) { at(p).store(v, std::memory_order_release); }
  static uint32_t cas_word(uint32_t* p, uint32_t e, uint32_t d) {
    at(p).compare_exchange_strong(e, d, std::memory_order_acq_rel);
    return e;
  }
  static uint32_t add_word(uint32_t* p, uint32_t v) { return at(p).fetch_add(v, std::memory_order_acq_rel); }
  static void fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
  static uint64_t now_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  static void relax() { std::this_thread::yield(); }
};
using CP = Protocol<CpuMem>;

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Element i of rank r's contribution in call n: bf16 in [-2, 2), and now and then the sentinel bit pattern
// itself (a NaN the publisher must not send as "empty").
uint16_t contribution(int n, int r, size_t i) {
  const uint64_t h = mix((static_cast<uint64_t>(n) << 40) ^ (static_cast<uint64_t>(r) << 32) ^ i);
  if (h % 997 == 0) return 0xFFFF;
  return f32_to_bf16(static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 4.0f - 2.0f);
}
uint16_t expected_sum(int n, int R, size_t i) {
  float s = 0;
  for (int r = 0; r < R; ++r) s = r == 0 ? bf16_to_f32(contribution(n, r, i)) : s + bf16_to_f32(contribution(n, r, i));
  return f32_to_bf16(s);
}
bool same_value(uint16_t a, uint16_t b) {
  const bool na = std::isnan(bf16_to_f32(a)), nb = std::isnan(bf16_to_f32(b));
  return na || nb ? na == nb : a == b;
}

struct HostBuffers {
  std::vector<void*> bases;
  std::vector<RankView> views;
  HostBuffers(int R, size_t slot_elems, double timeout_s) {
    const size_t bytes = (buffer_bytes(R, slot_elems) + 255) / 256 * 256;
    for (int r = 0; r < R; ++r) {
      void* p = std::aligned_alloc(256, bytes);
      std::memset(p, 0xFF, bytes);  // init_buffers() on the host: sentinels, then a zero state
      std::memset(p, 0, sizeof(ArState));
      bases.push_back(p);
    }
    for (int r = 0; r < R; ++r) {
      views.push_back(make_rank_view(bases.data(), r, R, slot_elems));
      views.back().timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
    }
  }
  ~HostBuffers() {
    for (void* p : bases) std::free(p);
  }
};

struct SimConfig {
  int R = 2;
  int T = 2, D = 64, C = 2;  // fused-like calls: block b owns chunk b % C of token b / C (B = T * C blocks)
  int calls = 300;
  uint64_t seed = 1;
};

struct SimResult {
  std::atomic<int64_t> checked{0}, wrong_sum{0}, wrong_ss{0}, failures{0};
};

// One block of one rank: `calls` calls; every third call is a plain all-reduce over the same slots.
void run_block(const SimConfig& cfg, RankView v, int b, std::barrier<>& kernel_boundary, SimResult& res) {
  const int B = cfg.T * cfg.C, nvec = cfg.D / 8, vpc = nvec / cfg.C;
  const Layout L{v.world, v.slot_elems / 2};
  std::mt19937 jitter(static_cast<uint32_t>(cfg.seed * 131 + v.rank * 17 + b));
  for (int n = 0; n < cfg.calls; ++n) {
    const bool fused = n % 3 != 2;
    const uint32_t epoch = CpuMem::load_word(&v.state->epoch);
    const int parity = static_cast<int>(epoch & 1u);
    CP::reset_ss(v.ss, parity, b, B);
    std::vector<size_t> mine;  // vector indices (of the T * D / 8 in the call) this block owns
    if (fused) {
      for (int i = 0; i < vpc; ++i) mine.push_back(static_cast<size_t>(b / cfg.C) * nvec + (b % cfg.C) * vpc + i);
    } else {
      for (size_t i = b; i < static_cast<size_t>(cfg.T) * nvec; i += B) mine.push_back(i);
    }
    if (jitter() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 200));
    for (size_t i : mine) {
      Vec4 x;
      for (int w = 0; w < 4; ++w)
        x.w[w] = contribution(n, v.rank, i * 8 + 2 * w) | (static_cast<uint32_t>(contribution(n, v.rank, i * 8 + 2 * w + 1)) << 16);
      CP::push(v.peer_data, L, v.rank, parity, i * 4, x);
    }
    float ss = 0.0f;
    for (size_t i : mine) {
      float s[8] = {};
      const bool ok = CP::gather(v.peer_data[v.rank], L, parity, i * 4, v.state, v.timeout_ns, [&](int r, const Vec4& q) {
        for (int e = 0; e < 8; ++e) {
          const float f = bf16_to_f32(static_cast<uint16_t>(q.w[e / 2] >> (16 * (e % 2))));
          s[e] = r == 0 ? f : s[e] + f;
        }
      });
      if (!ok) {
        ++res.failures;
        continue;
      }
      for (int e = 0; e < 8; ++e) {
        const uint16_t got = f32_to_bf16(s[e]);
        res.wrong_sum += !same_value(got, expected_sum(n, v.world, i * 8 + e));
        ++res.checked;
        const float x = bf16_to_f32(got);
        ss += x * x;
      }
    }
    if (fused) {
      float total = 0;
      if (!CP::exchange_ss(v.ss, parity, b / cfg.C, b % cfg.C, cfg.C, f32_bits(ss), total, v.state, v.timeout_ns)) {
        ++res.failures;
      } else {
        // The same partials recomputed from the expected sums, added in chunk order.
        float want = 0;
        for (int c = 0; c < cfg.C; ++c) {
          float part = 0;
          for (int i = 0; i < vpc; ++i)
            for (int e = 0; e < 8; ++e) {
              const float x = bf16_to_f32(expected_sum(n, v.world, ((static_cast<size_t>(b / cfg.C) * nvec + c * vpc + i) * 8 + e)));
              part += x * x;
            }
          want = c == 0 ? part : want + part;
        }
        const bool nan = std::isnan(want) || std::isnan(total);
        res.wrong_ss += nan ? std::isnan(want) != std::isnan(total) : f32_bits(want) != f32_bits(total);
      }
    }
    CP::arrive(v.state, epoch, static_cast<uint32_t>(B));
    kernel_boundary.arrive_and_wait();  // the next "kernel" of this rank starts after every block finished
  }
}

void simulate(const SimConfig& cfg, SimResult& res) {
  const int B = cfg.T * cfg.C;
  HostBuffers buf(cfg.R, static_cast<size_t>(cfg.T) * cfg.D, 20.0);
  std::vector<std::unique_ptr<std::barrier<>>> boundaries;
  for (int r = 0; r < cfg.R; ++r) boundaries.push_back(std::make_unique<std::barrier<>>(B));
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.R; ++r)
    for (int b = 0; b < B; ++b)
      threads.emplace_back(run_block, std::cref(cfg), buf.views[r], b, std::ref(*boundaries[r]), std::ref(res));
  for (auto& t : threads) t.join();
  for (int r = 0; r < cfg.R; ++r) {
    EXPECT_EQ(buf.views[r].state->error, 0u) << "rank " << r << ": " << describe_error(buf.views[r].state->error);
    EXPECT_EQ(buf.views[r].state->epoch, static_cast<uint32_t>(cfg.calls)) << "rank " << r;
    EXPECT_EQ(buf.views[r].state->arrived, 0u) << "rank " << r;
  }
}

TEST(AllReduceProtocol, ThreadsMatchPlainSumOverRepeatedCalls) {
  for (int R : {2, 4, 8}) {
    SimConfig cfg;
    cfg.R = R;
    cfg.calls = R == 8 ? 1000 : 2000;
    cfg.seed = R;
    SimResult res;
    simulate(cfg, res);
    std::printf("[sim] R=%d calls=%d values=%lld wrong_sum=%lld wrong_ss=%lld failures=%lld\n", R, cfg.calls,
                static_cast<long long>(res.checked.load()), static_cast<long long>(res.wrong_sum.load()),
                static_cast<long long>(res.wrong_ss.load()), static_cast<long long>(res.failures.load()));
    EXPECT_EQ(res.checked.load(), static_cast<int64_t>(cfg.calls) * cfg.T * cfg.D * R) << "R=" << R;  // per rank
    EXPECT_EQ(res.wrong_sum.load(), 0) << "R=" << R;
    EXPECT_EQ(res.wrong_ss.load(), 0) << "R=" << R;
    EXPECT_EQ(res.failures.load(), 0) << "R=" << R;
  }
}

TEST(AllReduceProtocol, OneBlockPerTokenAndManyChunks) {
  for (int C : {1, 4}) {
    SimConfig cfg;
    cfg.R = 4;
    cfg.T = 3;
    cfg.D = 128;
    cfg.C = C;
    cfg.calls = 100;
    SimResult res;
    simulate(cfg, res);
    EXPECT_EQ(res.wrong_sum.load(), 0) << "C=" << C;
    EXPECT_EQ(res.wrong_ss.load(), 0) << "C=" << C;
    EXPECT_EQ(res.failures.load(), 0) << "C=" << C;
  }
}

TEST(AllReduceProtocol, PublishedValuesNeverLookEmpty) {
  EXPECT_TRUE(vec_empty(Vec4{{0, 0, 0, 0xFFFF0000u}}));
  EXPECT_TRUE(vec_empty(Vec4{{0x0000FFFFu, 0, 0, 0}}));
  EXPECT_FALSE(vec_empty(Vec4{{0x7FFF7FFFu, 0x80008000u, 0, 0xFFFEFFFEu}}));
  const Vec4 p = publishable(Vec4{{0xFFFFFFFFu, 0x1234FFFFu, 0xFFFF1234u, 0x3F803F80u}});
  EXPECT_FALSE(vec_empty(p));
  EXPECT_EQ(p.w[0], 0x7FFF7FFFu);
  EXPECT_EQ(p.w[1], 0x12347FFFu);
  EXPECT_EQ(p.w[2], 0x7FFF1234u);
  EXPECT_EQ(p.w[3], 0x3F803F80u);  // ordinary values untouched
  EXPECT_EQ(publishable_f32(kEmptyWord), 0x7FFFFFFFu);
  EXPECT_EQ(publishable_f32(f32_bits(2.5f)), f32_bits(2.5f));
}

// A rank that never contributes: the others give up after the timeout with the missing rank named, and the
// failure is sticky (later waits give up at once).
TEST(AllReduceProtocol, MissingPeerTimesOutWithItsRank) {
  HostBuffers buf(2, 64, 0.05);
  RankView v = buf.views[0];
  const Layout L{2, v.slot_elems / 2};
  CP::push(v.peer_data, L, 0, 0, 0, Vec4{{1, 2, 3, 4}});
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = CP::gather(v.peer_data[0], L, 0, 0, v.state, v.timeout_ns, [](int, const Vec4&) {});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(ok);
  EXPECT_LT(s, 5.0);
  EXPECT_EQ(v.state->error, kErrPeer | 1u);
  EXPECT_NE(describe_error(v.state->error).find("rank 1"), std::string::npos) << describe_error(v.state->error);
  EXPECT_TRUE(CP::failed(v.state));
  float total = 0;
  EXPECT_FALSE(CP::exchange_ss(v.ss, 0, 0, 0, 2, f32_bits(1.0f), total, v.state, v.timeout_ns));
  EXPECT_EQ(v.state->error, kErrPeer | 1u);  // the first failure is kept
}

}  // namespace
}  // namespace ds::allreduce
