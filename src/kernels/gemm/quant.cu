// FP8 e4m3 quantisers: activations with 1x128 per-token-group scales (per step) and weights with 128x128 block
// scales (load time). scale = max(amax, kAmaxFloor) / 448, code = e4m3_satfinite(x / scale) — the same
// arithmetic as gemm_ref.cpp, so the CPU reference reproduces the codes bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_detail.h"

namespace ds::gemm {

namespace {

constexpr detail::Fp8Layout kCfg = detail::kVerifiedFp8Layout;

__device__ __forceinline__ uint16_t to_e4m3x2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// Quantises 8 values with one scale into 8 bytes.
__device__ __forceinline__ uint2 quant8(const float (&v)[8], float scale) {
  uint2 r;
  r.x = to_e4m3x2(v[0] / scale, v[1] / scale) | (uint32_t{to_e4m3x2(v[2] / scale, v[3] / scale)} << 16);
  r.y = to_e4m3x2(v[4] / scale, v[5] / scale) | (uint32_t{to_e4m3x2(v[6] / scale, v[7] / scale)} << 16);
  return r;
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// One half-warp per (token m, 128-wide group kb): 16 lanes x 8 bf16 (one 16-byte load each), amax over the
// half-warp with 4 shuffles. 256 threads = 16 groups per block.
__global__ void __launch_bounds__(256) quant_act_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride,
                                                        uint8_t* __restrict__ q, float* __restrict__ scale, int M,
                                                        int K) {
  const int KB = K / kFp8Block;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * 16 + threadIdx.x / 16;
  const int lane = threadIdx.x % 16;
  if (g >= static_cast<int64_t>(M) * KB) return;  // whole half-warps exit together: the shuffles stay full
  const int m = static_cast<int>(g / KB), kb = static_cast<int>(g % KB);
  const uint4 raw = *reinterpret_cast<const uint4*>(x + m * x_stride + kb * kFp8Block + lane * 8);
  float v[8];
  unpack8(raw, v);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fmaxf(amax, kAmaxFloor) / kE4M3Max;
  *reinterpret_cast<uint2*>(q + static_cast<int64_t>(m) * K + kb * kFp8Block + lane * 8) = quant8(v, s);
  if (lane == 0) scale[kCfg.x_scale_k_major ? static_cast<int64_t>(m) * KB + kb : static_cast<int64_t>(kb) * M + m] = s;
}

// One block per 128x128 weight tile: 256 threads, each 8 rows x 8 columns (rows r0 + 16 i, i < 8).
__global__ void __launch_bounds__(256) quant_weight_kernel(const __nv_bfloat16* __restrict__ w,
                                                           uint8_t* __restrict__ q, float* __restrict__ scale, int N,
                                                           int K, int KBp) {
  const int kb = blockIdx.x, nb = blockIdx.y, NB = gridDim.y;
  const int col = kb * kFp8Block + (threadIdx.x % 16) * 8, r0 = nb * kFp8Block + threadIdx.x / 16;
  float v[8][8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + 16 * i;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (r < N) raw = *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r) * K + col);
    unpack8(raw, v[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[i][j]));
  }
  __shared__ float warp_max[8];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) amax = fmaxf(amax, warp_max[i]);
  const float s = fmaxf(amax, kAmaxFloor) / kE4M3Max;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + 16 * i;
    if (r < N) *reinterpret_cast<uint2*>(q + static_cast<int64_t>(r) * K + col) = quant8(v[i], s);
  }
  if (threadIdx.x == 0) scale[kCfg.w_scale_n_major ? static_cast<int64_t>(kb) * NB + nb : static_cast<int64_t>(nb) * KBp + kb] = s;
}

}  // namespace

void quantize_act_fp8(const QuantActParams& p, CUstream_st* stream) {
  CHECK(p.x && p.q && p.scale, "quantize_act_fp8: null pointer");
  CHECK(p.M >= 0 && p.K > 0 && p.K % kFp8Block == 0, "quantize_act_fp8: M={} K={} (K % 128 == 0)", p.M, p.K);
  CHECK(p.x_stride >= p.K && p.x_stride % 8 == 0 && aligned16(p.x),
        "quantize_act_fp8: x rows must be 16-byte aligned (stride {})", p.x_stride);
  const int64_t groups = static_cast<int64_t>(p.M) * (p.K / kFp8Block);
  if (groups == 0) return;
  quant_act_kernel<<<static_cast<unsigned>((groups + 15) / 16), 256, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.x), p.x_stride, p.q, p.scale, p.M, p.K);
  CUDA_CHECK_LAUNCH();
}

void quantize_weight_fp8(const QuantWeightParams& p, CUstream_st* stream) {
  CHECK(p.w && p.q && p.scale, "quantize_weight_fp8: null pointer");
  CHECK(p.N > 0 && p.K > 0 && p.K % kFp8Block == 0, "quantize_weight_fp8: N={} K={} (K % 128 == 0)", p.N, p.K);
  const dim3 grid(p.K / kFp8Block, (p.N + kFp8Block - 1) / kFp8Block);
  // The row pad columns are never read as scales, but zero them so the buffer is fully defined.
  const int64_t pitch = p.scale_pitch > 0 ? p.scale_pitch : w_scale_cols(p.K);
  CHECK(pitch >= p.K / kFp8Block, "quantize_weight_fp8: scale_pitch {} < K/128 = {}", pitch, p.K / kFp8Block);
  CUDA_CHECK(cudaMemsetAsync(p.scale, 0, sizeof(float) * grid.y * pitch, stream));
  quant_weight_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(p.w), p.q, p.scale, p.N,
                                                p.K, static_cast<int>(pitch));
  CUDA_CHECK_LAUNCH();
}

}  // namespace ds::gemm
