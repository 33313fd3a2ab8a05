// Dtype tables and the bit-exact narrow-float conversions (see dtype.h for the saturation contract).
#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace ds {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kE8M0: case DType::kF4E2M1:
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

size_t dtype_bytes_for(DType t, size_t numel) {
  if (t == DType::kF4E2M1) return (numel + 1) / 2;
  return numel * dtype_size(t);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kE8M0: return "e8m0";
    case DType::kF4E2M1: return "f4e2m1";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kI16: return "i16";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
  }
  return "?";
}

namespace {
struct StName { DType t; const char* name; };
constexpr StName kStNames[] = {
    {DType::kF64, "F64"},        {DType::kF32, "F32"},         {DType::kF16, "F16"},
    {DType::kBF16, "BF16"},      {DType::kF8E4M3, "F8_E4M3"},  {DType::kF8E5M2, "F8_E5M2"},
    {DType::kE8M0, "F8_E8M0"},   {DType::kF4E2M1, "F4"},       {DType::kI64, "I64"},
    {DType::kI32, "I32"},        {DType::kI16, "I16"},         {DType::kI8, "I8"},
    {DType::kU8, "U8"},          {DType::kBool, "BOOL"},
};
}  // namespace

const char* dtype_safetensors_name(DType t) {
  for (const auto& e : kStNames)
    if (e.t == t) return e.name;
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& e : kStNames)
    if (name == e.name) return e.t;
  return std::nullopt;
}

// ---------------------------------------------------------------- fp16
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero / subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

// Generic RNE encoder for small IEEE-like formats: `ebits` exponent bits, `mbits` mantissa bits, `bias`.
// Returns the magnitude code (no sign) of |f| rounded to nearest-even, without overflow handling:
// the caller compares against its max code. Exact because every step is integer arithmetic on the f32 bits.
static uint32_t encode_small_float(float f, int mbits, int bias) {
  const uint32_t u = f32_bits(f) & 0x7fffffffu;
  if (u == 0) return 0;
  int e = static_cast<int>(u >> 23);              // biased f32 exponent (0 for f32 subnormals)
  uint32_t m = u & 0x7fffffu;
  if (e == 0) e = 1; else m |= 0x800000u;         // m: 24-bit significand with hidden bit
  // Target exponent (unbiased) = e - 127; target biased = e - 127 + bias. Min normal biased = 1.
  int te = e - 127 + bias;
  int shift = 23 - mbits;                          // bits to drop for a normal result
  if (te < 1) { shift += 1 - te; te = 0; }         // subnormal in the target: drop more bits
  if (shift > 31) return 0;                        // far below the smallest subnormal: rounds to 0
  const uint32_t keep = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  uint32_t q = keep;
  if (rem > half || (rem == half && (keep & 1u))) q += 1;
  // Compose: for a normal result, keep includes the hidden bit at position mbits.
  if (te == 0) return q;  // subnormal (a carry into bit mbits yields the min normal code, correctly)
  return (static_cast<uint32_t>(te) << mbits) + (q - (1u << mbits));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return sign | 0x7e00u;
  if ((u & 0x7fffffffu) == 0x7f800000u) return sign | 0x7c00u;
  uint32_t code = encode_small_float(f, 10, 15);
  if (code >= 0x7c00u) code = 0x7c00u;  // overflow -> inf (IEEE)
  return static_cast<uint16_t>(sign | code);
}

// ---------------------------------------------------------------- fp8
float e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  if (exp == 15 && man == 7) return std::nanf("");
  float r = exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return neg ? -r : r;
}

uint8_t f32_to_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return sign | 0x7f;
  if ((u & 0x7fffffffu) == 0x7f800000u) return sign | 0x7e;  // inf saturates to 448
  uint32_t code = encode_small_float(f, 3, 7);
  if (code > 0x7e) code = 0x7e;
  return static_cast<uint8_t>(sign | code);
}

float e5m2_to_f32(uint8_t v) { return f16_to_f32(static_cast<uint16_t>(v) << 8); }

uint8_t f32_to_e5m2(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return sign | 0x7f;
  if ((u & 0x7fffffffu) == 0x7f800000u) return sign | 0x7b;  // inf saturates to 57344
  uint32_t code = encode_small_float(f, 2, 15);
  if (code > 0x7b) code = 0x7b;
  return static_cast<uint8_t>(sign | code);
}

// ---------------------------------------------------------------- e8m0
float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

uint8_t f32_to_e8m0(float f) {
  if (std::isnan(f)) return 0xff;
  if (!(f > 0)) return 0;
  if (std::isinf(f)) return 254;
  int e;
  const float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)  =>  f = (2m) * 2^(e-1)
  int p = e - 1;                       // f = s * 2^p with s = 2m in [1, 2)
  const float s = 2.0f * m;
  if (s > 1.5f || (s == 1.5f && ((p + 127) & 1))) p += 1;  // nearest power of two, ties to even code
  const int code = p + 127;
  if (code <= 0) return 0;
  if (code >= 254) return 254;
  return static_cast<uint8_t>(code);
}

uint8_t e8m0_scale_for_amax(float amax, float elem_max) {
  if (!(amax > 0) || std::isnan(amax)) return 127;  // all zeros: scale 1
  if (std::isinf(amax) || std::isinf(amax / elem_max)) return 254;  // saturate (and never loop on inf)
  // smallest p with amax / 2^p <= elem_max  <=>  p >= log2(amax / elem_max)
  int p = static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / elem_max)));
  while (std::ldexp(static_cast<double>(elem_max), p) < amax) ++p;  // guard log2 rounding
  while (p > -127 && std::ldexp(static_cast<double>(elem_max), p - 1) >= amax) --p;
  const int code = p + 127;
  return static_cast<uint8_t>(code < 0 ? 0 : (code > 254 ? 254 : code));
}

// ---------------------------------------------------------------- fp4 e2m1
float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kVals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kVals[nibble & 7];
  return (nibble & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float f) {
  if (std::isnan(f)) return 0x7;
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  if (std::isinf(f)) return sign | 0x7;
  uint32_t code = encode_small_float(f, 1, 1);
  if (code > 0x7) code = 0x7;
  return static_cast<uint8_t>(sign | code);
}

// ---------------------------------------------------------------- generic
float load_as_f32(const void* p, DType t, size_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  switch (t) {
    case DType::kF64: { double d; std::memcpy(&d, b + 8 * i, 8); return static_cast<float>(d); }
    case DType::kF32: { float f; std::memcpy(&f, b + 4 * i, 4); return f; }
    case DType::kF16: { uint16_t h; std::memcpy(&h, b + 2 * i, 2); return f16_to_f32(h); }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, b + 2 * i, 2); return bf16_to_f32(h); }
    case DType::kF8E4M3: return e4m3_to_f32(b[i]);
    case DType::kF8E5M2: return e5m2_to_f32(b[i]);
    case DType::kE8M0: return e8m0_to_f32(b[i]);
    case DType::kF4E2M1: return e2m1_to_f32((i & 1) ? (b[i / 2] >> 4) : (b[i / 2] & 0xf));
    case DType::kI64: { int64_t v; std::memcpy(&v, b + 8 * i, 8); return static_cast<float>(v); }
    case DType::kI32: { int32_t v; std::memcpy(&v, b + 4 * i, 4); return static_cast<float>(v); }
    case DType::kI16: { int16_t v; std::memcpy(&v, b + 2 * i, 2); return static_cast<float>(v); }
    case DType::kI8: return static_cast<float>(static_cast<int8_t>(b[i]));
    case DType::kU8: case DType::kBool: return static_cast<float>(b[i]);
  }
  DS_THROW("load_as_f32: bad dtype");
}

void store_from_f32(void* p, DType t, size_t i, float v) {
  auto* b = static_cast<uint8_t*>(p);
  switch (t) {
    case DType::kF64: { double d = v; std::memcpy(b + 8 * i, &d, 8); return; }
    case DType::kF32: std::memcpy(b + 4 * i, &v, 4); return;
    case DType::kF16: { uint16_t h = f32_to_f16(v); std::memcpy(b + 2 * i, &h, 2); return; }
    case DType::kBF16: { uint16_t h = f32_to_bf16(v); std::memcpy(b + 2 * i, &h, 2); return; }
    case DType::kF8E4M3: b[i] = f32_to_e4m3(v); return;
    case DType::kF8E5M2: b[i] = f32_to_e5m2(v); return;
    case DType::kE8M0: b[i] = f32_to_e8m0(v); return;
    case DType::kF4E2M1: {
      const uint8_t c = f32_to_e2m1(v);
      b[i / 2] = (i & 1) ? static_cast<uint8_t>((b[i / 2] & 0x0f) | (c << 4))
                         : static_cast<uint8_t>((b[i / 2] & 0xf0) | c);
      return;
    }
    case DType::kI64: { int64_t x = static_cast<int64_t>(v); std::memcpy(b + 8 * i, &x, 8); return; }
    case DType::kI32: { int32_t x = static_cast<int32_t>(v); std::memcpy(b + 4 * i, &x, 4); return; }
    case DType::kI16: { int16_t x = static_cast<int16_t>(v); std::memcpy(b + 2 * i, &x, 2); return; }
    case DType::kI8: b[i] = static_cast<uint8_t>(static_cast<int8_t>(v)); return;
    case DType::kU8: case DType::kBool: b[i] = static_cast<uint8_t>(v); return;
  }
  DS_THROW("store_from_f32: bad dtype");
}

}  // namespace ds
