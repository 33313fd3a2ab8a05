// One RMSNorm row inside a block, in the one thread layout and reduction order every fused user shares, so a
// norm fused into another kernel (the MoE down kernel's last block, the decode GEMV's prologue) writes exactly
// norm::rmsnorm's bits:
//   - nt = row_threads(D) = min(256, D/8 rounded up to a warp) threads; thread t holds 16-byte vectors
//     t, t + nt, ... (at most kMaxVpt), squares summed in that order;
//   - block sum: xor tree in each warp, then warp 0's xor tree over the warp sums (zeros past the last warp);
//   - y = bf16(w * (x * rsqrt(sum / D + eps))).
// Every thread of the block calls it (threads >= nt only join the barriers); blockDim.x >= nt.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::norm::dev {

inline constexpr int kRowMaxThreads = 256, kRowMaxVpt = 4;  // D <= 8192

__host__ __device__ constexpr int row_threads(int D) {
  const int nvec = D / 8, t = (nvec + 31) / 32 * 32;
  return t < kRowMaxThreads ? t : kRowMaxThreads;
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(u[i] << 16);
    v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint4 raw;
  uint32_t* o = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    o[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return raw;
}

// bf16(residual + x) of 8 values: the layer boundary's residual add, rounded once (what the add + norm kernel
// stores as the new residual and norms).
__device__ __forceinline__ uint4 add8(const uint4& x, const uint4& residual) {
  float a[8], r[8];
  unpack8(x, a);
  unpack8(residual, r);
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = r[k] + a[k];
  return pack8(a);
}

// The block's sum of v (the order above). `part`: 32 floats of shared memory, free on entry.
__device__ __forceinline__ float row_block_sum(float v, float* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (blockDim.x + 31) / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // part[] may be reused right after
  return v;
}

// y[0, D) = RMSNorm(x) * w. Load(i) returns x's 16-byte vector i (the caller picks the cache path: x may have
// been written by another block of the same kernel); y may be global or shared memory. kKeep: the row stays in
// registers between the two passes (one load per vector; Load may have side effects); else Load is called again
// for the scaling pass (a kernel whose main loop needs the registers: the fused decode GEMV).
template <bool kKeep = true, class Load>
__device__ __forceinline__ void rmsnorm_row(Load load, const __nv_bfloat16* w, __nv_bfloat16* y, int D, float eps,
                                            float* part) {
  const int nvec = D / 8, nt = row_threads(D), t = threadIdx.x;
  float v[kKeep ? kRowMaxVpt : 1][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowMaxVpt; ++j) {
    const int i = t + j * nt;
    if (t >= nt || i >= nvec) continue;
    float(&r)[8] = v[kKeep ? j : 0];
    unpack8(load(i), r);
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += r[k] * r[k];
  }
  const float rinv = rsqrtf(row_block_sum(ss, part) / D + eps);
#pragma unroll
  for (int j = 0; j < kRowMaxVpt; ++j) {
    const int i = t + j * nt;
    if (t >= nt || i >= nvec) continue;
    float(&r)[8] = v[kKeep ? j : 0];
    if constexpr (!kKeep) unpack8(load(i), r);
    float wv[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(w) + i), wv);
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = wv[k] * (r[k] * rinv);
    reinterpret_cast<uint4*>(y)[i] = pack8(r);
  }
}

// The layer boundary on one row: residual[0, D) = bf16(residual + x), y = RMSNorm(residual) * w (norm::add_rmsnorm's
// bits). x and residual are read through L2: x is another kernel's (or block's) output, and the row is read once.
__device__ __forceinline__ void add_rmsnorm_row(const uint4* x, uint4* residual, const __nv_bfloat16* w,
                                                __nv_bfloat16* y, int D, float eps, float* part) {
  auto load = [&](int i) {
    const uint4 sum = add8(__ldcg(x + i), __ldcg(residual + i));  // the stored residual, rounded once
    residual[i] = sum;
    return sum;
  };
  rmsnorm_row(load, w, y, D, eps, part);
}

}  // namespace ds::norm::dev
