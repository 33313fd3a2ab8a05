// Small elementwise CUDA ops: SwiGLU product on the packed [gate ; up] output, column-slice copy, random fill.
// Each op has a 16-byte vector path (8 bf16 per access) and a scalar path for shapes and pointers that do not
// allow it; the host picks one per call from the shapes and pointer alignment.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/util/fill_value.h"
#include "kernels/util/util.h"

namespace ds::util {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill an H200 (132 SMs x 8 resident blocks of 256) several times over.
constexpr int64_t kMaxBlocks = 132 * 8 * 8;


unsigned blocks_for(int64_t work) { return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void __launch_bounds__(kThreads) silu_mul_vec_kernel(const __nv_bfloat16* __restrict__ x, int64_t xs,
                                                                __nv_bfloat16* __restrict__ y, int64_t ys, int T,
                                                                int I) {
  const int64_t per_row = I / 8, total = per_row * T;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = g / per_row, c = (g % per_row) * 8;
    const uint4 gr = *reinterpret_cast<const uint4*>(x + t * xs + c);
    const uint4 ur = *reinterpret_cast<const uint4*>(x + t * xs + I + c);
    const __nv_bfloat162* gh = reinterpret_cast<const __nv_bfloat162*>(&gr);
    const __nv_bfloat162* uh = reinterpret_cast<const __nv_bfloat162*>(&ur);
    uint4 out;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 gf = __bfloat1622float2(gh[j]), uf = __bfloat1622float2(uh[j]);
      oh[j] = __floats2bfloat162_rn(silu_mul1(gf.x, uf.x), silu_mul1(gf.y, uf.y));
    }
    *reinterpret_cast<uint4*>(y + t * ys + c) = out;
  }
}

__global__ void __launch_bounds__(kThreads) silu_mul_scalar_kernel(const __nv_bfloat16* __restrict__ x, int64_t xs,
                                                                   __nv_bfloat16* __restrict__ y, int64_t ys, int T,
                                                                   int I) {
  const int64_t total = static_cast<int64_t>(T) * I;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / I, i = e % I;
    y[t * ys + i] = __float2bfloat16_rn(silu_mul1(__bfloat162float(x[t * xs + i]), __bfloat162float(x[t * xs + I + i])));
  }
}

__global__ void __launch_bounds__(kThreads) copy_columns_vec_kernel(const __nv_bfloat16* __restrict__ src,
                                                                    int64_t ss, __nv_bfloat16* __restrict__ dst,
                                                                    int64_t ds, int T, int cols) {
  const int64_t per_row = cols / 8, total = per_row * T;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = g / per_row, c = (g % per_row) * 8;
    *reinterpret_cast<uint4*>(dst + t * ds + c) = *reinterpret_cast<const uint4*>(src + t * ss + c);
  }
}

__global__ void __launch_bounds__(kThreads) copy_columns_scalar_kernel(const uint16_t* __restrict__ src, int64_t ss,
                                                                       uint16_t* __restrict__ dst, int64_t ds, int T,
                                                                       int cols) {
  const int64_t total = static_cast<int64_t>(T) * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / cols, c = e % cols;
    dst[t * ds + c] = src[t * ss + c];
  }
}

template <class T> __device__ __forceinline__ T cvt(float v);
template <> __device__ __forceinline__ float cvt<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 cvt<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Thread g owns elements [8g, 8g + 8): one 16-byte store for bf16 (two for f32) when `vec` and the group is
// whole; the values depend only on the element index.
template <class T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* __restrict__ out, int64_t n, detail::FillArgs f, bool vec) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * 8;
    if (vec && i0 + 8 <= n) {
      alignas(16) T v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = cvt<T>(detail::fill_value(f, i0 + j));
      uint4* dst = reinterpret_cast<uint4*>(out + i0);
      const uint4* src = reinterpret_cast<const uint4*>(v);
#pragma unroll
      for (int j = 0; j < static_cast<int>(8 * sizeof(T) / 16); ++j) dst[j] = src[j];
    } else {
      for (int64_t i = i0; i < n && i < i0 + 8; ++i) out[i] = cvt<T>(detail::fill_value(f, i));
    }
  }
}

}  // namespace

void silu_mul(const SiluMulParams& p, CUstream_st* stream) {
  const int64_t ys = p.y_stride ? p.y_stride : p.I;
  CHECK(p.T >= 0 && p.I >= 0, "silu_mul: T = {}, I = {}", p.T, p.I);
  if (p.T == 0 || p.I == 0) return;
  CHECK(p.x && p.y, "silu_mul: null pointer");
  CHECK(p.x_stride >= 2 * static_cast<int64_t>(p.I) && ys >= p.I, "silu_mul: x_stride {} < 2I = {} or y_stride {} < I",
        p.x_stride, 2 * static_cast<int64_t>(p.I), ys);
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* y = reinterpret_cast<__nv_bfloat16*>(p.y);
  const bool vec = p.I % 8 == 0 && p.x_stride % 8 == 0 && ys % 8 == 0 && aligned16(p.x) && aligned16(p.y);
  if (vec) {
    silu_mul_vec_kernel<<<blocks_for(static_cast<int64_t>(p.T) * (p.I / 8)), kThreads, 0, stream>>>(x, p.x_stride, y, ys,
                                                                                                     p.T, p.I);
  } else {
    silu_mul_scalar_kernel<<<blocks_for(static_cast<int64_t>(p.T) * p.I), kThreads, 0, stream>>>(x, p.x_stride, y, ys,
                                                                                                p.T, p.I);
  }
  CUDA_CHECK_LAUNCH();
}

void copy_columns(const CopyColumnsParams& p, CUstream_st* stream) {
  CHECK(p.T >= 0 && p.cols >= 0 && p.col0 >= 0, "copy_columns: T = {}, col0 = {}, cols = {}", p.T, p.col0, p.cols);
  if (p.T == 0 || p.cols == 0) return;
  CHECK(p.src && p.dst, "copy_columns: null pointer");
  CHECK(p.src_stride >= static_cast<int64_t>(p.col0) + p.cols && p.dst_stride >= p.cols,
        "copy_columns: columns [{}, {}) outside src_stride {} or dst_stride {} < cols", p.col0, p.col0 + p.cols,
        p.src_stride, p.dst_stride);
  const bf16_t* src = p.src + p.col0;
  const bool vec = p.cols % 8 == 0 && p.src_stride % 8 == 0 && p.dst_stride % 8 == 0 && aligned16(src) && aligned16(p.dst);
  if (vec) {
    copy_columns_vec_kernel<<<blocks_for(static_cast<int64_t>(p.T) * (p.cols / 8)), kThreads, 0, stream>>>(
        reinterpret_cast<const __nv_bfloat16*>(src), p.src_stride, reinterpret_cast<__nv_bfloat16*>(p.dst), p.dst_stride,
        p.T, p.cols);
  } else {
    copy_columns_scalar_kernel<<<blocks_for(static_cast<int64_t>(p.T) * p.cols), kThreads, 0, stream>>>(
        reinterpret_cast<const uint16_t*>(src), p.src_stride, reinterpret_cast<uint16_t*>(p.dst), p.dst_stride, p.T,
        p.cols);
  }
  CUDA_CHECK_LAUNCH();
}

void fill_random(const FillParams& p, CUstream_st* stream) {
  CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF32, "fill_random: dtype {} (bf16 or f32)", dtype_name(p.dtype));
  CHECK(p.n >= 0 && p.grid >= 0, "fill_random: n = {}, grid = {}", p.n, p.grid);
  if (p.n == 0) return;
  CHECK(p.out, "fill_random: null output");
  const detail::FillArgs f = detail::fill_args(p);
  const int64_t groups = (p.n + 7) / 8;
  const unsigned grid = p.grid > 0 ? static_cast<unsigned>(p.grid) : blocks_for(groups);
  const bool vec = aligned16(p.out);
  if (p.dtype == DType::kBF16)
    fill_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(p.out), p.n, f, vec);
  else
    fill_kernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(p.out), p.n, f, vec);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ds::util
