// Device discovery; the only place the no-GPU case is decided (tests use it to skip).
#include "core/device.h"

#include "core/error.h"

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

int cuda_device_count() {
#ifdef DELTASERVE_WITH_CUDA
  if (!cuda_device_available()) return 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void cuda_select_device(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n)
    DS_THROW("CUDA device {} does not exist ({} visible{})", device, n, n == 0 ? "" : fmt::format(": 0..{}", n - 1));
#ifdef DELTASERVE_WITH_CUDA
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) DS_THROW("cudaSetDevice({}) failed: {}", device, cudaGetErrorString(e));
#endif
}

}  // namespace ds
