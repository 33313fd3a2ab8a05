// Dynamic shared memory above 48 KB needs an opt-in per kernel (cudaFuncSetAttribute), and the opt-in holds only
// on the device that was current when it was made: each device's context has its own copy of the kernel. A
// process-wide "once" leaves every other device of a multi-GPU process (a TEP rank is a thread on a device of its
// own) at 48 KB, where those launches fail. PerDeviceOnce runs a set-up once per device instead.
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

 private:
  std::mutex m_;
  std::array<std::atomic<bool>, kMaxDevices> done_{};
};

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device (`once` is the
// call site's: one per kernel).
template <class Kernel>
cudaError_t opt_in_dynamic_smem(PerDeviceOnce& once, Kernel kernel, size_t bytes) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  return once.run(dev, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  });
}

}  // namespace ds
