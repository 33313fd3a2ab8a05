// fmt-free CUDA error checks for the KDA .cu files. core/cuda_utils.h pulls in fmt, whose consteval format
// strings nvcc 13 + g++ 13 (the GPU machine) reject in C++20 device translation units; these macros only
// call out to host code compiled by the C++ compiler (kda_dispatch.cpp), which throws ds::Error.
#pragma once

#include <cuda_runtime.h>

namespace ds::kda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_no_compact_instantiation(int num_heads);
// Throws unless (vtiles, stages) is a scan configuration or (0, 0) (kda_prefill_unsupported's message).
void check_forced_scan_config(int vtiles, int stages);
// SM count of the current device (the persistent-style launchers size their grids by it).
int current_device_sm_count();
// The loader a launch takes for KdaPrefillParams::scan_loader (0: the default); throws on an unknown value.
int scan_loader_of(int requested);
// The SiLU form the intra kernel takes for KdaPrefillParams::intra_silu (0: the default); throws on an unknown value.
int intra_silu_of(int requested);
}  // namespace ds::kda::detail

#define KDA_CUDA_CHECK(expr)                                                                        \
  do {                                                                                              \
    const cudaError_t kda_e_ = (expr);                                                              \
    if (kda_e_ != cudaSuccess) ::ds::kda::detail::throw_cuda_error(kda_e_, #expr, __FILE__, __LINE__); \
  } while (0)
#define KDA_CHECK_LAUNCH() KDA_CUDA_CHECK(cudaGetLastError())
