// Weight-streaming kernel for decode-sized bf16 GEMMs (M <= kGemvMaxRows token rows): cuBLASLt reads the weights
// of an M = 1 GEMM at about half the copy bandwidth on the H200 (docs/perf-engine.md: 1.35 ms for ~2.8 GB of
// dense weights per token), while decode is nothing but streaming those weights once.
//
// Each warp owns kRows consecutive rows of W and walks K in 16-byte chunks (8 bf16 per lane per step): W is read
// once with streaming loads (no L1 allocation), the few token rows of x come from the read-only cache, products
// accumulate in fp32 per (row, token), and one warp-shuffle reduction per (row, token) ends the row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_utils.h"
#include "kernels/gemm/gemm_detail.h"

namespace ds::gemm::detail {

namespace {

constexpr int kRows = 2;           // W rows per warp (x loads shared between them)
constexpr int kWarps = 8;          // warps per block
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

template <int M, bool kOutF32>
__global__ void __launch_bounds__(kThreads) gemv_bf16_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                                             void* __restrict__ out, int N, int K8) {
  const int lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + threadIdx.x / 32) * kRows;
  if (n0 >= N) return;  // whole warps exit together
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const bool second = n0 + 1 < N;
  const uint4* w0 = w + static_cast<int64_t>(n0) * K8;
  const uint4* w1 = second ? w0 + K8 : w0;
#pragma unroll 4
  for (int c = lane; c < K8; c += 32) {
    float wf[kRows][8];
    unpack_bf16x8(__ldcs(w0 + c), wf[0]);
    unpack_bf16x8(second ? __ldcs(w1 + c) : make_uint4(0, 0, 0, 0), wf[1]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      unpack_bf16x8(__ldg(x + static_cast<int64_t>(m) * K8 + c), xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][m] = fmaf(wf[r][j], xf[j], acc[r][m]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  if (lane != 0) return;
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
}

template <int M>
void launch_m(const void* x, const void* w, void* out, bool out_f32, int N, int K, cudaStream_t s) {
  const int warps = (N + kRows - 1) / kRows;
  const dim3 grid((warps + kWarps - 1) / kWarps);
  const auto* xv = static_cast<const uint4*>(x);
  const auto* wv = static_cast<const uint4*>(w);
  if (out_f32) {
    gemv_bf16_kernel<M, true><<<grid, kThreads, 0, s>>>(xv, wv, out, N, K / 8);
  } else {
    gemv_bf16_kernel<M, false><<<grid, kThreads, 0, s>>>(xv, wv, out, N, K / 8);
  }
}

}  // namespace

void gemv_bf16(const void* x, const void* w, void* out, bool out_f32, int M, int N, int K, CUstream_st* stream) {
  CHECK(M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && N >= 1, "gemv_bf16: M={} N={} K={} unsupported", M, N, K);
  switch (M) {
    case 1: launch_m<1>(x, w, out, out_f32, N, K, stream); break;
    case 2: launch_m<2>(x, w, out, out_f32, N, K, stream); break;
    case 3: launch_m<3>(x, w, out, out_f32, N, K, stream); break;
    default: launch_m<4>(x, w, out, out_f32, N, K, stream); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds::gemm::detail
