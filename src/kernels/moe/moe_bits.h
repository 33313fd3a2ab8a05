// Bit-level helpers shared by the MoE kernels and their CPU references/tests (host and device): MX scale
// codes, powers of two, and the narrow-float -> bf16 re-encodings the kernels use to feed bf16 tensor cores.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__ __forceinline__
#else
#define MOE_HD inline
#endif

namespace ds::moe {

MOE_HD uint32_t moe_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MOE_HD float moe_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// 2^p as a float for p in [-149, 127] (subnormal below -126), built from bits: exact on host and device.
MOE_HD float pow2f(int p) {
  return p >= -126 ? moe_f32_from_bits(static_cast<uint32_t>(p + 127) << 23)
                   : moe_f32_from_bits(1u << (p + 149));
}

// e8m0 code of the smallest power of two s with amax / s <= elem_max, for the MX element maxima
// 448 = 1.75 * 2^8 (e4m3) and 6 = 1.5 * 2^2 (e2m1); zero or NaN amax -> 127 (scale 1); clamped to [0, 254].
// Equals core/dtype.h's e8m0_scale_for_amax (tested), but in integer arithmetic so kernels reproduce it.
MOE_HD uint32_t mx_scale_code(float amax, bool fp4_elems) {
  if (!(amax > 0.0f)) return 127;
  const uint32_t u = moe_f32_bits(amax);
  if (u >= 0x7f800000u) return 254;
  if ((u >> 23) == 0) return 0;  // subnormal amax: the scale underflows e8m0
  const int e = static_cast<int>(u >> 23) - 127;
  const uint32_t m = u & 0x7fffffu;
  const int p = fp4_elems ? e - 2 + (m > 0x400000u ? 1 : 0) : e - 8 + (m > 0x600000u ? 1 : 0);
  const int code = p + 127;
  return static_cast<uint32_t>(code < 0 ? 0 : (code > 254 ? 254 : code));
}

// Two e4m3 bytes (at bit 0 and bit 16 of w; other bits ignored) -> bf16x2 holding value * 2^-120 exactly:
// sign to bit 15, the 7 exponent+mantissa bits to bits 4..10, so e4m3 subnormals land on bf16 subnormals of
// the same proportion. Multiply by 2^120 (or 2^(s-7) to fold an e8m0 scale s) in bf16 to get the value.
MOE_HD uint32_t e4m3x2_to_bf16x2_scaled(uint32_t w) {
  return ((w & 0x007f007fu) << 4) | ((w & 0x00800080u) << 8);
}
// Two e2m1 nibbles (at bits 0..3 and 16..19 of t; other bits ignored) -> bf16x2 holding value * 2^-126
// exactly (0.5 becomes the bf16 subnormal 2^-127). Multiply by 2^126 (or 2^(s-1) for an e8m0 scale s).
MOE_HD uint32_t e2m1x2_to_bf16x2_scaled(uint32_t t) {
  return ((t & 0x00070007u) << 6) | ((t & 0x00080008u) << 12);
}

}  // namespace ds::moe
