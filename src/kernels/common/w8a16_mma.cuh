// W8A16 dot products on tensor cores, for decode (a few token rows against e4m3 weights): the weights are the
// B operand of mma.sync m16n8k16 (f16 in, fp32 accumulate; 8 weight rows per mma), the token rows the A operand
// (rows >= M are zero registers). Used by the dense decode GEMV (gemm/gemv_mma.cu) and the MoE one-token gemv.
//
// Why: the CUDA-core W8A16 path converts every weight to fp32 (e4m3x2 -> f16x2, then f16 -> f32 twice) and spends
// one FMA per weight and token: about 46 instructions per 16 weight bytes, 24 of them conversions. Here 16 weight
// bytes cost 8 conversions and one mma; the weights' e4m3 -> f16 is exact.
//
// The activations must be f16 for the mma: each row is scaled by a power of two 2^-e (row_f16_exponent) so that
// its largest magnitude lies in [2^14, 2^15). bf16 -> f16 is then exact for every value within 2^-28 of the row's
// largest (f16's normal range; bf16 has fewer significand bits), the f16 x f16 products are exact in fp32, and
// the sums are scaled back by 2^e. Smaller values lose bits to f16 subnormals; their share of a dot product is
// below 2^-28 of its largest term, under fp32's own rounding of the sum.
//
// One "slab" is 8 weight rows x 128 k (one FP8 scale block along k). Lane (g = lane / 4, c = lane % 4) holds the
// 32 bytes of row g at k [32c, 32c + 32) (two 16-byte loads) and, for token row g < M, the 32 matching f16
// activations (16 words). Both operands permute k the same way: mma step j (0..7) feeds the lane's k 32c + 4j ..
// 32c + 4j + 3 into the k slots {2c, 2c+1} and {2c+8, 2c+9}. Result: lane (g, c) holds token g's dot products with
// rows 2c and 2c + 1 of the slab in d[0], d[1] (d[2], d[3]: the zero token rows g + 8).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::w8mma {

inline constexpr int kSlabK = 128;  // k per slab: one FP8 scale block

// Two e4m3 (low byte first) -> f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<uint16_t>(v)));
  return r;
}

// d += A(rows g: a0 = k slots {2c, 2c+1}, a2 = {2c+8, 2c+9}; rows g + 8: zero) x B(b0, b1), fp32 accumulate.
__device__ __forceinline__ void mma_rows_lo(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// d += one slab's products (layout above): w0, w1 = the lane's 32 weight bytes, xa = its 16 f16x2 activation words
// (zero for token rows >= M).
__device__ __forceinline__ void slab_mma(const uint4& w0, const uint4& w1, const uint32_t (&xa)[16], float (&d)[4]) {
  const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_rows_lo(d, xa[2 * j], xa[2 * j + 1], e4m3x2_to_f16x2(wv[j]), e4m3x2_to_f16x2(wv[j] >> 16));
}

// The lane's activation words of slab `slab` for token row g from an f16 row in shared memory (uint4 chunks of 8
// values), or zeros for g >= M.
__device__ __forceinline__ void load_slab_x(const uint4* row, int slab, int c, bool live, uint32_t (&xa)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = live ? row[slab * (kSlabK / 8) + 4 * c + i] : make_uint4(0u, 0u, 0u, 0u);
    xa[4 * i] = v.x, xa[4 * i + 1] = v.y, xa[4 * i + 2] = v.z, xa[4 * i + 3] = v.w;
  }
}

// |v| of 8 bf16 (a 16-byte chunk) as the bits of a non-negative float (NaN sorts above inf): max-reduce as uint.
__device__ __forceinline__ uint32_t amax_bits_bf16x8(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) m = max(m, max((w[i] << 16) & 0x7fffffffu, w[i] & 0x7fff0000u));
  return m;
}

// The exponent e of the row's power-of-two scale from its largest magnitude (as float bits): amax * 2^-e in
// [2^14, 2^15), clamped to [-126, 126] so that 2^e and 2^-e are normal floats (a row below 2^-112 is all zero or
// subnormal noise; one with inf or NaN stays inf or NaN through the scale).
__device__ __forceinline__ int row_f16_exponent(uint32_t amax_bits) {
  const int E = static_cast<int>((amax_bits >> 23) & 0xff) - 127;
  return min(126, max(-126, E - 14));
}
__device__ __forceinline__ float pow2f(int e) { return __int_as_float((127 + e) << 23); }  // e in [-126, 127]

// 8 bf16 -> 8 f16 times `inv` (a power of two).
__device__ __forceinline__ uint4 bf16x8_to_f16x8(const uint4& v, float inv) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 h = __floats2half2_rn(__uint_as_float(w[i] << 16) * inv, __uint_as_float(w[i] & 0xffff0000u) * inv);
    r[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

}  // namespace ds::w8mma
