// Element types and exact CPU conversions (round-to-nearest-even) for bf16, fp16, fp8, e8m0 and fp4.
//
// Saturation contract (the same on CPU and in the CUDA kernels):
//   bf16, fp16 : IEEE behaviour — overflow rounds to +-inf, NaN stays NaN (quiet).
//   fp8 e4m3   : (OCP "fn": no inf, NaN = S.1111.111) finite values beyond +-448 and +-inf saturate to +-448;
//                NaN -> NaN (0x7f / 0xff).
//   fp8 e5m2   : finite values beyond +-57344 and +-inf saturate to +-57344; NaN -> NaN (0x7f / 0xff).
//   e8m0       : unsigned power of two 2^(code-127), code 255 = NaN. Rounds to the nearest power of two
//                (linear midpoint, ties to the even code); <= 2^-127 (including 0 and negatives) -> code 0,
//                >= 2^127 and +inf -> code 254, NaN -> 255.
//   fp4 e2m1   : values {0, .5, 1, 1.5, 2, 3, 4, 6}; beyond +-6 and +-inf saturate to +-6; NaN -> +6 (there
//                is no NaN encoding; this matches PTX cvt.rn.satfinite.e2m1x2.f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2, kE8M0, kF4E2M1,  // kF4E2M1 packs two values per byte
  kI64, kI32, kI16, kI8, kU8, kBool,
};

// Size in bytes of one element; fp4 reports 1 (a byte holds two values: use dtype_bytes_for()).
size_t dtype_size(DType t);
// Bytes needed for `numel` elements (handles fp4's two-per-byte packing; odd counts round up).
size_t dtype_bytes_for(DType t, size_t numel);
const char* dtype_name(DType t);                   // "bf16", "f32", ...
// Safetensors header names: "F32", "BF16", "F8_E4M3", "F8_E8M0", "F4" ...
const char* dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16 ----
struct bf16_t { uint16_t bits; };
inline float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                        // RNE
  return static_cast<uint16_t>(u >> 16);
}
// Round-trips through bf16 (the rounding a bf16 activation applies).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// Whole arrays, element by element (host-side packing, tools, tests).
inline std::vector<uint16_t> f32_to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::vector<float> bf16_to_f32(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}

// ---- fp16 ----
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// ---- fp8 ----
float e4m3_to_f32(uint8_t v);
uint8_t f32_to_e4m3(float f);
float e5m2_to_f32(uint8_t v);
uint8_t f32_to_e5m2(float f);
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// ---- e8m0 (MX block scale) ----
float e8m0_to_f32(uint8_t v);
uint8_t f32_to_e8m0(float f);
// The smallest power-of-two scale s with amax / s <= elem_max (what an MX quantiser wants: no overflow).
uint8_t e8m0_scale_for_amax(float amax, float elem_max);

// ---- fp4 e2m1 (4-bit code in the low nibble) ----
float e2m1_to_f32(uint8_t nibble);
uint8_t f32_to_e2m1(float f);
inline constexpr float kE2M1Max = 6.0f;

// Generic element conversion from raw memory (any dtype except packed fp4) to fp32.
float load_as_f32(const void* p, DType t, size_t i);
void store_from_f32(void* p, DType t, size_t i, float v);

}  // namespace ds
