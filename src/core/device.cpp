// Device discovery; the only place the no-GPU case is decided (tests use it to skip).
#include "core/device.h"

#ifdef DELTASERVE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ds {

bool cuda_device_available() {
#ifdef DELTASERVE_WITH_CUDA
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
#else
  return false;
#endif
}

int cuda_device_arch() {
#ifdef DELTASERVE_WITH_CUDA
  if (!cuda_device_available()) return 0;
  int dev = 0, maj = 0, min = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&min, cudaDevAttrComputeCapabilityMinor, dev);
  return maj * 10 + min;
#else
  return 0;
#endif
}

std::string cuda_device_name() {
#ifdef DELTASERVE_WITH_CUDA
  if (!cuda_device_available()) return "none";
  cudaDeviceProp p{};
  int dev = 0;
  cudaGetDevice(&dev);
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "unknown";
  return p.name;
#else
  return "none (built without CUDA)";
#endif
}

}  // namespace ds
