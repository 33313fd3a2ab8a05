// Dynamic shared memory above 48 KB needs an opt-in per kernel (cudaFuncSetAttribute), and the opt-in holds only
// on the device that was current when it was made: each device's context has its own copy of the kernel. A
// process-wide "once" leaves every other device of a multi-GPU process (a TEP rank is a thread on a device of its
// own) at 48 KB, where those launches fail. PerDeviceOnce runs a set-up once per device instead.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/per_device.h"

namespace ds {

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device (`once` is the
// call site's: one per kernel). Never key such a static by the kernel's type: every instantiation of a kernel
// template has the same function-pointer type, so one static would serve them all and only the first would opt
// in (the staged MoE kernels' first GPU run, docs/perf-moe.md run 22).
template <class Kernel>
cudaError_t opt_in_dynamic_smem(PerDeviceOnce& once, Kernel kernel, size_t bytes) {
  return once.run([&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  });
}

}  // namespace ds
