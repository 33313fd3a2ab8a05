// The latent-cache write of one token by one warp (kv_a_layernorm RMSNorm of the 512 latent values, then k_pe
// copied), shared by cache_write_kernel and the absorb kernel's cache-write blocks (DecodeParams::write): one code,
// the same bits. Call after pdl::wait(): ckv and the slot mapping come from earlier kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/pdl.cuh"
#include "kernels/mla/mla.h"

namespace ds::mla::dev {

// The cache-write operands as one kernel argument.
struct CacheWriteArgs {
  const __nv_bfloat16* ckv = nullptr;  // token t's [c ; k_pe] at ckv + t * ckv_stride
  int64_t ckv_stride = 0;
  const __nv_bfloat16* norm_w = nullptr;
  const int64_t* slot_mapping = nullptr;
  __nv_bfloat16* cache = nullptr;  // null: nothing to write
  float eps = 0.0f;
};

// One warp per token: the 512 latent values are 64 chunks of 8 (two 16-byte loads per lane), k_pe 8 chunks
// (lanes 0-7). Sum of squares in fp32 over the warp; y = w * (x * rsqrt(mean + eps)) rounded once to bf16.
__device__ __forceinline__ void cache_write_token(const CacheWriteArgs& a, int t, int lane) {
  const int64_t slot = pdl::load_prior(a.slot_mapping + t);
  if (slot < 0) return;  // padding row: touches nothing
  const __nv_bfloat16* src = a.ckv + t * a.ckv_stride;
  __nv_bfloat16* dst = a.cache + slot * kRow;
  uint4 raw[2];
  float v[2][8];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    raw[c] = pdl::load_prior(reinterpret_cast<const uint4*>(src + (lane + 32 * c) * 8));
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[c][2 * i] = f.x;
      v[c][2 * i + 1] = f.y;
      ss += f.x * f.x + f.y * f.y;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / kLatent + a.eps);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = (lane + 32 * c) * 8;
    const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(a.norm_w + col));  // a weight
    const __nv_bfloat162* w = reinterpret_cast<const __nv_bfloat162*>(&wraw);
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 wf = __bfloat1622float2(w[i]);
      const __nv_bfloat162 y = __floats2bfloat162_rn(wf.x * (v[c][2 * i] * r), wf.y * (v[c][2 * i + 1] * r));
      o[i] = *reinterpret_cast<const uint32_t*>(&y);
    }
    *reinterpret_cast<uint4*>(dst + col) = out;
  }
  if (lane < kRope / 8)
    *reinterpret_cast<uint4*>(dst + kLatent + lane * 8) =
        pdl::load_prior(reinterpret_cast<const uint4*>(src + kLatent + lane * 8));
}

inline CacheWriteArgs cache_write_args(const CacheWriteParams& p) {
  return {reinterpret_cast<const __nv_bfloat16*>(p.ckv), p.ckv_stride,
          reinterpret_cast<const __nv_bfloat16*>(p.norm_w), p.slot_mapping,
          reinterpret_cast<__nv_bfloat16*>(p.cache), p.eps};
}

}  // namespace ds::mla::dev
