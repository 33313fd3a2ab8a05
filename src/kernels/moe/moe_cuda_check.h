// fmt-free CUDA error checks for the MoE .cu files (core/cuda_utils.h pulls in fmt, whose consteval format
// strings nvcc rejects in C++20 translation units); the thrower lives in moe_dispatch.cpp and raises ds::Error.
#pragma once

#include <cuda_runtime.h>

namespace ds::moe::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
}  // namespace ds::moe::detail

#define MOE_CUDA_CHECK(expr)                                                               \
  do {                                                                                     \
    const cudaError_t moe_e_ = (expr);                                                     \
    if (moe_e_ != cudaSuccess) ::ds::moe::detail::throw_cuda_error(moe_e_, #expr, __FILE__, __LINE__); \
  } while (0)
// After every launch: a bad configuration is reported at its launch site.
#define MOE_CHECK_LAUNCH() MOE_CUDA_CHECK(cudaGetLastError())
