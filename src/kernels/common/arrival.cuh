// "The last block finishes the op": every block of a grid arrives on a counter once its part of the output is
// stored, and the one that arrives last (it sees every other block's stores) re-arms the counter and does the
// closing work. The counter is one int32 of device memory, zero before the first launch; the next launch that uses
// it arrives only after its PDL wait, i.e. after this grid has completed, so one counter may serve every launch on
// a stream. Users: the decode GEMV's fused layer boundary, the fused router + top-k, the one-token MoE `down` with
// the next norm fused, the split sampling pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::arrival {

// Called by every thread of the block after its stores, `arrivals` blocks counting on `counter`; true in every
// thread of the last block to arrive, whose reads then see every block's stores (read them through L2: __ldcg).
// The last block re-arms the counter at once: every other block has arrived.
__device__ __forceinline__ bool last_to_arrive(int32_t* counter, int arrivals) {
  __shared__ int last;
  __threadfence();  // this block's stores are visible device-wide before it arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == arrivals - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

}  // namespace ds::arrival
