// Set-ups and values that belong to one device. A process-wide static (a kernel's shared-memory opt-in, an SM
// count, an occupancy) is right for the one device that was current when it was made: a multi-GPU process (a TEP
// rank is a thread on a device of its own) needs them per device, and a host with mixed GPUs needs the values too.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

namespace ds {

class PerDeviceOnce {
 public:
  static constexpr int kMaxDevices = 64;
  // Runs set() (returning cudaError_t) the first time device `dev` asks; concurrent callers wait for it. A failure
  // is returned and tried again on the next call; a device outside [0, kMaxDevices) gets cudaErrorInvalidDevice.
  template <class Set>
  cudaError_t run(int dev, Set&& set) {
    if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
    if (done_[dev].load(std::memory_order_acquire)) return cudaSuccess;
    const std::lock_guard<std::mutex> lock(m_);
    if (done_[dev].load(std::memory_order_relaxed)) return cudaSuccess;
    const cudaError_t e = set();
    if (e == cudaSuccess) done_[dev].store(true, std::memory_order_release);
    return e;
  }
  // The same for the current device.
  template <class Set>
  cudaError_t run(Set&& set) {
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    return run(dev, set);
  }

 private:
  std::mutex m_;
  std::array<std::atomic<bool>, kMaxDevices> done_{};
};

// A value computed once per device (an SM count, an occupancy, an arch), read lock-free afterwards.
template <class T>
class PerDeviceValue {
 public:
  // Sets `out` to device `dev`'s value, running compute(dev, T&) -> cudaError_t the first time that device asks.
  // A failure is returned (out untouched) and computed again on the next call.
  template <class Compute>
  cudaError_t get(int dev, T& out, Compute&& compute) {
    const cudaError_t e = once_.run(dev, [&] { return compute(dev, values_[dev]); });
    if (e == cudaSuccess) out = values_[dev];
    return e;
  }
  // The same for the current device.
  template <class Compute>
  cudaError_t get(T& out, Compute&& compute) {
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    return get(dev, out, compute);
  }

 private:
  PerDeviceOnce once_;
  std::array<T, PerDeviceOnce::kMaxDevices> values_{};
};

// The current device's SM count, read once per device.
inline cudaError_t current_device_sms(int& out) {
  static PerDeviceValue<int> cache;
  return cache.get(out,
                   [](int dev, int& v) { return cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev); });
}

}  // namespace ds
