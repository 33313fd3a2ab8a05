// Shared-memory mbarriers (sm_90) and the asynchronous copies that complete on them: bulk copies and tensor
// copies (the TMA unit) and cp.async. Used by the KDA prefill scan (bulk factor tiles) and the warp-specialised
// FP8 MoE prefill GEMM (a producer warpgroup filling a stage ring for two consumer warpgroups).
//
// One mbarrier per buffer: a thread posts the bytes it expects (arrive + expect_tx), any threads issue the copies
// (they complete their bytes on the barrier), and every consumer waits on the phase's parity. The tx-count may go
// below zero while copies land before the expect_tx is posted: the phase still needs the arrival.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::mbar {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// After mbar_init and before the __syncthreads that publishes it: makes the init visible to the async proxy.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
// An arrival with no bytes expected (completes the phase of a buffer that gets no copy this time).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// An arrival that fires once every cp.async this thread issued before it has landed (the barrier's expected count
// includes it: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Spins until the phase with this parity (0, 1, 0, ... for successive fills) has completed; acquire semantics,
// so the landed bytes are visible to the waiting thread. A fresh barrier counts parity 1 as completed (the phase
// before its first). Lanes may leave at different times: callers that go on to .sync.aligned instructions
// (ldmatrix, mma, wgmma) must __syncwarp() first.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16) from global to shared memory, both 16-byte aligned; completes on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// One box of a 3D tensor map (coordinates innermost first) to shared address dst; completes on bar. The map is a
// __grid_constant__ kernel parameter (its generic address is what the instruction takes).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

}  // namespace ds::mbar
