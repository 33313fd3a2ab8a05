// Weight-streaming kernel for decode-sized bf16 GEMMs (M <= kGemvMaxRows token rows): cuBLASLt reads the weights
// of an M = 1 GEMM at about half the copy bandwidth on the H200 (docs/perf-engine.md: 1.35 ms for ~2.8 GB of
// dense weights per token), while decode is nothing but streaming those weights once.
//
// Each warp owns kRows consecutive rows of W and walks K in 16-byte chunks (8 bf16 per lane per step): W is read
// once with streaming loads (no L1 allocation), the few token rows of x come from the read-only cache, products
// accumulate in fp32 per (row, token), and one warp-shuffle reduction per (row, token) ends the row.
//
// FP8 weights (W8A16): the same stream over e4m3 codes (16 per 16-byte load, half the bytes), dequantised in
// registers with their 128x128 block scale; x stays bf16, so the decode step needs no activation quantiser (one
// launch fewer per GEMM) and x keeps its bf16 precision.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// ---- W8A16: e4m3 weights with 128x128 fp32 block scales, bf16 x

constexpr int kRowsF8 = 4;  // W rows per warp: 4 independent 16-byte loads per lane per step (all in one 128-row
                            // scale block, since warps start on multiples of 4)

__device__ __forceinline__ void unpack_e4m3x16(const uint4& v, float (&f)[16]) {
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

template <int M, bool kOutF32>
__global__ void __launch_bounds__(kThreads) gemv_w8a16_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                                              const float* __restrict__ w_scale, int scale_pitch,
                                                              void* __restrict__ out, int N, int K16) {
  const int lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + threadIdx.x / 32) * kRowsF8;
  if (n0 >= N) return;  // whole warps exit together
  float acc[kRowsF8][M];
#pragma unroll
  for (int r = 0; r < kRowsF8; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const uint4* wr[kRowsF8];
#pragma unroll
  for (int r = 0; r < kRowsF8; ++r) wr[r] = w + static_cast<int64_t>(min(n0 + r, N - 1)) * K16;  // tail rows re-read
  const float* srow = w_scale + static_cast<int64_t>(n0 / 128) * scale_pitch;
  const int K8 = 2 * K16;
#pragma unroll 2
  for (int c = lane; c < K16; c += 32) {
    uint4 wv[kRowsF8];
#pragma unroll
    for (int r = 0; r < kRowsF8; ++r) wv[r] = __ldcs(wr[r] + c);
    const float s = __ldg(srow + c / 8);  // 8 chunks of 16 per 128-wide K block
    float xf[M][16];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float lo[8], hi[8];
      unpack_bf16x8(__ldg(x + static_cast<int64_t>(m) * K8 + 2 * c), lo);
      unpack_bf16x8(__ldg(x + static_cast<int64_t>(m) * K8 + 2 * c + 1), hi);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        xf[m][j] = lo[j];
        xf[m][8 + j] = hi[j];
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsF8; ++r) {
      float wf[16];
      unpack_e4m3x16(wv[r], wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) d = fmaf(wf[j], xf[m][j], d);
        acc[r][m] = fmaf(s, d, acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsF8; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRowsF8; ++r) {
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
void launch_w8a16_m(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32,
                    int N, int K, cudaStream_t s) {
  const int warps = (N + kRowsF8 - 1) / kRowsF8;
  const dim3 grid((warps + kWarps - 1) / kWarps);
  const auto* xv = static_cast<const uint4*>(x);
  const auto* wv = static_cast<const uint4*>(w);
  if (out_f32) {
    gemv_w8a16_kernel<M, true><<<grid, kThreads, 0, s>>>(xv, wv, w_scale, scale_pitch, out, N, K / 16);
  } else {
    gemv_w8a16_kernel<M, false><<<grid, kThreads, 0, s>>>(xv, wv, w_scale, scale_pitch, out, N, K / 16);
  }
}

}  // namespace

void gemv_w8a16(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int M,
                int N, int K, CUstream_st* stream) {
  CHECK(M >= 1 && M <= kGemvMaxRows && K % 128 == 0 && N >= 1 && scale_pitch >= K / 128,
        "gemv_w8a16: M={} N={} K={} scale_pitch={} unsupported", M, N, K, scale_pitch);
  switch (M) {
    case 1: launch_w8a16_m<1>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream); break;
    case 2: launch_w8a16_m<2>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream); break;
    case 3: launch_w8a16_m<3>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream); break;
    default: launch_w8a16_m<4>(x, w, w_scale, scale_pitch, out, out_f32, N, K, stream); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

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
