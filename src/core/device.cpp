// Device discovery; the only place the no-GPU case is decided (tests use it to skip).
#include "core/device.h"

#include <algorithm>
#include <vector>

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

double cuda_copy_bandwidth(size_t bytes) {
#ifdef DELTASERVE_WITH_CUDA
  if (!cuda_device_available() || bytes == 0) return 0;
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double result = 0;
  // Every resource is released on every path below; a failure gives 0, not an exception: callers fall back.
  bool ok = cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess &&
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
            cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
            cudaMemsetAsync(src, 1, bytes, s) == cudaSuccess;
  std::vector<float> ms;
  for (int i = 0; ok && i < 11; ++i) {
    float t = 0;
    ok = cudaEventRecord(e0, s) == cudaSuccess &&
         cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess &&
         cudaEventRecord(e1, s) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
         cudaEventElapsedTime(&t, e0, e1) == cudaSuccess;
    if (ok && i >= 2) ms.push_back(t);  // the first two are warm-up
  }
  if (ok && !ms.empty()) {
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    const double median_ms = ms[ms.size() / 2];
    if (median_ms > 0) result = 2.0 * static_cast<double>(bytes) / (median_ms * 1e-3);
  }
  if (e1) cudaEventDestroy(e1);
  if (e0) cudaEventDestroy(e0);
  if (s) cudaStreamDestroy(s);
  if (dst) cudaFree(dst);
  if (src) cudaFree(src);
  cudaGetLastError();  // a failed allocation's error must not stick to the caller's next call
  return result;
#else
  (void)bytes;
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
