// The W8A16 decode GEMV on tensor cores (kernels/common/w8a16_mma.cuh): out[M, N] = x[M, K] @ dequant(W)^T for
// M <= kGemvMaxRows token rows, e4m3 weights with 128x128 block scales. Same contract, PDL overlap and fused input
// norm as gemv.cu's CUDA-core W8A16 kernel; GemmRunner picks one of the two (DELTASERVE_W8A16_MMA).
//
// Work split: a warp owns kG slabs' worth of rows (8 kG consecutive weight rows) and walks K in 128-wide slabs,
// one mma chain per slab and row group, the slab's FP8 scale applied to the chain's fp32 result. `splits` warps of
// a block share one row tile, each taking every splits-th slab; their partials are added in a fixed order.
// Every block first writes the M activation rows into shared memory as f16 with their power-of-two row scales
// (normalised first with the fused input norm), then streams.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/w8a16_mma.cuh"
#include "kernels/gemm/gemm_detail.h"
#include "kernels/norm/rmsnorm_row.cuh"

namespace ds::gemm::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxSmem = 160 << 10;  // f16 activation rows: M * K * 2 bytes

template <int M, int kG, bool kOutF32, bool kNorm>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                                            const float* __restrict__ w_scale, int scale_pitch,
                                                            void* __restrict__ out, int N, int K, int splits,
                                                            const __nv_bfloat16* __restrict__ norm_w, float norm_eps) {
  using namespace w8mma;
  extern __shared__ uint4 xs[];  // [M][K / 8]: the activation rows as f16 times 2^-e (bf16 first with kNorm)
  __shared__ uint32_t red[kWarps][M];
  __shared__ float part[kWarps][kG * 8][M];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int tile = blockIdx.x * (kWarps / splits) + warp / splits, ks = warp % splits;
  const int n0 = tile * 8 * kG;
  const int K8 = K / 8, K16 = K / 16, KS = K / kSlabK;

  const uint4* wr[kG];  // this lane's weight row in each row group (tail rows re-read the last row)
#pragma unroll
  for (int gi = 0; gi < kG; ++gi) wr[gi] = w + static_cast<int64_t>(min(n0 + gi * 8 + g, N - 1)) * K16 + 2 * c;
  // The weights do not depend on the previous kernel: pull this warp's first two slabs into L2 while it drains.
  if (n0 < N && c == 0)
#pragma unroll
    for (int gi = 0; gi < kG; ++gi)
      for (int sb = ks; sb < min(KS, ks + 2 * splits); sb += splits) pdl::prefetch_l2(wr[gi] + sb * (kSlabK / 16));
  pdl::wait();  // x is the previous kernel's output

  // Activation rows -> shared f16 with per-row power-of-two scales (w8a16_mma.cuh).
  if constexpr (kNorm) {
    __shared__ float npart[32];
    for (int m = 0; m < M; ++m)
      norm::dev::rmsnorm_row<false>([&](int i) { return __ldg(x + static_cast<int64_t>(m) * K8 + i); }, norm_w,
                                    reinterpret_cast<__nv_bfloat16*>(xs + static_cast<int64_t>(m) * K8), K, norm_eps,
                                    npart);
    __syncthreads();
  }
  auto raw = [&](int m, int i) { return kNorm ? xs[m * K8 + i] : __ldg(x + static_cast<int64_t>(m) * K8 + i); };
  uint32_t amax[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    amax[m] = 0;
    for (int i = threadIdx.x; i < K8; i += kThreads) amax[m] = max(amax[m], amax_bits_bf16x8(raw(m, i)));
    amax[m] = __reduce_max_sync(0xffffffffu, amax[m]);
    if (lane == 0) red[warp][m] = amax[m];
  }
  __syncthreads();
  float inv[M], scale[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    uint32_t a = 0;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) a = max(a, red[wi][m]);
    const int e = row_f16_exponent(a);
    inv[m] = pow2f(-e), scale[m] = pow2f(e);
    for (int i = threadIdx.x; i < K8; i += kThreads) xs[m * K8 + i] = bf16x8_to_f16x8(raw(m, i), inv[m]);
  }
  __syncthreads();

  float acc[kG][2] = {};
  if (n0 < N) {
    const float* srow[kG];
#pragma unroll
    for (int gi = 0; gi < kG; ++gi) srow[gi] = w_scale + static_cast<int64_t>((n0 + gi * 8) / 128) * scale_pitch;
    const uint4* xrow = xs + min(g, M - 1) * K8;
#pragma unroll(4 / kG)  // 8 loads of 16 bytes in flight per lane
    for (int sb = ks; sb < KS; sb += splits) {
      uint4 wv[kG][2];
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        wv[gi][0] = __ldcs(wr[gi] + sb * (kSlabK / 16));
        wv[gi][1] = __ldcs(wr[gi] + sb * (kSlabK / 16) + 1);
      }
      uint32_t xa[16];
      load_slab_x(xrow, sb, c, g < M, xa);
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        slab_mma(wv[gi][0], wv[gi][1], xa, d);
        const float s = __ldg(srow[gi] + sb);
        acc[gi][0] = fmaf(s, d[0], acc[gi][0]);
        acc[gi][1] = fmaf(s, d[1], acc[gi][1]);
      }
    }
  }
  pdl::launch_dependents();  // the next kernel may start prefetching its weights

  // Lane (g < M, c) holds token g's sums for rows 8 gi + 2c, 2c + 1 of the tile.
  if (splits > 1) {
    if (g < M)
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        part[warp][gi * 8 + 2 * c][g] = acc[gi][0];
        part[warp][gi * 8 + 2 * c + 1][g] = acc[gi][1];
      }
    __syncthreads();
    if (ks != 0) return;
    if (g < M)
#pragma unroll
      for (int gi = 0; gi < kG; ++gi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = part[warp][gi * 8 + 2 * c + h][g];
          for (int k = 1; k < splits; ++k) v += part[warp + k][gi * 8 + 2 * c + h][g];  // fixed order
          acc[gi][h] = v;
        }
  }
  if (g >= M || n0 >= N) return;
  float sc = scale[0];
#pragma unroll
  for (int m = 1; m < M; ++m)
    if (g == m) sc = scale[m];
#pragma unroll
  for (int gi = 0; gi < kG; ++gi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + gi * 8 + 2 * c + h;
      if (n >= N) continue;
      const int64_t i = static_cast<int64_t>(g) * N + n;
      const float v = acc[gi][h] * sc;
      if constexpr (kOutF32) {
        static_cast<float*>(out)[i] = v;
      } else {
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
      }
    }
}

// Row groups per warp and warps per row tile. kG = 2 (16 rows, four 16-byte loads per lane and slab) unless that
// leaves fewer tiles than a wave of warps wants; splits: the most (<= 8) that keep two slabs per warp and the warps
// within about one resident wave (kTargetWarps: 132 SMs x 16).
constexpr int kTargetWarps = 132 * 16;

int mma_groups(int N) { return (N + 15) / 16 * 8 >= kTargetWarps ? 2 : 1; }

int mma_splits(int N, int K, int kg) {
  const int64_t tiles = (N + 8 * kg - 1) / (8 * kg);
  const int slabs = K / w8mma::kSlabK;
  int s = 1;
  while (s < kWarps && tiles * 2 * s <= kTargetWarps && slabs >= 2 * 2 * s) s *= 2;
  return s;
}

template <int M, int kG>
void launch_mg(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int N,
               int K, cudaStream_t stream, int force_splits, GemvNorm norm) {
  const int splits = force_splits > 0 ? force_splits : mma_splits(N, K, kG);
  const int tiles = (N + 8 * kG - 1) / (8 * kG);
  const int per_block = kWarps / splits;
  const dim3 grid((tiles + per_block - 1) / per_block);
  const size_t smem = static_cast<size_t>(M) * K * 2;
  auto go = [&](auto kernel) {
    if (smem > (48 << 10))  // past the default dynamic shared memory (a host-side attribute: fine in graph capture)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    CUDA_CHECK(pdl::launch(true, kernel, grid, kThreads, smem, stream, static_cast<const uint4*>(x),
                           static_cast<const uint4*>(w), w_scale, scale_pitch, out, N, K, splits,
                           static_cast<const __nv_bfloat16*>(norm.w), norm.eps));
  };
  if (norm.w)
    out_f32 ? go(gemv_mma_kernel<M, kG, true, true>) : go(gemv_mma_kernel<M, kG, false, true>);
  else
    out_f32 ? go(gemv_mma_kernel<M, kG, true, false>) : go(gemv_mma_kernel<M, kG, false, false>);
}

template <int M>
void launch_m(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int N,
              int K, cudaStream_t stream, int splits, GemvNorm norm) {
  if (mma_groups(N) == 2)
    launch_mg<M, 2>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm);
  else
    launch_mg<M, 1>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm);
}

}  // namespace

bool gemv_w8a16_mma_fits(int M, int K) { return static_cast<int64_t>(M) * K * 2 <= kMaxSmem; }

void gemv_w8a16_mma(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32,
                    int M, int N, int K, CUstream_st* stream, int splits, GemvNorm norm) {
  CHECK(M >= 1 && M <= kGemvMaxRows && K % 128 == 0 && N >= 1 && scale_pitch >= K / 128 && gemv_w8a16_mma_fits(M, K),
        "gemv_w8a16_mma: M={} N={} K={} scale_pitch={} unsupported", M, N, K, scale_pitch);
  CHECK(splits == 0 || splits == 1 || splits == 2 || splits == 4 || splits == 8,
        "gemv_w8a16_mma: splits {} (0 = automatic, or 1, 2, 4, 8: warps of a block)", splits);
  CHECK(!norm.w || (K <= kNormMaxK && K % 8 == 0), "gemv_w8a16_mma: fused norm needs K % 8 == 0 and K <= {} (K = {})",
        kNormMaxK, K);
  switch (M) {
    case 1: launch_m<1>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    case 2: launch_m<2>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    case 3: launch_m<3>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
    default: launch_m<4>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream, splits, norm); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

int gemv_mma_default_splits(int N, int K) { return mma_splits(N, K, mma_groups(N)); }

}  // namespace ds::gemm::detail
