// Programmatic dependent launch (sm_90+): a kernel launched with pdl::launch() may be scheduled while its
// predecessor in the stream drains; it must call pdl::wait() before it reads anything the predecessor wrote or
// writes anything the predecessor may still read. Work that depends on neither (address arithmetic, L2
// prefetch of weights) goes before the wait: that is the overlap PDL buys. Inside CUDA graphs the dependency is
// captured as a programmatic edge. pdl::wait() is a no-op for a kernel launched without the attribute.
//
// What a kernel may read before its wait: the dependent grid starts only once every block of its predecessor
// has called launch_dependents() or exited. A predecessor that triggers only after its own wait has seen ITS
// predecessor complete, so everything written two or more kernels back is complete and visible when this kernel
// starts. Kernels that use this name it in their parameters (MoE `x_ready`, KDA decode `qkv_ready`): the caller
// sets the flag only where the launch order gives that guarantee. A kernel that triggers before its own wait
// (the KDA decode kernel) gives its successor no such guarantee.
//
// Reading the predecessor's output: load_prior() below, never the non-coherent path (__ldg, ld.global.nc). PTX
// allows .nc only for data that stays read-only for the whole life of the kernel, and a PDL kernel's life begins
// before its predecessor's last writes. H200, ninth session: the one-token fused-norm GEMV read h with __ldg after
// its wait, and under graph replay (where the overlap is tightest) the MLA fused A-GEMM of the FP8 models normed an
// old h (step logits off by up to 0.011; eager steps and runs without PDL agreed). Tenth session, one H200 call:
// with every such read .nc the race comes back (CudaForwardTiny.Fp8GraphsOnAndOff / PdlOnAndOff fail at that
// step); with load_prior (.ca) they pass and C = 1 decode is within 1 % of the .nc speed; .cg (L2 only) is 4-9 %
// slower (rows reread by many warps lose L1). Weights and other data no kernel writes may use __ldg freely.
//
// fmt-free (the MoE translation units cannot include core/cuda_utils.h): launch() returns the CUDA status and
// the caller checks it with its own macro.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/pdl_switch.h"

namespace ds::pdl {

__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// Reads what a predecessor kernel wrote (after wait()): a weak coherent load, ld.global.ca. The PTX memory model
// makes the predecessor's writes visible to those after griddepcontrol.wait; it gives .nc loads no such promise.
// L1 allocation stays, so the warps of a block that reread one activation row share it. Use it for every such
// read, including plain `*p` on a `const T* __restrict__`: nvcc turns those into ld.global.nc as well. __ldcg
// (L2 only) is also coherent: the norm kernels and the KDA decode's gz use it for rows read once, and data written
// by other blocks of the running grid (behind an arrival counter) must use it, as L1 is not coherent across SMs.
template <class T>
__device__ __forceinline__ T load_prior(const T* p) {
  return __ldca(p);
}
// Pulls the 128-byte line of p into L2 (no register, no wait): weights a kernel will stream after pdl::wait().
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Launches kernel<<<grid, block, smem, s>>>(args...) in clusters of `cluster_x` blocks along x (1: no cluster),
// allowed to overlap its predecessor when `enabled` and the process-wide switch (pdl_switch.h) is on. A refused launch (bad configuration) is returned and also
// cleared from the runtime's last error, so the caller's check reports it once and the next, unrelated launch
// check does not inherit it (H200 run: a refused gemv launch failed the following test's cudaGetLastError()).
template <class... KArgs, class... Args>
cudaError_t launch_cluster(int cluster_x, bool enabled, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = enabled && pdl::enabled() ? 1 : 0;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster_x;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster_x > 1 ? 2 : 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// The same without clusters.
template <class... KArgs, class... Args>
cudaError_t launch(bool enabled, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  return launch_cluster(1, enabled, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace ds::pdl
