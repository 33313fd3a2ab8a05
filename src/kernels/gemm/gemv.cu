// Weight-streaming kernels for decode-sized GEMMs (M <= kGemvMaxRows token rows): cuBLASLt reads the weights of an
// M = 1 GEMM at about half the copy bandwidth on the H200 (docs/perf-engine.md), while decode is nothing but
// streaming those weights once.
//
// A warp owns kRows consecutive rows of W and walks K in 16-byte chunks: W is read once with streaming loads (no
// L1 allocation), the few token rows of x come from the read-only cache, products accumulate in fp32 per (row,
// token). Short, wide weights (o_proj: N = 2304, K = 4096) give too few row groups to keep every SM's loads in
// flight, so `splits` warps of a block share one row group, each taking every splits-th chunk of K, and their
// fp32 partials are added in a fixed order through shared memory (deterministic).
//
// Launched with programmatic dependent launch: a block prefetches its weights into L2 before waiting for the
// kernel that wrote x, so the weight stream overlaps the previous kernel's tail (kernels/common/pdl.cuh).
//
// Weights: bf16 (8 per chunk), or e4m3 (W8A16: 16 per chunk, half the bytes) dequantised in registers with their
// 128x128 block scale; x stays bf16, so an FP8 decode step needs no activation quantiser and x keeps its
// precision.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/common/arrival.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/per_device.h"
#include "kernels/gemm/gemm_detail.h"
#include "kernels/norm/rmsnorm_row.cuh"

namespace ds::gemm::detail {

namespace {

constexpr int kWarps = 8;  // warps per block
constexpr int kThreads = kWarps * 32;
constexpr int kTargetWarps = 132 * 32;  // enough warps for every SM's loads in flight (H200: 132 SMs)

__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void unpack_e4m3x16(const uint4& v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw hr =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[i] >> (16 * h)), __NV_E4M3);
      const float2 p = __half22float2(__half2(hr));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
  }
}

// kFp8: W is e4m3 [N, K] (16 per chunk) with scales [ceil(N/128), scale_pitch]; else bf16 (8 per chunk).
template <bool kFp8>
struct WeightTraits {
  static constexpr int kPerChunk = kFp8 ? 16 : 8;  // weights per 16-byte load
  static constexpr int kRows = kFp8 ? 4 : 2;       // rows per warp (a 4-row group never straddles a scale block)
  static constexpr int kUnroll = kFp8 ? 2 : 4;     // K steps prefetched into L2 before the PDL wait
};

// The layer boundary fused behind the GEMV (GemmParams::post_*): residual += out; y = RMSNorm(residual) * w.
struct PostArgs {
  const __nv_bfloat16* w;
  uint4* residual;
  __nv_bfloat16* y;
  int32_t* counter;
  float eps;
};

// Every block arrives once its rows of out are stored (kernels/common/arrival.cuh); the last to arrive runs
// norm::add_rmsnorm's row code on the M finished rows (the same add and rounding: the same bits). out was written by
// other blocks of this grid: read through L2.
template <int M>
__device__ __forceinline__ void post_add_norm(const uint4* out, int N, const PostArgs& p) {
  __shared__ float npart[32];
  if (!arrival::last_to_arrive(p.counter, static_cast<int>(gridDim.x))) return;
  const int n16 = N / 8;
  for (int m = 0; m < M; ++m)
    norm::dev::add_rmsnorm_row(out + static_cast<int64_t>(m) * n16, p.residual + static_cast<int64_t>(m) * n16, p.w,
                               p.y + static_cast<int64_t>(m) * N, N, p.eps, npart);
}

// One block's rows of out[M, N] = x[M, K] (row pitch x_pitch16 16-byte chunks) @ W[N, K]^T. kNorm: x is
// un-normalised; after the PDL wait every block normalises the M rows into shared memory (RMSNorm * norm_w, the
// shared row code of norm.cu: the same bits as the norm kernel) and streams against those.
// kWide (bf16, one row only): four rows per warp instead of two (uses_wide(), launch_m).
template <int M, bool kFp8, bool kOutF32, bool kNorm = false, bool kPost = false, bool kWide = false>
__device__ __forceinline__ void gemv_block(const uint4* __restrict__ x, int64_t x_pitch16, const uint4* __restrict__ w,
                                           const float* __restrict__ w_scale, int scale_pitch, void* __restrict__ out,
                                           int N, int K, int splits, int block,
                                           const __nv_bfloat16* __restrict__ norm_w = nullptr, float norm_eps = 0.0f,
                                           const PostArgs* post = nullptr) {
  using T = WeightTraits<kFp8>;
  static_assert(!kWide || (!kFp8 && M == 1), "gemv: the wide rows are for one-row bf16 GEMVs");
  constexpr int kRows = kWide ? 4 : T::kRows, kPer = T::kPerChunk;
  __shared__ float part[kWarps][kRows][M];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = warp / splits, ks = warp % splits;
  const int n0 = (block * (kWarps / splits) + group) * kRows;
  const int KC = K / kPer;  // chunks per weight row
  const int64_t K8 = x_pitch16;
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = w + static_cast<int64_t>(min(n0 + r, N - 1)) * KC;  // tail re-reads
  // The weights do not depend on the previous kernel: pull the first steps of this warp's share into L2 while it
  // drains (PDL). Only the first kUnroll steps: the resident blocks of a large GEMM (lm_head, kda.proj) would
  // otherwise prefetch more than the 50 MB L2 holds (H200 run: whole-share prefetch made them 10-25 % slower).
  if (n0 < N)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < T::kUnroll; ++u) {
        const int c = ks * 32 + lane + u * 32 * splits;
        if (c < KC) pdl::prefetch_l2(wr[r] + c);
      }
  pdl::wait();  // x is the previous kernel's output

  extern __shared__ uint4 xn[];  // kNorm: the M normalised rows, K / 8 chunks each
  if constexpr (kNorm) {
    __shared__ float npart[32];
    // x is the predecessor's output: the coherent path, never the non-coherent one (kernels/common/pdl.cuh).
    for (int m = 0; m < M; ++m)
      norm::dev::rmsnorm_row<false>([&](int i) { return pdl::load_prior(x + m * x_pitch16 + i); }, norm_w,
                             reinterpret_cast<__nv_bfloat16*>(xn + static_cast<int64_t>(m) * (K / 8)), K, norm_eps,
                             npart);
    __syncthreads();
  }
  // x's 16-byte chunk i of row m: the normalised copy, or x itself (the predecessor's output: L1 yes, .nc no).
  auto load_x = [&](int m, int64_t i) {
    if constexpr (kNorm) {
      return xn[m * (K / 8) + i];
    } else {
      return pdl::load_prior(x + m * K8 + i);
    }
  };

  if (n0 < N) {
    const float* srow = kFp8 ? w_scale + static_cast<int64_t>(n0 / 128) * scale_pitch : nullptr;
    // One K step's loads (the kRows weight chunks, x's chunks, the block scale). For one token they go in two
    // alternating stages, so the next step's loads are in flight while this step's products are summed. A plain
    // loop (even unrolled) issued each step's loads only after the previous step's arithmetic: the compiler does
    // not hoist a guarded load above it, so each of a warp's ~5 steps was a full memory round trip (H200 SASS and
    // ncu of the W8A16 kernel: issue 35 % busy, L1TEX scoreboard the top stall). The sums keep their order: the
    // results are bitwise the same. M = 2..4 keep one stage, x read when summed: two stages cost 128-167
    // registers (W8A16), a lost block per SM or more.
    constexpr bool kTwoStages = M == 1;
    struct Stage {
      uint4 w[kRows];
      uint4 x[kPer / 8];  // kTwoStages only
      int c;
      float s;
    };
    auto fetch = [&](Stage& st, int c) {
      if (c >= KC) return;
#pragma unroll
      for (int r = 0; r < kRows; ++r) st.w[r] = __ldcs(wr[r] + c);
      if constexpr (kTwoStages)
#pragma unroll
        for (int h = 0; h < kPer / 8; ++h) st.x[h] = load_x(0, c * (kPer / 8) + h);
      st.c = c;
      st.s = kFp8 ? __ldg(srow + c / (128 / kPer)) : 1.0f;
    };
    auto consume = [&](const Stage& st) {
      float xf[M][kPer];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < kPer / 8; ++h)
          unpack_bf16x8(kTwoStages ? st.x[h] : load_x(m, st.c * (kPer / 8) + h), &xf[m][8 * h]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[kPer];
        if constexpr (kFp8) {
          unpack_e4m3x16(st.w[r], wf);
        } else {
          unpack_bf16x8(st.w[r], wf);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float d = 0.0f;
#pragma unroll
          for (int j = 0; j < kPer; ++j) d = fmaf(wf[j], xf[m][j], d);
          acc[r][m] = kFp8 ? fmaf(st.s, d, acc[r][m]) : acc[r][m] + d;
        }
      }
    };
    const int step = 32 * splits;
    Stage a;
    int c = ks * 32 + lane;
    if constexpr (kTwoStages) {
      Stage b;
      fetch(a, c);
      for (; c < KC; c += 2 * step) {
        fetch(b, c + step);
        consume(a);
        if (c + step >= KC) break;
        fetch(a, c + 2 * step);
        consume(b);
      }
    } else {
      for (; c < KC; c += step) {
        fetch(a, c);
        consume(a);
      }
    }
  }
  pdl::launch_dependents();  // the next kernel may start prefetching its weights
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  bool writer = lane == 0 && n0 < N;  // kPost: every thread goes on to the block's arrival below
  if (splits > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) part[warp][r][m] = acc[r][m];
    __syncthreads();
    if (!kPost && ks != 0) return;
    writer = writer && ks == 0;
    if (ks == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float v = part[warp][r][m];
          for (int k = 1; k < splits; ++k) v += part[warp + k][r][m];  // fixed order: deterministic
          acc[r][m] = v;
        }
  }
  if (writer)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (n0 + r >= N) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int64_t i = static_cast<int64_t>(m) * N + n0 + r;
        if constexpr (kOutF32) {
          static_cast<float*>(out)[i] = acc[r][m];
        } else {
          static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(acc[r][m]);
        }
      }
    }
  if constexpr (kPost) post_add_norm<M>(static_cast<const uint4*>(out), N, *post);
}

template <int M, bool kFp8, bool kOutF32, bool kNorm, bool kPost = false, bool kWide = false>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                                        const float* __restrict__ w_scale, int scale_pitch,
                                                        void* __restrict__ out, int N, int K, int splits,
                                                        const __nv_bfloat16* __restrict__ norm_w, float norm_eps,
                                                        PostArgs post) {
  gemv_block<M, kFp8, kOutF32, kNorm, kPost, kWide>(x, K / 8, w, w_scale, scale_pitch, out, N, K, splits, blockIdx.x,
                                                    norm_w, norm_eps, &post);
}

// Two bf16 problems in one launch (blockIdx.y picks one), x read through a row pitch (column slices).
struct PairArgs {
  const uint4* x[2];
  int64_t x_pitch16[2];
  const uint4* w[2];
  void* out[2];
  int N[2], K[2], splits[2], blocks[2];
};

template <int M>
__global__ void __launch_bounds__(kThreads) gemv_pair_kernel(PairArgs a) {
  const bool q = blockIdx.y != 0;  // selects without dynamic indexing (which would copy the params to the stack)
  if (static_cast<int>(blockIdx.x) >= (q ? a.blocks[1] : a.blocks[0])) return;  // the whole block, before any barrier
  gemv_block<M, false, false>(q ? a.x[1] : a.x[0], q ? a.x_pitch16[1] : a.x_pitch16[0], q ? a.w[1] : a.w[0], nullptr,
                              0, q ? a.out[1] : a.out[0], q ? a.N[1] : a.N[0], q ? a.K[1] : a.K[0],
                              q ? a.splits[1] : a.splits[0], blockIdx.x);
}

// Warps sharing a row group (split K), from the H200 sweep of every split count on the engine's decode shapes
// (gemm_bench, docs/perf-mla.md), with at least two chunks per lane per warp:
//  - bf16 blocks are short (32 registers, 8 blocks per SM): more warps win up to ~8 per SM slot, several waves
//    included (KDA projection 21.5 us at 1 split, 19.5 at 4; MLA fused A 14.1 at 2, 11.9 at 8); only the
//    lm_head, with 82k row groups, wants none. (Measured at 32 registers; the two-stage one-token kernel takes 48,
//    5 blocks per SM, and the sixth session's sweep agrees except mlp_down, 13.3 us at 4 splits against 15.4 at
//    the chosen 8: one GEMV a step, left as is.)
//  - W8A16 blocks want a single wave: a second, partial one costs more than the extra warps gain (KDA projection
//    11.3 us in 0.74 waves, 13.7 in 1.49; o_proj 5.8 in 0.55, 6.8 in 1.09; measured at 58 registers, 4 blocks per
//    SM). With the two load stages the one-token kernel takes 80 (3 per SM): still one wave for the KDA projection
//    (393 blocks), and the sixth session's sweep still picks 1 split there (10.0 us against 12.1 at 2).
// `resident`: blocks of the kernel that fit on the device at once.
int choose_splits(int N, int K, int rows_per_warp, int per_chunk, bool fp8, int resident) {
  const int groups = (N + rows_per_warp - 1) / rows_per_warp;
  const int chunks = K / per_chunk;
  const int64_t target = fp8 ? kTargetWarps : 8 * kTargetWarps;
  auto blocks = [&](int s) { return (static_cast<int64_t>(groups) * s + kWarps - 1) / kWarps; };
  int s = 1;
  while (s < kWarps && static_cast<int64_t>(groups) * 2 * s <= target && chunks >= 32 * 2 * 2 * s &&
         (!fp8 || blocks(2 * s) <= resident))
    s *= 2;
  return s;
}

// Blocks of `kernel` (kThreads each) resident on the current device at once; `occupancy` (the caller's, one per
// kernel) keeps the blocks per SM of each device.
template <typename Kernel>
int resident_blocks(PerDeviceValue<int>& occupancy, Kernel kernel) {
  int sms = 0, per_sm = 0;
  CUDA_CHECK(current_device_sms(sms));
  CUDA_CHECK(occupancy.get(per_sm, [&](int, int& v) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, kThreads, 0);
  }));
  return std::max(1, per_sm) * sms;
}

template <int M, bool kFp8>
int gemv_splits(int N, int K) {
  using T = WeightTraits<kFp8>;
  static PerDeviceValue<int> occupancy;
  const int resident = resident_blocks(occupancy, gemv_kernel<M, kFp8, false, false>);  // the twins: same registers
  return choose_splits(N, K, T::kRows, T::kPerChunk, kFp8, resident);
}

// One-row bf16 GEMVs with many rows (the KDA projection, the MLA fused A, the dense FFN's gate/up) take four rows
// per warp and one split: twice the bytes in flight per lane, and a block normalises its input (fused norm) for 16
// rows instead of 4. H200, gemm_bench --gemv, with the input norm fused: KDA projection 12576 x 2304 20.9 us (2 rows,
// its default 4 splits) -> 17.9 (4 rows, 1 split); MLA fused A 6720 x 2304 14.0 -> 11.7. 4 rows lose at o_proj's
// 2304 rows (8.4 us at best against 7.9), so smaller N keep two. lm_head keeps two as well: 173.3 against 174.7 us
// plain, but 179.5 against 175.7 with the final norm fused (eleventh session, gemm_bench --gemv lm_head).
constexpr int kWideMinN = 4096, kWideMaxN = 65535;
template <int M, bool kFp8>
constexpr bool wide_capable() {
  return !kFp8 && M == 1;
}
// Whether this GEMV takes the wide rows (the layer-boundary epilogue keeps two), and its split count then.
template <int M, bool kFp8>
constexpr bool uses_wide(int N, bool post) {
  return wide_capable<M, kFp8>() && N >= kWideMinN && N <= kWideMaxN && !post;
}
template <int M, bool kFp8>
int auto_splits(int N, int K, bool wide) {
  return wide ? 1 : gemv_splits<M, kFp8>(N, K);
}

template <int M, bool kFp8>
void launch_m(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int N,
              int K, cudaStream_t stream, int force_splits, GemvNorm norm) {
  using T = WeightTraits<kFp8>;
  const bool wide = uses_wide<M, kFp8>(N, norm.post_w != nullptr);
  const int splits = force_splits > 0 ? force_splits : auto_splits<M, kFp8>(N, K, wide);
  const int rows = wide ? 4 : T::kRows;
  const int groups = (N + rows - 1) / rows;
  const int per_block = kWarps / splits;
  const dim3 grid((groups + per_block - 1) / per_block);
  const auto* xv = static_cast<const uint4*>(x);
  const auto* wv = static_cast<const uint4*>(w);
  const auto* nw = static_cast<const __nv_bfloat16*>(norm.w);
  const size_t smem = norm.w ? static_cast<size_t>(M) * K * 2 : 0;  // <= 32 KB (kNormMaxK, checked below)
  const PostArgs post{static_cast<const __nv_bfloat16*>(norm.post_w), static_cast<uint4*>(norm.post_residual),
                      static_cast<__nv_bfloat16*>(norm.post_out), norm.post_counter, norm.eps};
  auto go = [&](auto kernel) {
    CUDA_CHECK(pdl::launch(true, kernel, grid, kThreads, smem, stream, xv, wv, w_scale, scale_pitch, out, N, K, splits,
                           nw, norm.eps, post));
  };
  if (norm.post_w) {  // bf16 out, no input norm (gemm_unsupported)
    go(gemv_kernel<M, kFp8, false, false, true>);
    return;
  }
  auto pick = [&](auto wide_tag) {
    constexpr bool kWide = decltype(wide_tag)::value;
    if (norm.w)
      out_f32 ? go(gemv_kernel<M, kFp8, true, true, false, kWide>) : go(gemv_kernel<M, kFp8, false, true, false, kWide>);
    else
      out_f32 ? go(gemv_kernel<M, kFp8, true, false, false, kWide>)
              : go(gemv_kernel<M, kFp8, false, false, false, kWide>);
  };
  if constexpr (wide_capable<M, kFp8>())
    if (wide) return pick(std::true_type{});
  pick(std::false_type{});
}

template <bool kFp8>
void launch(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int M,
            int N, int K, cudaStream_t stream, int splits, GemvNorm norm) {
  CHECK(splits == 0 || splits == 1 || splits == 2 || splits == 4 || splits == 8,
        "gemv: splits {} (0 = automatic, or 1, 2, 4, 8: warps of a block)", splits);
  CHECK(!norm.w || (K <= kNormMaxK && K % 8 == 0), "gemv: fused norm needs K % 8 == 0 and K <= {} (K = {})",
        kNormMaxK, K);
  CHECK(!norm.post_w || (!out_f32 && !norm.w && N % 8 == 0 && N <= 8192 && norm.post_residual && norm.post_out &&
                         norm.post_counter),
        "gemv: the fused residual add + norm needs bf16 out, no input norm, N % 8 == 0, N <= 8192 (N = {})", N);
  switch (M) {
    case 1: launch_m<1, kFp8>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    case 2: launch_m<2, kFp8>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    case 3: launch_m<3, kFp8>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    default: launch_m<4, kFp8>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void gemv_bf16(const void* x, const void* w, void* out, bool out_f32, int M, int N, int K, CUstream_st* stream,
               int splits, GemvNorm norm) {
  CHECK(M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && N >= 1, "gemv_bf16: M={} N={} K={} unsupported", M, N, K);
  launch<false>(x, w, nullptr, 0, out, out_f32, M, N, K, stream, splits, norm);
}

void gemv_w8a16(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int M,
                int N, int K, CUstream_st* stream, int splits, GemvNorm norm) {
  CHECK(M >= 1 && M <= kGemvMaxRows && K % 128 == 0 && N >= 1 && scale_pitch >= K / 128,
        "gemv_w8a16: M={} N={} K={} scale_pitch={} unsupported", M, N, K, scale_pitch);
  launch<true>(x, w, w_scale, scale_pitch, out, out_f32, M, N, K, stream, splits, norm);
}

int gemv_default_splits(int N, int K, bool fp8) {
  return fp8 ? auto_splits<1, true>(N, K, uses_wide<1, true>(N, false))
             : auto_splits<1, false>(N, K, uses_wide<1, false>(N, false));
}

}  // namespace ds::gemm::detail

namespace ds::gemm {

using detail::PairArgs;
using detail::WeightTraits;
using detail::choose_splits;
using detail::kWarps;
using detail::kThreads;
using detail::gemv_pair_kernel;
using detail::kGemvMaxRows;

void gemv_pair_bf16(const StridedGemv& a, const StridedGemv& b, int M, CUstream_st* stream) {
  CHECK(M >= 1 && M <= kGemvMaxRows, "gemv_pair_bf16: M={} unsupported", M);
  PairArgs args{};
  int grid_x = 1;
  const StridedGemv* ps[2] = {&a, &b};
  static PerDeviceValue<int> occupancy;
  const int resident = detail::resident_blocks(occupancy, gemv_pair_kernel<1>);
  for (int i = 0; i < 2; ++i) {
    const StridedGemv& p = *ps[i];
    CHECK(p.K % 8 == 0 && p.x_stride % 8 == 0 && p.N >= 1 && aligned16(p.x) && aligned16(p.w),
          "gemv_pair_bf16: problem {} (N={} K={} x_stride={}) breaks the 16-byte row contract", i, p.N, p.K,
          p.x_stride);
    args.x[i] = reinterpret_cast<const uint4*>(p.x);
    args.x_pitch16[i] = p.x_stride / 8;
    args.w[i] = reinterpret_cast<const uint4*>(p.w);
    args.out[i] = p.out;
    args.N[i] = p.N;
    args.K[i] = p.K;
    args.splits[i] =
        choose_splits(p.N, p.K, WeightTraits<false>::kRows, WeightTraits<false>::kPerChunk, false, resident);
    const int groups = (p.N + WeightTraits<false>::kRows - 1) / WeightTraits<false>::kRows;
    const int per_block = kWarps / args.splits[i];
    args.blocks[i] = (groups + per_block - 1) / per_block;
    grid_x = std::max(grid_x, args.blocks[i]);
  }
  const dim3 grid(grid_x, 2);
  switch (M) {
    case 1: CUDA_CHECK(pdl::launch(true, gemv_pair_kernel<1>, grid, kThreads, 0, stream, args)); break;
    case 2: CUDA_CHECK(pdl::launch(true, gemv_pair_kernel<2>, grid, kThreads, 0, stream, args)); break;
    case 3: CUDA_CHECK(pdl::launch(true, gemv_pair_kernel<3>, grid, kThreads, 0, stream, args)); break;
    default: CUDA_CHECK(pdl::launch(true, gemv_pair_kernel<4>, grid, kThreads, 0, stream, args)); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds::gemm
