// RMSNorm kernels: one block per token row, 16-byte vectors of 8 bf16 held in registers between the sum of squares
// and the scaling (one read of x, one write of y; the fused variant also reads and writes the residual once).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/norm/norm.h"

namespace ds::norm {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void load8(const bf16* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
  uint4 raw;
  uint32_t* o = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    o[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = raw;
}

// Block-wide sum (deterministic order: warp tree, then warp 0 over the warp sums).
__device__ float block_sum(float v) {
  __shared__ float part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (blockDim.x + 31) / 32;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// VPT vectors of 8 values per thread: vector i of the row is handled by thread i % blockDim, slot i / blockDim.
template <int VPT, bool kAdd>
__global__ void __launch_bounds__(256) rmsnorm_kernel(const bf16* __restrict__ x, int64_t x_stride,
                                                      bf16* __restrict__ residual, const bf16* __restrict__ w,
                                                      bf16* __restrict__ y, int D, float eps) {
  const int64_t t = blockIdx.x;
  const int nvec = D / 8;
  // Programmatic dependent launch: the block is resident before its predecessor ends, and the next kernel (a
  // weight-streaming GEMV) may start prefetching its weights while this one runs.
  pdl::wait();
  pdl::launch_dependents();
  float v[VPT][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= nvec) continue;
    load8(x + t * x_stride + i * 8, v[j]);
    if constexpr (kAdd) {
      float r[8];
      bf16* rp = residual + t * D + i * 8;
      load8(rp, r);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[j][k] = __bfloat162float(__float2bfloat16(r[k] + v[j][k]));  // stored residual
      store8(rp, v[j]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += v[j][k] * v[j][k];
  }
  const float rinv = rsqrtf(block_sum(ss) / D + eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= nvec) continue;
    float wv[8];
    load8(w + i * 8, wv);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[j][k] = wv[k] * (v[j][k] * rinv);
    store8(y + t * D + i * 8, v[j]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The single dispatch point: VPT from D (threads = min(256, D/8 rounded up to a warp)).
template <bool kAdd>
void launch(const bf16_t* x, int64_t x_stride, bf16_t* residual, const bf16_t* w, bf16_t* y, int T, int D, float eps,
            cudaStream_t stream) {
  const int nvec = D / 8;
  const int threads = std::min(256, (nvec + 31) / 32 * 32);
  const int vpt = (nvec + threads - 1) / threads;
  auto* xb = reinterpret_cast<const bf16*>(x);
  auto* rb = reinterpret_cast<bf16*>(residual);
  auto* wb = reinterpret_cast<const bf16*>(w);
  auto* yb = reinterpret_cast<bf16*>(y);
  switch (vpt) {
    case 1: CUDA_CHECK(pdl::launch(true, rmsnorm_kernel<1, kAdd>, T, threads, 0, stream, xb, x_stride, rb, wb, yb, D, eps)); break;
    case 2: CUDA_CHECK(pdl::launch(true, rmsnorm_kernel<2, kAdd>, T, threads, 0, stream, xb, x_stride, rb, wb, yb, D, eps)); break;
    case 3: CUDA_CHECK(pdl::launch(true, rmsnorm_kernel<3, kAdd>, T, threads, 0, stream, xb, x_stride, rb, wb, yb, D, eps)); break;
    case 4: CUDA_CHECK(pdl::launch(true, rmsnorm_kernel<4, kAdd>, T, threads, 0, stream, xb, x_stride, rb, wb, yb, D, eps)); break;
    default: DS_THROW("rmsnorm: D = {} needs {} vectors per thread (max 4)", D, vpt);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm(const RmsNormParams& p, CUstream_st* stream) {
  if (auto e = rmsnorm_unsupported(p.D)) throw Error(*e);
  CHECK(p.T >= 0, "rmsnorm: T = {}", p.T);
  if (p.T == 0) return;
  CHECK(p.x && p.w && p.y, "rmsnorm: null pointer argument");
  CHECK(p.x_stride >= p.D && p.x_stride % 8 == 0 && aligned16(p.x) && aligned16(p.w) && aligned16(p.y),
        "rmsnorm: rows must be 16-byte aligned (x stride {})", p.x_stride);
  launch<false>(p.x, p.x_stride, nullptr, p.w, p.y, p.T, p.D, p.eps, stream);
}

void add_rmsnorm(const AddRmsNormParams& p, CUstream_st* stream) {
  if (auto e = rmsnorm_unsupported(p.D)) throw Error(*e);
  CHECK(p.T >= 0, "add_rmsnorm: T = {}", p.T);
  if (p.T == 0) return;
  CHECK(p.x && p.residual && p.w && p.y, "add_rmsnorm: null pointer argument");
  CHECK(aligned16(p.x) && aligned16(p.residual) && aligned16(p.w) && aligned16(p.y),
        "add_rmsnorm: operands must be 16-byte aligned");
  CHECK(static_cast<const void*>(p.y) != static_cast<const void*>(p.residual), "add_rmsnorm: y must not alias residual");
  launch<true>(p.x, p.D, p.residual, p.w, p.y, p.T, p.D, p.eps, stream);
}

}  // namespace ds::norm
