// Prefill expert GEMMs with FP8 block scaling on sm_90a tensor cores (e4m3 wgmma), grouped over experts.
//
// CTA tile 64 x 256 x 128: one 128-wide K step is exactly one scale block of both operands (1x128 for the
// activations, 128x128 for the weights). Two consumer warpgroups split N (128 columns each: m64n128k32 into a
// 64-register partial sum, promoted after every K step as acc += partial * a_scale[row] * w_scale[block]
// in fp32, so the e4m3 products never mix blocks). 5-stage cp.async ring of 40 KB, loads 4 stages ahead.
// GEMM1: warpgroup w holds gate and up of h columns [128 nt + 64 w, +64); the 1x128 quantisation of h needs
// the row maximum over both warpgroups, exchanged through shared memory.
#include "kernels/moe/moe_sm90.cuh"

namespace ds::moe::detail {
namespace {

constexpr int kBM = 64, kBN = 256, kBK = 128, kStages = 5;
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * 64 * 4;  // + alignment slack + row maxima
static_assert(kBM == kWgmmaTileMFp8);

__global__ void __launch_bounds__(256, 1) wgmma_fp8_kernel(const GemmArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* row_amax = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [2 warpgroups][64 rows]
  const uint32_t sbase = smem_u32(smem);
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int tid = threadIdx.x, wg = tid / 128, w4 = (tid % 128) / 32, lane = tid % 32;
  const bool g1 = a.gemm1;
  const int K = g1 ? a.D : a.I, N = g1 ? 2 * a.I : a.D, KB = K / 128;
  const int ntn = g1 ? a.I / 128 : (a.D + kBN - 1) / kBN;
  const int KT = K / kBK;
  const int total = ::ds::pdl::load_prior(P.tile_prefix + P.G) * ntn;
  const int lc = tid % 8, lr = tid / 8;
  const float* a_scale = static_cast<const float*>(a.a_scale);

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const TileCoord tc = tile_coord(P, tile, ntn, kBM);
    const int rb = P.grp_begin[tc.g], cnt = P.grp_count[tc.g];
    const bool is_shared = tc.g == P.EL;
    const ExpertWeights& W = is_shared ? a.shared : a.experts;
    const size_t e = is_shared ? 0 : tc.g;
    const auto* wbase = static_cast<const uint8_t*>(g1 ? W.w13 : W.w2) + e * N * static_cast<size_t>(K);
    const float* wscale = static_cast<const float*>(g1 ? W.w13_scale : W.w2_scale) + e * (N / 128) * KB;

    const uint8_t* asrc[2];
    bool aval[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int m = tc.m0 + lr + 32 * i;
      aval[i] = m < cnt;
      const int p = rb + min(m, cnt - 1);
      asrc[i] = static_cast<const uint8_t*>(a.a) + static_cast<size_t>(g1 ? P.row_token[p] : p) * K + lc * 16;
    }
    const uint8_t* bsrc[8];
    bool bval[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nl = lr + 32 * i, half = nl / 128, q = nl % 128;
      const int n = g1 ? (q < 64 ? tc.nt * 128 + 64 * half + q : a.I + tc.nt * 128 + 64 * half + q - 64)
                       : tc.nt * kBN + nl;
      bval[i] = n < N;
      bsrc[i] = wbase + static_cast<size_t>(min(n, N - 1)) * K + lc * 16;
    }
    auto load_stage = [&](int slot, int kt) {
      const uint32_t sa = sbase + slot * kStageBytes, sb = sa + kABytes;
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16(sa + swz(lr + 32 * i, lc), asrc[i] + kt * 128, aval[i]);
#pragma unroll
      for (int i = 0; i < 8; ++i) cp_async16(sb + swz(lr + 32 * i, lc), bsrc[i] + kt * 128, bval[i]);
    };

    // Scale rows of this thread's two accumulator rows, and the weight-scale rows of its columns.
    const float* sa_row[2];
    int mrow[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      mrow[half] = tc.m0 + 16 * w4 + lane / 4 + 8 * half;
      const int p = rb + min(mrow[half], cnt - 1);
      sa_row[half] = a_scale + static_cast<size_t>(g1 ? P.row_token[p] : p) * KB;
    }
    const float* sw_lo;  // columns 0..63 of this warpgroup (gate in GEMM1)
    const float* sw_hi;  // columns 64..127 (up in GEMM1)
    if (g1) {
      sw_lo = wscale + static_cast<size_t>(tc.nt) * KB;
      sw_hi = wscale + static_cast<size_t>(a.I / 128 + tc.nt) * KB;
    } else {
      sw_lo = sw_hi = wscale + static_cast<size_t>(min((tc.nt * kBN + 128 * wg) / 128, N / 128 - 1)) * KB;
    }

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<kStages - 2>();
      fence_proxy_async();
      __syncthreads();  // stage kt landed everywhere; every wgmma of stage kt-1 retired (wait<0> below)
      if (kt + kStages - 1 < KT) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
      cp_async_commit();
      const uint32_t sa = sbase + (kt % kStages) * kStageBytes;
      const uint32_t sb = sa + kABytes + wg * 128 * 128;
      wgmma_fence();
      fence_regs(part);
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) wgmma_e4m3_m64n128k32(part, smem_desc(sa + 32 * k), smem_desc(sb + 32 * k), k);
      wgmma_commit();
      const float s0 = sa_row[0][kt], s1 = sa_row[1][kt], wl = sw_lo[kt], wh = sw_hi[kt];
      wgmma_wait<0>();
      fence_regs(part);
      const float f00 = s0 * wl, f01 = s0 * wh, f10 = s1 * wl, f11 = s1 * wh;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float fr0 = j < 8 ? f00 : f01, fr1 = j < 8 ? f10 : f11;
        acc[4 * j + 0] += part[4 * j + 0] * fr0;
        acc[4 * j + 1] += part[4 * j + 1] * fr0;
        acc[4 * j + 2] += part[4 * j + 2] * fr1;
        acc[4 * j + 3] += part[4 * j + 3] * fr1;
      }
    }

    // Epilogue. acc[4j + q]: row 16 w4 + lane/4 + 8 (q >= 2), column 8 j + 2 (lane % 4) + (q & 1) of this
    // warpgroup's 128.
    if (g1) {
      float hv[2][16];
      float amax[2] = {0.0f, 0.0f};
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float v = silu(acc[4 * j + 2 * half + q]) * acc[4 * (j + 8) + 2 * half + q];
            hv[half][2 * j + q] = v;
            amax[half] = fmaxf(amax[half], fabsf(v));
          }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        amax[half] = fmaxf(amax[half], __shfl_xor_sync(0xffffffffu, amax[half], 1));
        amax[half] = fmaxf(amax[half], __shfl_xor_sync(0xffffffffu, amax[half], 2));
        if (lane % 4 == 0) row_amax[wg * 64 + 16 * w4 + lane / 4 + 8 * half] = amax[half];
      }
      __syncthreads();
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int rl = 16 * w4 + lane / 4 + 8 * half;
        if (mrow[half] >= cnt) continue;
        const float am = fmaxf(row_amax[rl], row_amax[64 + rl]);
        const float sc = am > 0.0f ? am / kE4M3MaxF : 1.0f;
        const size_t p = static_cast<size_t>(rb + mrow[half]);
        auto* hq = static_cast<uint8_t*>(a.h) + p * a.I + tc.nt * 128 + 64 * wg;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t lo = f32_to_e4m3_sat(hv[half][2 * j] / sc), hi = f32_to_e4m3_sat(hv[half][2 * j + 1] / sc);
          *reinterpret_cast<uint16_t*>(hq + 8 * j + 2 * (lane % 4)) = static_cast<uint16_t>(lo | (hi << 8));
        }
        if (wg == 0 && lane % 4 == 0) static_cast<float*>(a.h_scale)[p * (a.I / 128) + tc.nt] = sc;
      }
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (mrow[half] >= cnt) continue;
        const int dst = P.row_dest[rb + mrow[half]];
        bf16_t* out = dst >= 0 ? a.expert_out + static_cast<size_t>(dst) * a.D
                               : a.shared_out + static_cast<size_t>(-1 - dst) * a.D;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int col = tc.nt * kBN + 128 * wg + 8 * j + 2 * (lane % 4);
          if (col < N) reinterpret_cast<uint32_t*>(out)[col / 2] = pack_bf16x2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
      }
    }
    __syncthreads();  // stage ring and row maxima are reused by the next tile
  }
}

}  // namespace

void launch_wgmma_fp8(const GemmArgs& a) {
  static const bool attr = [] {
    MOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)attr;
  launch(a.pdl, wgmma_fp8_kernel, a.num_sms, 256, kSmemBytes, a.stream, a);
}

}  // namespace ds::moe::detail
