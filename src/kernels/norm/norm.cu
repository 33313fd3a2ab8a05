// RMSNorm kernels: one block per token row, 16-byte vectors of 8 bf16 held in registers between the sum of squares
// and the scaling (one read of x, one write of y; the fused variant also reads and writes the residual once). The
// row code is shared with the kernels that fuse a norm (rmsnorm_row.cuh), so they write the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/norm/norm.h"
#include "kernels/norm/rmsnorm_row.cuh"

namespace ds::norm {

namespace {

using bf16 = __nv_bfloat16;

// One block per row, in the shared row layout (rmsnorm_row.cuh). kAdd: the row is bf16(residual + x), stored
// back into the residual as it is read.
template <bool kAdd>
__global__ void __launch_bounds__(dev::kRowMaxThreads) rmsnorm_kernel(const bf16* __restrict__ x, int64_t x_stride,
                                                                      bf16* __restrict__ residual,
                                                                      const bf16* __restrict__ w, bf16* y, int D,
                                                                      float eps) {
  __shared__ float part[32];
  const int64_t t = blockIdx.x;
  // Programmatic dependent launch: the block is resident before its predecessor ends, and the next kernel (a
  // weight-streaming GEMV) may start prefetching its weights while this one runs.
  pdl::wait();
  pdl::launch_dependents();
  // x is the predecessor's output: read through L2, never the non-coherent path that `const __restrict__` allows
  // the compiler (kernels/common/pdl.cuh).
  const uint4* xr = reinterpret_cast<const uint4*>(x + t * x_stride);
  if constexpr (kAdd) {
    dev::add_rmsnorm_row(xr, reinterpret_cast<uint4*>(residual + t * D), w, y + t * D, D, eps, part);
  } else {
    dev::rmsnorm_row([&](int i) { return __ldcg(xr + i); }, w, y + t * D, D, eps, part);
  }
}

// The single dispatch point: dev::row_threads(D) threads per row.
template <bool kAdd>
void launch(const bf16_t* x, int64_t x_stride, bf16_t* residual, const bf16_t* w, bf16_t* y, int T, int D, float eps,
            cudaStream_t stream) {
  CUDA_CHECK(pdl::launch(true, rmsnorm_kernel<kAdd>, T, dev::row_threads(D), 0, stream,
                         reinterpret_cast<const bf16*>(x), x_stride, reinterpret_cast<bf16*>(residual),
                         reinterpret_cast<const bf16*>(w), reinterpret_cast<bf16*>(y), D, eps));
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
