// What the GEMM and MLA benchmarks share: random bf16 fills on the device, uploads, and the timing loop (CUDA
// events, warm-up, median of `samples` samples of `inner` calls).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda_utils.h"
#include "core/device.h"

namespace ds::bench {

// Uniform values in [-scale/2, scale/2) as bf16 bits, from a hash of the index (no host round trip).
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    const float v = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * scale;
    p[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}
inline void fill(DeviceBuffer& b, size_t n, uint32_t seed, float scale) {
  fill_bf16<<<1024, 256>>>(b.get<uint16_t>(), n, seed, scale);
  CUDA_CHECK_LAUNCH();
}

// Median milliseconds per call of fn(i) (i counts calls, for buffer rotation).
template <class F>
double time_ms(F&& fn, int inner = 10, int samples = 15) {
  for (int i = 0; i < 3; ++i) fn(i);
  CudaEvent a, b;
  std::vector<double> t;
  int k = 0;
  for (int s = 0; s < samples; ++s) {
    a.record(nullptr);
    for (int i = 0; i < inner; ++i) fn(k++);
    b.record(nullptr);
    t.push_back(b.elapsed_since(a) / inner);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device-to-device copy of 1 GiB, bytes read + written (core/device.h: the one measurement every figure uses).
inline double copy_bandwidth_gbs() { return ds::cuda_copy_bandwidth() / 1e9; }

}  // namespace ds::bench
