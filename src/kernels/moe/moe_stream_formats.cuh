// Weight/activation formats of the streaming (decode) expert GEMM: how one 128-wide K unit of two weight rows
// is loaded, converted and multiplied against the tokens. Included only by moe_stream.cuh.
//
// Operand mapping (all formats): an mma's A operand is 16 weight rows (lane r = l/4 owns rows r and r+8),
// its B operand 8 tokens (lane owns token l/4). Each lane loads 16 contiguous bytes of its rows and of its
// token at the same K offset; which mma k-slot an element lands in is a permutation of K that A and B share,
// so the dot products are exact sums over the same K elements (no shuffles, 16-byte loads only).
#pragma once

#include "kernels/moe/moe_common.cuh"

namespace ds::moe::detail {

// Pointers of this lane's two weight rows (r, r+8) and their scale rows.
struct WRows {
  const uint8_t* row[2];
  const uint8_t* sc[2];  // FP8 block: f32 row of the 128-row block; MX: e8m0 row; NV: e4m3 row
};

// Token rows of one pass (NT n8-tiles of 8 tokens), in shared memory: the same for every warp of the CTA,
// and 64-bit pointers per n-tile would cost 6 NT registers per thread.
template <int NT>
struct TokRows {
  const uint8_t* row[NT * 8];  // activation row of each token
  const uint8_t* srow[NT * 8]; // its scale row: e8m0 (MXFP8) or f32 (FP8 block)
};
template <int NT>
struct Tok {
  const TokRows<NT>* s;
  int r, c;                    // lane / 4 (the B token), lane % 4 (C tokens 2c, 2c+1)
  int live;                    // n-tiles holding at least one token (uniform over the CTA)
  __device__ const uint8_t* row(int nt) const { return s->row[nt * 8 + r]; }
  __device__ const uint8_t* srow(int nt) const { return s->srow[nt * 8 + r]; }
  __device__ const float* csc(int nt, int i) const {
    return reinterpret_cast<const float*>(s->srow[nt * 8 + 2 * c + i]);
  }
};

// Multiply a bf16x2 by 2^p (p may exceed bf16's 2^127 when an e8m0 scale is folded with a re-encoding).
__device__ __forceinline__ uint32_t scale_pow2(uint32_t w, int p) {
  if (p <= 127) return bf16x2_mul(w, bf16x2_pow2(p));
  return bf16x2_mul(bf16x2_mul(w, bf16x2_pow2(127)), bf16x2_pow2(p - 127));
}
__device__ __forceinline__ uint32_t e4m3_to_bf16x2_splat(uint32_t byte) {
  const uint32_t h = f32_to_bf16_bits(e4m3_to_f32(static_cast<uint8_t>(byte)));  // exact
  return h | (h << 16);
}

// C-fragment promotion: acc += tmp * (row scale) * (token scale); rows (r, r, r+8, r+8), tokens (2c, 2c+1).
template <int NT>
__device__ __forceinline__ void promote(float (&acc)[NT][4], const float (&tmp)[NT][4], float sw0, float sw1,
                                        const Tok<NT>& t, int u) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= t.live) break;
    const float sa0 = t.csc(nt, 0)[u], sa1 = t.csc(nt, 1)[u];
    acc[nt][0] += tmp[nt][0] * (sw0 * sa0);
    acc[nt][1] += tmp[nt][1] * (sw0 * sa1);
    acc[nt][2] += tmp[nt][2] * (sw1 * sa0);
    acc[nt][3] += tmp[nt][3] * (sw1 * sa1);
  }
}

// ---------------------------------------------------------------- bf16 weights, bf16 activations
// Lane covers k = 32 j + 8 c .. +8 (j = 0..3) of a unit: one 16-byte load = two k16 mmas.
struct FmtBF16 {
  static constexpr WeightFormat kW = WeightFormat::kBF16;
  static constexpr ActFormat kA = ActFormat::kBF16;
  template <int NT> static constexpr int kUnits = 2;  // 2 units x 2 rows x 64 B = 256 B of weights in flight per lane
  struct A { uint4 v[2][4]; };
  static __device__ void load(A& a, const WRows& w, int u, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j) a.v[h][j] = ld_stream(w.row[h] + (u * 128 + 32 * j + 8 * c) * 2);
  }
  template <int NT>
  static __device__ void compute(float (&acc)[NT][4], const A& a, const Tok<NT>& t, int u, int c) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= t.live) break;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 b = ld_act(t.row(nt) + (u * 128 + 32 * j + 8 * c) * 2);
        mma_bf16(acc[nt], a.v[0][j].x, a.v[1][j].x, a.v[0][j].y, a.v[1][j].y, b.x, b.y);
        mma_bf16(acc[nt], a.v[0][j].z, a.v[1][j].z, a.v[0][j].w, a.v[1][j].w, b.z, b.w);
      }
    }
  }
};

// ---------------------------------------------------------------- FP8 block weights and activations
// Native e4m3 mma (k32). Lane covers bytes 64 j + 16 c (j = 0, 1); the unit is one 128-wide scale block of
// both operands, so each unit's partial sum is promoted with (weight block scale) x (token scale).
struct FmtFP8 {
  static constexpr WeightFormat kW = WeightFormat::kFP8Block;
  static constexpr ActFormat kA = ActFormat::kFP8Block;
  // 4 units (18 registers each, 256 B of weights in flight per lane, as bf16's 2). With 2 or 4 token tiles
  // only 2 units fit the 128 registers of two CTAs per SM; 8 tiles run one CTA per SM (stream_min_ctas) with 4.
  template <int NT> static constexpr int kUnits = NT == 2 || NT == 4 ? 2 : 4;
  struct A { uint4 v[2][2]; float s[2]; };
  static __device__ void load(A& a, const WRows& w, int u, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 2; ++j) a.v[h][j] = ld_stream(w.row[h] + u * 128 + 64 * j + 16 * c);
      a.s[h] = reinterpret_cast<const float*>(w.sc[h])[u];
    }
  }
  // Each token tile's unit partial sum is promoted right after its 4 mmas (one 4-register temporary instead of
  // NT: the same fp32 operations per element as promoting all tiles after the unit).
  template <int NT>
  static __device__ void compute(float (&acc)[NT][4], const A& a, const Tok<NT>& t, int u, int c) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= t.live) break;
      float tmp[4] = {};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 b = ld_act(t.row(nt) + u * 128 + 64 * j + 16 * c);
        mma_e4m3(tmp, a.v[0][j].x, a.v[1][j].x, a.v[0][j].y, a.v[1][j].y, b.x, b.y);
        mma_e4m3(tmp, a.v[0][j].z, a.v[1][j].z, a.v[0][j].w, a.v[1][j].w, b.z, b.w);
      }
      const float sa0 = t.csc(nt, 0)[u], sa1 = t.csc(nt, 1)[u];
      acc[nt][0] += tmp[0] * (a.s[0] * sa0);
      acc[nt][1] += tmp[1] * (a.s[0] * sa1);
      acc[nt][2] += tmp[2] * (a.s[1] * sa0);
      acc[nt][3] += tmp[3] * (a.s[1] * sa1);
    }
  }
};

// ---------------------------------------------------------------- MXFP8 weights and activations
// e4m3 x 2^(s-127) is exact in bf16: both operands are re-encoded (value * 2^-120 in bf16 bits, then one
// bf16 multiply by 2^(s-7)) and multiplied on bf16 tensor cores. Lane covers bytes 64 j + 16 c: one 32-block.
// Byte pairs (0,2) and (1,3) of each word form the bf16x2 words, on both operands alike.
struct FmtMXFP8 {
  static constexpr WeightFormat kW = WeightFormat::kMXFP8;
  static constexpr ActFormat kA = ActFormat::kMXFP8;
  template <int NT> static constexpr int kUnits = 4;
  struct A { uint4 v[2][2]; uint32_t s[2]; };
  static __device__ void load(A& a, const WRows& w, int u, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 2; ++j) a.v[h][j] = ld_stream(w.row[h] + u * 128 + 64 * j + 16 * c);
      a.s[h] = *reinterpret_cast<const uint32_t*>(w.sc[h] + u * 4);
    }
  }
  // 16 e4m3 with e8m0 scale s -> 8 bf16x2 words: out[2q + i] = bytes (4q + i, 4q + i + 2).
  static __device__ void convert(const uint4& v, uint32_t s, uint32_t (&out)[8]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t w = word(v, q);
      out[2 * q] = scale_pow2(e4m3x2_to_bf16x2_scaled(w), static_cast<int>(s) - 7);
      out[2 * q + 1] = scale_pow2(e4m3x2_to_bf16x2_scaled(w >> 8), static_cast<int>(s) - 7);
    }
  }
  template <int NT>
  static __device__ void compute(float (&acc)[NT][4], const A& a, const Tok<NT>& t, int u, int c) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int blk = 2 * j + c / 2;  // this lane's 32-block inside the unit
      uint32_t w0[8], w1[8];
      convert(a.v[0][j], (a.s[0] >> (8 * blk)) & 0xffu, w0);
      convert(a.v[1][j], (a.s[1] >> (8 * blk)) & 0xffu, w1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= t.live) break;
        const uint4 braw = ld_act(t.row(nt) + u * 128 + 64 * j + 16 * c);
        const uint32_t sb = (*reinterpret_cast<const uint32_t*>(t.srow(nt) + u * 4) >> (8 * blk)) & 0xffu;
        uint32_t b[8];
        convert(braw, sb, b);
#pragma unroll
        for (int q = 0; q < 4; ++q) mma_bf16(acc[nt], w0[2 * q], w1[2 * q], w0[2 * q + 1], w1[2 * q + 1], b[2 * q], b[2 * q + 1]);
      }
    }
  }
};

// ---------------------------------------------------------------- e2m1 weights (MXFP4 / NVFP4)
// Lane covers elements 32 c .. 32 c + 31 of the unit (16 bytes, one load). Word q of the load holds elements
// 8q..8q+7 (even element in the low nibble); bf16x2 word (q, k) pairs elements (8q + k, 8q + k + 4), so one
// shift and mask per word. The bf16 activations are permuted to the same pairs with one byte_perm per word.
template <int NT>
__device__ __forceinline__ void fp4_mmas_bf16act(float (&acc)[NT][4], const uint32_t (&w0)[16],
                                                 const uint32_t (&w1)[16], const Tok<NT>& t, int u, int c) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt >= t.live) break;
    uint32_t raw[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = ld_act(t.row(nt) + (u * 128 + 32 * c + 8 * i) * 2);
      raw[4 * i] = v.x;
      raw[4 * i + 1] = v.y;
      raw[4 * i + 2] = v.z;
      raw[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int k0 = 0; k0 < 4; k0 += 2) {
        const uint32_t b0 = __byte_perm(raw[4 * q + k0 / 2], raw[4 * q + k0 / 2 + 2], 0x5410);
        const uint32_t b1 = __byte_perm(raw[4 * q + k0 / 2], raw[4 * q + k0 / 2 + 2], 0x7632);
        mma_bf16(acc[nt], w0[4 * q + k0], w1[4 * q + k0], w0[4 * q + k0 + 1], w1[4 * q + k0 + 1], b0, b1);
      }
  }
}

struct FmtMXFP4 {
  static constexpr WeightFormat kW = WeightFormat::kMXFP4;
  static constexpr ActFormat kA = ActFormat::kBF16;
  // 8 units x 2 rows x 16 B in flight per lane; 4 where two CTAs share an SM (stream_min_ctas)
  template <int NT> static constexpr int kUnits = NT <= 2 ? 4 : 8;
  struct A { uint4 v[2]; uint32_t s[2]; };
  static __device__ void load(A& a, const WRows& w, int u, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a.v[h] = ld_stream(w.row[h] + u * 64 + 16 * c);
      a.s[h] = *reinterpret_cast<const uint32_t*>(w.sc[h] + u * 4);
    }
  }
  static __device__ void convert(const uint4& v, uint32_t s, uint32_t (&out)[16]) {
    const int p = static_cast<int>(s) - 1;  // 2^126 (re-encoding) x 2^(s - 127)
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int k = 0; k < 4; ++k) out[4 * q + k] = scale_pow2(e2m1x2_to_bf16x2_scaled(word(v, q) >> (4 * k)), p);
  }
  template <int NT>
  static __device__ void compute(float (&acc)[NT][4], const A& a, const Tok<NT>& t, int u, int c) {
    uint32_t w0[16], w1[16];
    convert(a.v[0], (a.s[0] >> (8 * c)) & 0xffu, w0);
    convert(a.v[1], (a.s[1] >> (8 * c)) & 0xffu, w1);
    fp4_mmas_bf16act(acc, w0, w1, t, u, c);
  }
};

// NVFP4: the lane's 32 elements span two 16-blocks (words q = 0, 1 and q = 2, 3); e2m1 x e4m3 is exact in
// bf16 (at most 5 significant bits). The per-expert global scale multiplies the fp32 result (epilogue).
template <ActFormat kAct>
struct FmtNVFP4 {
  static constexpr WeightFormat kW = WeightFormat::kNVFP4;
  static constexpr ActFormat kA = kAct;
  template <int NT> static constexpr int kUnits = NT <= 2 ? 4 : 8;  // as FmtMXFP4
  struct A { uint4 v[2]; uint2 s[2]; };
  static __device__ void load(A& a, const WRows& w, int u, int c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a.v[h] = ld_stream(w.row[h] + u * 64 + 16 * c);
      a.s[h] = *reinterpret_cast<const uint2*>(w.sc[h] + u * 8);
    }
  }
  static __device__ void convert(const uint4& v, uint2 s, int c, uint32_t (&out)[16]) {
    const uint32_t sw = ((c < 2 ? s.x : s.y) >> (16 * (c & 1))) & 0xffffu;  // blocks 2c, 2c+1
    const uint32_t f[2] = {e4m3_to_bf16x2_splat(sw & 0xffu), e4m3_to_bf16x2_splat(sw >> 8)};
    const uint32_t k126 = bf16x2_pow2(126);
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[4 * q + k] = bf16x2_mul(bf16x2_mul(e2m1x2_to_bf16x2_scaled(word(v, q) >> (4 * k)), k126), f[q / 2]);
  }
  template <int NT>
  static __device__ void compute(float (&acc)[NT][4], const A& a, const Tok<NT>& t, int u, int c) {
    uint32_t w0[16], w1[16];
    convert(a.v[0], a.s[0], c, w0);
    convert(a.v[1], a.s[1], c, w1);
    if constexpr (kAct == ActFormat::kBF16) {
      fp4_mmas_bf16act(acc, w0, w1, t, u, c);
    } else {
      // W4A8: e4m3 activations (bytes 32 c .. +31 of the unit) re-encoded to bf16; the unit is their 1x128
      // scale block, promoted per token after the unit.
      float tmp[NT][4] = {};
      const uint32_t k120 = bf16x2_pow2(120);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt >= t.live) break;
        const uint4 r0 = ld_act(t.row(nt) + u * 128 + 32 * c), r1 = ld_act(t.row(nt) + u * 128 + 32 * c + 16);
        const uint32_t raw[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int k0 = 0; k0 < 4; k0 += 2) {
            // bytes (8q + k, 8q + k + 4) = byte k of raw[2q] and of raw[2q + 1]
            const uint32_t s0 = k0 | (k0 << 4) | ((k0 + 4) << 8) | ((k0 + 4) << 12);
            const uint32_t s1 = (k0 + 1) | ((k0 + 1) << 4) | ((k0 + 5) << 8) | ((k0 + 5) << 12);
            const uint32_t b0 = bf16x2_mul(e4m3x2_to_bf16x2_scaled(__byte_perm(raw[2 * q], raw[2 * q + 1], s0)), k120);
            const uint32_t b1 = bf16x2_mul(e4m3x2_to_bf16x2_scaled(__byte_perm(raw[2 * q], raw[2 * q + 1], s1)), k120);
            mma_bf16(tmp[nt], w0[4 * q + k0], w1[4 * q + k0], w0[4 * q + k0 + 1], w1[4 * q + k0 + 1], b0, b1);
          }
      }
      promote(acc, tmp, 1.0f, 1.0f, t, u);
    }
  }
};

}  // namespace ds::moe::detail
