// Kernels of the fused MoE finalize + one-shot all-reduce + residual add + RMSNorm and of the plain peer
// all-reduce: the protocol of lamport.h with volatile 16-byte global accesses; the only dispatch point of both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/allreduce/allreduce.h"

#define AR_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    const cudaError_t ar_e_ = (expr);                                                              \
    if (ar_e_ != cudaSuccess)                                                                      \
      ::ds::allreduce::detail::throw_cuda_error(static_cast<int>(ar_e_), #expr, __FILE__, __LINE__); \
  } while (0)

namespace ds::allreduce {
namespace {

// Volatile global accesses go to L2 (the point where peers' NVLink stores land), never to a stale L1 line.
struct DeviceMem {
  static __device__ __forceinline__ Vec4 load(const uint32_t* p) {
    Vec4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                 : "l"(p)
                 : "memory");
    return v;
  }
  static __device__ __forceinline__ void store(uint32_t* p, const Vec4& v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]),
                 "r"(v.w[2]), "r"(v.w[3])
                 : "memory");
  }
  static __device__ __forceinline__ uint32_t load_word(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
  }
  static __device__ __forceinline__ void store_word(uint32_t* p, uint32_t v) {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  }
  static __device__ __forceinline__ uint32_t cas_word(uint32_t* p, uint32_t e, uint32_t d) { return atomicCAS(p, e, d); }
  static __device__ __forceinline__ uint32_t add_word(uint32_t* p, uint32_t v) { return atomicAdd(p, v); }
  static __device__ __forceinline__ void fence() { __threadfence_system(); }
  static __device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  static __device__ __forceinline__ void relax() {}
};
using P = Protocol<DeviceMem>;

// Activation dtype traits: two halves per 32-bit word, the low half first (the element at the lower address).
template <class H> struct Act;
template <> struct Act<__nv_bfloat16> {
  static __device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <> struct Act<__half> {
  static __device__ __forceinline__ float lo(uint32_t w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu))); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))); }
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <class H>
__device__ __forceinline__ void unpack(const Vec4& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = Act<H>::lo(v.w[i]);
    f[2 * i + 1] = Act<H>::hi(v.w[i]);
  }
}
template <class H>
__device__ __forceinline__ Vec4 pack(const float (&f)[8]) {
  Vec4 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.w[i] = Act<H>::pack(f[2 * i], f[2 * i + 1]);
  return v;
}
__device__ __forceinline__ Vec4 ld(const void* p) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  return Vec4{{u.x, u.y, u.z, u.w}};
}
__device__ __forceinline__ void store16(void* p, const Vec4& v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

// Block-wide sum in a fixed order (warp xor tree, then warp 0 over the warp sums), the result in every thread.
__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? part[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Epoch of this call, read once per block (all blocks of a call see the same value: it only advances when the
// last block arrives), and whether this rank already failed.
__device__ __forceinline__ uint32_t begin_call(ArState* st, bool& healthy) {
  __shared__ uint32_t s_epoch, s_healthy;
  if (threadIdx.x == 0) {
    s_epoch = DeviceMem::load_word(&st->epoch);
    s_healthy = !P::failed(st);
  }
  __syncthreads();
  healthy = s_healthy != 0;
  return s_epoch;
}
__device__ __forceinline__ void end_call(ArState* st, uint32_t epoch) {
  __threadfence_system();  // this thread's slot resets are visible before the block arrives
  __syncthreads();
  if (threadIdx.x == 0) P::arrive(st, epoch, gridDim.x * gridDim.y);
}

struct FusedArgs {
  const uint32_t* expert_out;  // [T, TOPK, D] halves
  const int32_t* e2p;          // [T * TOPK]
  const float* w;              // [T, TOPK]
  const uint32_t* shared;      // [T, D] or nullptr
  const uint32_t* residual;    // [T, D]
  uint32_t* residual_out;      // [T, D]
  const uint32_t* norm_w;      // [D]
  uint32_t* y;                 // [T, D]
  int D, TOPK;
  float eps;
  RankView comm;
};

// grid (chunks, T): block (c, t) owns vectors [c * kThreads * VPT, (c + 1) * kThreads * VPT) of token t's row,
// thread x the vectors c * kThreads * VPT + x + j * kThreads (j < VPT), held in registers from the sum to the
// scaling. Offsets below are in 32-bit words (two halves).
template <class H, int VPT>
__global__ void __launch_bounds__(kThreads) fused_ar_norm_kernel(const FusedArgs a) {
  const RankView& cm = a.comm;
  ArState* st = cm.state;
  bool ok;
  const uint32_t epoch = begin_call(st, ok);
  const int parity = static_cast<int>(epoch & 1u);
  const int t = blockIdx.y, c = blockIdx.x, C = gridDim.x;
  const int block = blockIdx.y * gridDim.x + blockIdx.x;
  P::reset_ss(cm.ss, parity, block * kThreads + threadIdx.x, gridDim.x * gridDim.y * kThreads);
  const Layout L{cm.world, cm.slot_elems / 2};
  const int nvec = a.D / 8;
  const size_t row = static_cast<size_t>(t) * a.D / 2;  // token t's row, in words
  const int first = c * kThreads * VPT + threadIdx.x;

  // 1. This rank's partial: sum_k w * y (+ shared), rounded to the activation dtype, pushed to every rank.
  if (ok) {
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int i = first + j * kThreads;
      if (i >= nvec) continue;
      float acc[8] = {};
      for (int k = 0; k < a.TOPK; ++k) {
        const size_t tk = static_cast<size_t>(t) * a.TOPK + k;
        if (a.e2p[tk] < 0) continue;
        const float wk = a.w[tk];
        float yv[8];
        unpack<H>(ld(a.expert_out + tk * a.D / 2 + i * 4), yv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += wk * yv[e];
      }
      if (a.shared) {
        float sv[8];
        unpack<H>(ld(a.shared + row + i * 4), sv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += sv[e];
      }
      P::push(cm.peer_data, L, cm.rank, parity, row + i * 4, pack<H>(acc));
    }
  }

  // 2. Gather the R partials in rank order, round the sum (the all-reduce's output contract), add the residual.
  float x[VPT][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = first + j * kThreads;
    if (i >= nvec) continue;
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = __uint_as_float(0x7FFFFFFFu);  // NaN unless every partial arrives
    if (ok) {
      ok = P::gather(cm.peer_data[cm.rank], L, parity, row + i * 4, st, cm.timeout_ns, [&](int r, const Vec4& v) {
        float f[8];
        unpack<H>(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = r == 0 ? f[e] : s[e] + f[e];
      });
      if (!ok)
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = __uint_as_float(0x7FFFFFFFu);
    }
    float rv[8];
    unpack<H>(ld(a.residual + row + i * 4), rv);
    float sr[8];
    unpack<H>(pack<H>(s), sr);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[j][e] = rv[e] + sr[e];
    const Vec4 xr = pack<H>(x[j]);
    unpack<H>(xr, x[j]);  // the stored residual is what the norm reads
    store16(a.residual_out + row + i * 4, xr);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += x[j][e] * x[j][e];
  }

  // 3. RMSNorm over the whole row: the C blocks of the token exchange their partial sums of squares.
  float total = block_sum(ss);
  if (C > 1) {
    __shared__ float s_total;
    if (threadIdx.x == 0) {
      float tot = __uint_as_float(0x7FFFFFFFu);
      if (!P::failed(st) && !P::exchange_ss(cm.ss, parity, t, c, C, __float_as_uint(total), tot, st, cm.timeout_ns))
        tot = __uint_as_float(0x7FFFFFFFu);
      s_total = tot;
    }
    __syncthreads();
    total = s_total;
  }
  const float rinv = rsqrtf(total / a.D + a.eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = first + j * kThreads;
    if (i >= nvec) continue;
    float wv[8];
    unpack<H>(ld(a.norm_w + i * 4), wv);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[j][e] = wv[e] * (x[j][e] * rinv);
    store16(a.y + row + i * 4, pack<H>(x[j]));
  }
  end_call(st, epoch);
}

// Plain one-shot all-reduce over `nvec` vectors, grid-strided: push every owned vector, then gather them.
template <class H>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(const uint32_t* in, uint32_t* out, size_t nvec,
                                                                   const RankView cm) {
  ArState* st = cm.state;
  bool ok;
  const uint32_t epoch = begin_call(st, ok);
  const int parity = static_cast<int>(epoch & 1u);
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  P::reset_ss(cm.ss, parity, static_cast<int>(first), static_cast<int>(stride));
  const Layout L{cm.world, cm.slot_elems / 2};
  if (ok)
    for (size_t i = first; i < nvec; i += stride) P::push(cm.peer_data, L, cm.rank, parity, i * 4, ld(in + i * 4));
  for (size_t i = first; i < nvec; i += stride) {
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = __uint_as_float(0x7FFFFFFFu);
    if (ok) {
      ok = P::gather(cm.peer_data[cm.rank], L, parity, i * 4, st, cm.timeout_ns, [&](int r, const Vec4& v) {
        float f[8];
        unpack<H>(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = r == 0 ? f[e] : s[e] + f[e];
      });
      if (!ok)
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = __uint_as_float(0x7FFFFFFFu);
    }
    store16(out + i * 4, pack<H>(s));
  }
  end_call(st, epoch);
}

template <class H, int VPT>
void launch_fused(const FusedArgs& a, int chunks, int T, cudaStream_t s) {
  fused_ar_norm_kernel<H, VPT><<<dim3(chunks, T), kThreads, 0, s>>>(a);
  AR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int device_resident_blocks(int device) {
  int sms = 0;
  AR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int saved = 0;
  AR_CUDA_CHECK(cudaGetDevice(&saved));
  AR_CUDA_CHECK(cudaSetDevice(device));
  int per_sm = 1 << 30;
  auto take = [&](const void* kernel) {
    int n = 0;
    AR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
    per_sm = n < per_sm ? n : per_sm;
  };
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__nv_bfloat16, 1>));
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__nv_bfloat16, 2>));
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__nv_bfloat16, 4>));
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__half, 1>));
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__half, 2>));
  take(reinterpret_cast<const void*>(fused_ar_norm_kernel<__half, 4>));
  take(reinterpret_cast<const void*>(peer_all_reduce_kernel<__nv_bfloat16>));
  take(reinterpret_cast<const void*>(peer_all_reduce_kernel<__half>));
  AR_CUDA_CHECK(cudaSetDevice(saved));
  return sms * per_sm;
}

namespace detail {

void launch_fused_ar_norm(const FusedArNormParams& p, const FusedGrid& g) {
  const FusedArgs a{static_cast<const uint32_t*>(p.expert_out), p.expanded_to_permuted, p.topk_weights,
                    static_cast<const uint32_t*>(p.shared_out), static_cast<const uint32_t*>(p.residual),
                    static_cast<uint32_t*>(p.residual_out), static_cast<const uint32_t*>(p.norm_w),
                    static_cast<uint32_t*>(p.y), p.D, p.TOPK, p.eps, p.comm};
  const bool bf = p.dtype == DType::kBF16;
  switch (g.vpt) {
    case 1: bf ? launch_fused<__nv_bfloat16, 1>(a, g.chunks, p.T, p.stream) : launch_fused<__half, 1>(a, g.chunks, p.T, p.stream); break;
    case 2: bf ? launch_fused<__nv_bfloat16, 2>(a, g.chunks, p.T, p.stream) : launch_fused<__half, 2>(a, g.chunks, p.T, p.stream); break;
    default: bf ? launch_fused<__nv_bfloat16, 4>(a, g.chunks, p.T, p.stream) : launch_fused<__half, 4>(a, g.chunks, p.T, p.stream); break;
  }
}

void launch_peer_all_reduce(const PeerAllReduceParams& p, int blocks) {
  const auto* in = static_cast<const uint32_t*>(p.in);
  auto* out = static_cast<uint32_t*>(p.out);
  if (p.dtype == DType::kBF16)
    peer_all_reduce_kernel<__nv_bfloat16><<<blocks, kThreads, 0, p.stream>>>(in, out, p.count / 8, p.comm);
  else
    peer_all_reduce_kernel<__half><<<blocks, kThreads, 0, p.stream>>>(in, out, p.count / 8, p.comm);
  AR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace ds::allreduce
