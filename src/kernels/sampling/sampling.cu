// GPU sampling: one 1024-thread block per request (the greedy pass of few rows: several, see sample_kernel). Thread
// t owns the contiguous id range [t*seg, (t+1)*seg), so every "first in id order" rule (argmax ties, top-k/top-p
// ties, the inverse-CDF draw) is a per-thread walk plus one block scan. Top-k and top-p thresholds are found by
// 4-pass radix selection on order-preserving logit keys (8 bits per pass): counts for top-k, 2^-40 fixed-point
// probability masses for top-p (integer atomics are order-independent, which keeps the result deterministic).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/cuda_utils.h"
#include "kernels/common/arrival.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/sampling/sampling.h"

namespace ds::sampling {

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
constexpr uint32_t kNegInfKey = 0x007fffffu;  // key of -inf; NaN maps to 0; valid candidates have larger keys
constexpr double kMassOne = 1099511627776.0;  // 2^40
using u64 = unsigned long long;

__device__ __forceinline__ uint32_t key_of(float x) {
  if (isnan(x)) return 0u;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Shared {
  u64 hist[256];
  u64 u[kWarps];
  float f[kWarps];
  uint32_t key[kWarps];
  int idx[kWarps];
  int digit;
  u64 rem;
  int result;
};

// The kept-set filter: top-k (key > tk, or the first tk_keep ties at tk in id order among valid ids), then top-p
// (the same over the top-k survivors).
struct Filter {
  bool k_on = false, p_on = false;
  uint32_t tk = 0, tp = 0;
  long long tk_keep = 0, tp_keep = 0;
};

// Walks the thread's ids in order; fn(i, key, v, keep_k, keep_p) returns true to stop early.
template <class Fn>
__device__ __forceinline__ void walk(const float* __restrict__ x, int b, int e, const Filter& f, long long rk,
                                     long long rp, Fn&& fn) {
  for (int i = b; i < e; ++i) {
    const float v = x[i];
    const uint32_t key = key_of(v);
    bool kk = key > kNegInfKey;
    if (kk && f.k_on) {
      if (key < f.tk) kk = false;
      else if (key == f.tk) kk = rk++ < f.tk_keep;
    }
    bool kp = kk;
    if (kp && f.p_on) {
      if (key < f.tp) kp = false;
      else if (key == f.tp) kp = rp++ < f.tp_keep;
    }
    if (fn(i, key, v, kk, kp)) return;
  }
}

// Deterministic block reductions: a fixed shuffle tree per warp, then every thread folds the warp results in
// warp order. Each starts with a barrier so the shared slots of the previous call are free.
__device__ u64 block_sum_u64(u64 v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.u[threadIdx.x / 32] = v;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < kWarps; ++w) t += sh.u[w];
  return t;
}
__device__ float block_sum_f(float v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.f[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < kWarps; ++w) t += sh.f[w];
  return t;
}
// Exclusive prefix (in thread order) of integer v; also returns the total.
__device__ u64 block_excl_u64(u64 v, Shared& sh, u64* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  u64 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) sh.u[warp] = incl;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.u[w];
    all += sh.u[w];
  }
  *total = all;
  return before + incl - v;
}
__device__ float block_excl_f(float v, Shared& sh, float* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) sh.f[warp] = incl;
  __syncthreads();
  float before = 0.0f, all = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.f[w];
    all += sh.f[w];
  }
  *total = all;
  return before + incl - v;
}
// Largest key, lowest id among equal keys.
__device__ void block_argmax(uint32_t& key, int& idx, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (k2 > key || (k2 == key && i2 < idx)) key = k2, idx = i2;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.key[threadIdx.x / 32] = key, sh.idx[threadIdx.x / 32] = idx;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w)
    if (sh.key[w] > key || (sh.key[w] == key && sh.idx[w] < idx)) key = sh.key[w], idx = sh.idx[w];
}

// Warp 0 scans the 256-bin histogram from the top and finds the bin where the running total reaches rem;
// publishes the digit (-1 if the total never does) and what is still needed inside that bin.
__device__ void pick_digit(Shared& sh, u64 rem) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    u64 cnt[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += cnt[j] = sh.hist[255 - 8 * lane - j];
    u64 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    const u64 excl = incl - sum;
    if (lane == 0) sh.digit = -1;
    __syncwarp();
    if (excl < rem && incl >= rem) {  // exactly one lane: the running total is monotone
      u64 acc = excl;
      for (int j = 0; j < 8; ++j) {
        if (acc + cnt[j] >= rem) {
          sh.digit = 255 - 8 * lane - j;
          sh.rem = rem - acc;
          break;
        }
        acc += cnt[j];
      }
    }
  }
  __syncthreads();
}

// Pass 1 over ids [r0, r1) of row x: argmax (ties -> lowest id) and the number of valid (finite or +inf) logits,
// both reduced over the block (every thread gets them). Neither depends on the order ids are visited in, as long as
// each thread meets its own ids in increasing order (strict > keeps its first maximum; block_argmax breaks ties by
// id), so this pass reads coalesced: thread t takes ids r0 + t, r0 + t + 1024, ... (16-byte vectors of 4 ids
// where the row allows), not the contiguous segment the later passes walk.
__device__ void argmax_pass(const float* __restrict__ x, int V, int r0, int r1, Shared& sh, uint32_t& bkey, int& bidx,
                            u64& nvalid) {
  const int tid = threadIdx.x;
  bkey = 0;
  bidx = INT_MAX;
  nvalid = 0;
  auto visit = [&](int i, float v) {
    const uint32_t key = key_of(v);
    if (key > bkey) bkey = key, bidx = i;
    nvalid += key > kNegInfKey;
  };
  if (V % 4 == 0 && r0 % 4 == 0 && r1 % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    // kBatch vectors in flight per thread, then visited in id order: one load at a time made the 163,840-logit
    // row 40 dependent L2 round trips (20.7 us per decode step in the engine's graph, ktrace).
    constexpr int kBatch = 8;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int e4 = r1 / 4;
    auto visit4 = [&](int j, const float4& q) {
      visit(4 * j, q.x);
      visit(4 * j + 1, q.y);
      visit(4 * j + 2, q.z);
      visit(4 * j + 3, q.w);
    };
    int j = r0 / 4 + tid;
    for (; j + (kBatch - 1) * kThreads < e4; j += kBatch * kThreads) {
      float4 q[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) q[u] = x4[j + u * kThreads];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) visit4(j + u * kThreads, q[u]);
    }
    for (; j < e4; j += kThreads) visit4(j, x4[j]);
  } else {
    for (int i = r0 + tid; i < r1; i += kThreads) visit(i, x[i]);
  }
  block_argmax(bkey, bidx, sh);
  nvalid = block_sum_u64(nvalid, sh);
}

// The split greedy pass's per-block result (SampleParams::partials).
struct Partial {
  uint32_t key;
  int idx;
  u64 nvalid;
};

// kSplit: blockIdx.x is one of gridDim.x slices of row blockIdx.y. Each block runs pass 1 on its slice and
// arrives on the row's counter; the last to arrive folds the slices' results (the same maximum, lowest id and
// count as one pass over the row: both reductions are order-independent), re-arms the counter and finishes the
// row alone, exactly as the one-block kernel. A greedy row's single read of the logits is then spread over
// gridDim.x SMs instead of one (18 us per decode step at V = 163,840 on the H200 with one block, ktrace).
template <bool kSplit>
__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleParams p) {
  __shared__ Shared sh;
  const int row = kSplit ? blockIdx.y : blockIdx.x, tid = threadIdx.x, V = p.V;
  const float* x = p.logits + static_cast<int64_t>(row) * p.ld;
  const int seg = (V + kThreads - 1) / kThreads, b = min(V, tid * seg), e = min(V, b + seg);
  Filter f;
  pdl::wait();  // the logits come from the previous kernel

  uint32_t bkey;
  int bidx;
  u64 nvalid;
  if constexpr (kSplit) {
    const int slices = gridDim.x, chunk = (V / slices + 3) / 4 * 4 + 4;  // multiple of 4, covers the row
    const int r0 = min(V, static_cast<int>(blockIdx.x) * chunk), r1 = min(V, r0 + chunk);
    argmax_pass(x, V, r0, r1, sh, bkey, bidx, nvalid);
    int32_t* counter = p.counters + row;
    Partial* part = static_cast<Partial*>(p.partials) + static_cast<int64_t>(row) * slices;
    if (tid == 0) part[blockIdx.x] = Partial{bkey, bidx, nvalid};
    if (!arrival::last_to_arrive(counter, slices)) return;
    bkey = 0, bidx = INT_MAX, nvalid = 0;
    if (tid < slices) {
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(part + tid));  // written by other blocks: L2
      bkey = raw.x, bidx = static_cast<int>(raw.y), nvalid = (u64{raw.w} << 32) | raw.z;
    }
    block_argmax(bkey, bidx, sh);
    nvalid = block_sum_u64(nvalid, sh);
  } else {
    argmax_pass(x, V, 0, V, sh, bkey, bidx, nvalid);
  }
  // A greedy row (the common case) ends here: one coalesced read of the logits.
  const int argmax = bidx == INT_MAX ? 0 : bidx;
  const float temp = p.temperature[row];
  const int top_k = p.top_k[row];
  const float top_p = p.top_p[row];
  if (temp <= 0.0f || top_k == 1 || nvalid == 0) {
    if (tid == 0) p.out[row] = argmax;
    return;
  }
  long long tie_k0 = 0, tie_p0 = 0;

  // Top-k: radix-select the k-th largest valid key; keep the first `rem` ties at it (lower ids first).
  if (top_k > 0 && static_cast<u64>(top_k) < nvalid) {
    uint32_t prefix = 0, pmask = 0;
    u64 rem = static_cast<u64>(top_k);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int j = tid; j < 256; j += kThreads) sh.hist[j] = 0;
      __syncthreads();
      walk(x, b, e, f, 0, 0, [&](int, uint32_t key, float, bool kk, bool) {
        if (kk && (key & pmask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], u64{1});
        return false;
      });
      __syncthreads();
      pick_digit(sh, rem);
      prefix |= static_cast<uint32_t>(sh.digit) << shift;  // always found: rem <= count of the current prefix
      pmask |= 0xffu << shift;
      rem = sh.rem;
    }
    u64 ties = 0, total = 0;
    walk(x, b, e, f, 0, 0, [&](int, uint32_t key, float, bool kk, bool) {
      ties += kk && key == prefix;
      return false;
    });
    tie_k0 = static_cast<long long>(block_excl_u64(ties, sh, &total));
    f.k_on = true;
    f.tk = prefix;
    f.tk_keep = static_cast<long long>(rem);
  }

  // Normaliser of the top-k set (the argmax always survives top-k: it is the largest, lowest-id key).
  const float m = x[argmax], inv_t = 1.0f / fmaxf(temp, 1e-6f);
  float z = 0.0f;
  walk(x, b, e, f, tie_k0, 0, [&](int, uint32_t, float v, bool kk, bool) {
    if (kk) z += __expf((v - m) * inv_t);
    return false;
  });
  const float zk = block_sum_f(z, sh);
  auto mass = [&](float v) { return static_cast<u64>(static_cast<double>(__expf((v - m) * inv_t) / zk) * kMassOne); };

  // Top-p: radix-select the key where the mass taken in descending order reaches top_p.
  if (top_p < 1.0f) {
    uint32_t prefix = 0, pmask = 0;
    u64 rem = max(u64{1}, static_cast<u64>(static_cast<double>(top_p) * kMassOne));
    bool found = true;
    for (int shift = 24; shift >= 0 && found; shift -= 8) {
      for (int j = tid; j < 256; j += kThreads) sh.hist[j] = 0;
      __syncthreads();
      walk(x, b, e, f, tie_k0, 0, [&](int, uint32_t key, float v, bool kk, bool) {
        if (kk && (key & pmask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], mass(v));
        return false;
      });
      __syncthreads();
      pick_digit(sh, rem);
      if (sh.digit < 0) {  // fixed-point truncation left the whole set short of top_p: keep everything
        found = false;
        break;
      }
      prefix |= static_cast<uint32_t>(sh.digit) << shift;
      pmask |= 0xffu << shift;
      rem = sh.rem;
    }
    if (found) {
      const u64 q = mass(value_of(prefix));
      u64 ties = 0, total = 0;
      walk(x, b, e, f, tie_k0, 0, [&](int, uint32_t key, float, bool kk, bool) {
        ties += kk && key == prefix;
        return false;
      });
      tie_p0 = static_cast<long long>(block_excl_u64(ties, sh, &total));
      f.p_on = true;
      f.tp = prefix;
      f.tp_keep = q > 0 ? static_cast<long long>((rem + q - 1) / q) : LLONG_MAX;
    }
  }

  // Draw: inverse CDF over the kept ids in id order.
  float wsum = 0.0f;
  int last = -1;
  walk(x, b, e, f, tie_k0, tie_p0, [&](int i, uint32_t, float v, bool, bool kp) {
    if (kp) wsum += __expf((v - m) * inv_t), last = i;
    return false;
  });
  float ztot = 0.0f;
  const float excl = block_excl_f(wsum, sh, &ztot);
  const float target = philox_uniform(p.seed[row], static_cast<uint64_t>(p.step[row])) * ztot;
  if (tid == 0) sh.result = INT_MAX;
  __syncthreads();
  if (wsum > 0.0f && target >= excl && target < excl + wsum) {
    float cum = excl;
    int pick = last;
    walk(x, b, e, f, tie_k0, tie_p0, [&](int i, uint32_t, float v, bool, bool kp) {
      if (!kp) return false;
      cum += __expf((v - m) * inv_t);
      if (target < cum) {
        pick = i;
        return true;
      }
      return false;
    });
    atomicMin(&sh.result, pick);  // rounding may make two neighbours both claim: the lower id wins, always
  }
  uint32_t lk = last < 0 ? 0u : 1u;
  int li = last < 0 ? INT_MAX : -last;  // block_argmax keeps the lowest idx: negate to get the highest kept id
  block_argmax(lk, li, sh);
  if (tid == 0) {
    const int r = sh.result != INT_MAX ? sh.result : (li == INT_MAX ? argmax : -li);
    p.out[row] = r;
  }
}

}  // namespace

int sample_slices(int B, int V) {
  // About two blocks per SM in all (H200: 132 SMs), at most 32 per row and at least 4,096 logits per slice; one
  // block per row once the rows alone fill the device.
  const int by_rows = (264 + B - 1) / std::max(B, 1), by_len = V / 4096;
  return std::max(1, std::min({32, by_rows, by_len}));
}

size_t sample_partials_bytes(int B, int V) {
  const int s = sample_slices(B, V);
  return s > 1 ? static_cast<size_t>(B) * s * sizeof(Partial) : 0;
}

void sample(const SampleParams& p, CUstream_st* stream) {
  CHECK(p.B >= 0 && p.V > 0 && p.ld >= p.V, "sample: B={} V={} ld={}", p.B, p.V, p.ld);
  if (p.B == 0) return;
  CHECK(p.logits && p.temperature && p.top_k && p.top_p && p.seed && p.step && p.out, "sample: null pointer argument");
  CHECK(!p.counters == !p.partials, "sample: counters and partials go together");
  const int slices = p.partials ? sample_slices(p.B, p.V) : 1;
  if (slices > 1) {
    CHECK(reinterpret_cast<uintptr_t>(p.partials) % 16 == 0 && p.partials_bytes >= sample_partials_bytes(p.B, p.V),
          "sample: partials of {} bytes at {}, needs {} bytes, 16-byte aligned", p.partials_bytes, p.partials,
          sample_partials_bytes(p.B, p.V));
    CUDA_CHECK(pdl::launch(true, sample_kernel<true>, dim3(slices, p.B), kThreads, 0, stream, p));
  } else {
    CUDA_CHECK(pdl::launch(true, sample_kernel<false>, dim3(p.B), kThreads, 0, stream, p));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace ds::sampling
