// The random fill's per-element definition (Philox4x32-10 draw -> distribution -> map), shared by the CUDA
// kernel and the CPU reference so both compute the same expression. fmt-free: included from .cu files.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/util/util.h"

#if defined(__CUDACC__)
#define DS_FILL_HD __host__ __device__ __forceinline__
#else
#define DS_FILL_HD inline
#endif

namespace ds::util::detail {

struct Philox4 {
  uint32_t x, y, z, w;
};

// Philox4x32 with 10 rounds (Salmon et al., SC'11; the Random123 constants). Counter-based: the draw for index i
// needs no state, so any thread can produce any element.
DS_FILL_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c.x, p1 = static_cast<uint64_t>(kM1) * c.z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Parameters of one fill reduced to what the per-element function reads (passed by value to the kernel).
struct FillArgs {
  uint32_t k0, k1;
  FillDist dist;
  FillMap map;
  float a, b;
};

inline FillArgs fill_args(const FillParams& p) {
  return FillArgs{static_cast<uint32_t>(p.seed), static_cast<uint32_t>(p.seed >> 32), p.dist, p.map, p.a, p.b};
}

DS_FILL_HD float fill_value(const FillArgs& f, int64_t i) {
  float v = f.a;
  if (f.dist != FillDist::kConst) {
    const uint64_t u = static_cast<uint64_t>(i);
    const Philox4 r = philox4x32_10(Philox4{static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), 0u, 0u}, f.k0, f.k1);
    constexpr float k2m24 = 5.9604644775390625e-08f;  // 2^-24: 24-bit uniforms are exact in fp32
    if (f.dist == FillDist::kNormal) {
      const float u1 = static_cast<float>((r.x >> 8) + 1u) * k2m24;  // (0, 1]: the log is finite (|z| <= 5.77)
      const float u2 = static_cast<float>(r.y >> 8) * k2m24;
      v = f.a + f.b * (sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2));
    } else {
      v = f.a + (f.b - f.a) * (static_cast<float>(r.x >> 8) * k2m24);
    }
  }
  if (f.map == FillMap::kLog1p15) v = log1pf(15.0f * v);
  else if (f.map == FillMap::kInvSoftplus) v = logf(expm1f(v));
  return v;
}

}  // namespace ds::util::detail
