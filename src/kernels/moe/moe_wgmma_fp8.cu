// Prefill expert GEMMs with FP8 block scaling on sm_90a tensor cores (e4m3 wgmma), grouped over experts.
// This is the 64-row kernel (GemmArgs::fp8_tile_m == 64), for few routed rows per expert (moe_fp8_prefill_tile_m);
// the 128-row warp-specialised one is moe_wgmma_fp8_ws.cu.
//
// CTA tile 64 x 256 x 128: one 128-wide K step is exactly one scale block of both operands (1x128 for the
// activations, 128x128 for the weights). Two consumer warpgroups split N (128 columns each: m64n128k32 into a
// 64-register partial sum, promoted after every K step as acc += partial * a_scale[row] * w_scale[block]
// in fp32, so the e4m3 products never mix blocks). 5-stage cp.async ring of 40 KB.
// Each K step waits for its stage at a CTA barrier, issues its MMAs, then refills the slot freed by the step
// before (the tensor cores start as soon as the stage is there; the ~10 copies per thread follow under them),
// waits for the MMAs and promotes. The step's scales (64 activation rows, 2 weight blocks) travel with its stage
// as 4-byte copies into a small ring beside it: read from global memory in the loop they waited behind the stage
// copies in the load queue (ncu: the top stall). tile_prefix is copied to shared memory once, so a tile's
// coordinates cost no dependent round trips to L2. Tried and dropped (docs/perf-moe.md, 2026-12-05): two
// partial-sum register sets with wait_group 1 (ptxas serialises such MMAs and spills), and an mbarrier per stage
// instead of the CTA barrier so the warpgroups could drift apart (slower).

#include "kernels/common/smem_opt_in.h"
#include "kernels/moe/moe_sm90.cuh"

namespace ds::moe::detail {
namespace {

constexpr int kBM = 64, kBN = 256, kBK = 128, kStages = 5;
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
// Per stage beside the tiles: the 64 rows' activation scales and 2 weight-block scales (GEMM1: gate, up; GEMM2:
// warpgroup 0's, 1's).
constexpr int kScaleFloats = kBM + 2;
// + alignment slack + row maxima + the scale ring + tile_prefix[0..G]
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * 64 * 4 + kStages * kScaleFloats * 4 + (kMaxExperts + 2) * 4;
static_assert(kBM == kWgmmaTileMFp8);

__global__ void __launch_bounds__(256, 1) wgmma_fp8_kernel(const GemmArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* row_amax = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [2 warpgroups][64 rows]
  float* sscale = row_amax + 2 * 64;                                              // [kStages][kScaleFloats]
  int32_t* sprefix = reinterpret_cast<int32_t*>(sscale + kStages * kScaleFloats);  // [G + 1]
  const uint32_t sbase = smem_u32(smem), sscale_base = smem_u32(sscale);

  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int tid = threadIdx.x, wg = tid / 128, w4 = (tid % 128) / 32, lane = tid % 32;
  const uint64_t desc_a0 = smem_desc(sbase), desc_b0 = smem_desc(sbase + kABytes + wg * 128 * 128);
  const bool g1 = a.gemm1;
  const int K = g1 ? a.D : a.I, N = g1 ? 2 * a.I : a.D, KB = K / 128;
  const int ntn = g1 ? a.I / 128 : (a.D + kBN - 1) / kBN;
  const int KT = K / kBK;
  for (int g = tid; g <= P.G; g += blockDim.x) sprefix[g] = ::ds::pdl::load_prior(P.tile_prefix + g);
  __syncthreads();
  const int total = sprefix[P.G] * ntn;
  const int lc = tid % 8, lr = tid / 8;
  const float* a_scale = static_cast<const float*>(a.a_scale);

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const TileCoord tc = tile_coord_smem(sprefix, P.G, tile, ntn, kBM);
    const int rb = P.grp_begin[tc.g], cnt = P.grp_count[tc.g];
    const bool is_shared = tc.g == P.EL;
    const ExpertWeights& W = is_shared ? a.shared : a.experts;
    const size_t e = is_shared ? 0 : tc.g;
    const auto* wbase = static_cast<const uint8_t*>(g1 ? W.w13 : W.w2) + e * N * static_cast<size_t>(K);
    const float* wscale = static_cast<const float*>(g1 ? W.w13_scale : W.w2_scale) + e * (N / 128) * KB;

    // 32-bit offsets of this thread's 16-byte chunks (rows of A by token, of B by column): fewer registers than
    // pointers. Offsets < 2^32: T * K and N * K are.
    const uint8_t* abase = static_cast<const uint8_t*>(a.a) + lc * 16;
    const uint8_t* bbase = wbase + lc * 16;
    uint32_t aoff[2], boff[8];
    uint32_t aval = 0, bval = 0;  // bit i: chunk row i is inside the tile's valid rows / columns
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int m = tc.m0 + lr + 32 * i;
      aval |= (m < cnt ? 1u : 0u) << i;
      const int p = rb + min(m, cnt - 1);
      aoff[i] = static_cast<uint32_t>(g1 ? P.row_token[p] : p) * static_cast<uint32_t>(K);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nl = lr + 32 * i, half = nl / 128, q = nl % 128;
      const int n = g1 ? (q < 64 ? tc.nt * 128 + 64 * half + q : a.I + tc.nt * 128 + 64 * half + q - 64)
                       : tc.nt * kBN + nl;
      bval |= (n < N ? 1u : 0u) << i;
      boff[i] = static_cast<uint32_t>(min(n, N - 1)) * static_cast<uint32_t>(K);
    }
    // The scale copier's source: threads 0..63 an activation row's scales, 64 and 65 a weight block's.
    const float* scale_src = nullptr;
    bool scale_valid = false;
    if (tid < kBM) {
      const int m = tc.m0 + tid;
      scale_valid = m < cnt;
      const int p = rb + min(m, cnt - 1);
      scale_src = a_scale + static_cast<size_t>(g1 ? P.row_token[p] : p) * KB;
    } else if (tid < kBM + 2) {
      const int j = tid - kBM;
      const int blk = g1 ? (j == 0 ? tc.nt : a.I / 128 + tc.nt) : min((tc.nt * kBN + 128 * j) / 128, N / 128 - 1);
      scale_src = wscale + static_cast<size_t>(blk) * KB;
      scale_valid = true;
    }
    auto load_stage = [&](int slot, int kt) {
      const uint32_t sa = sbase + slot * kStageBytes, sb = sa + kABytes;
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16(sa + swz(lr + 32 * i, lc), abase + aoff[i] + kt * 128, (aval >> i) & 1u);
#pragma unroll
      for (int i = 0; i < 8; ++i) cp_async16(sb + swz(lr + 32 * i, lc), bbase + boff[i] + kt * 128, (bval >> i) & 1u);
      if (tid < kBM + 2) cp_async4(sscale_base + (slot * kScaleFloats + tid) * 4, scale_src + kt, scale_valid);
    };
    int mrow[2];  // this thread's two accumulator rows
#pragma unroll
    for (int half = 0; half < 2; ++half) mrow[half] = tc.m0 + 16 * w4 + lane / 4 + 8 * half;

    constexpr int kAhead = kStages - 1;  // stages in flight beyond the one being multiplied
    // Stage kt's wgmmas (in ring slot `slot`) into p, the first overwriting it. Descriptors advance by plain adds:
    // shared addresses stay below 2^18, so desc(addr + off) == desc(addr) + off / 16.
    auto mma = [&](int slot, float (&p)[64]) {
      const uint64_t da = desc_a0 + static_cast<uint32_t>(slot * kStageBytes / 16);
      const uint64_t db = desc_b0 + static_cast<uint32_t>(slot * kStageBytes / 16);
      wgmma_fence();
      fence_regs(p);
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) wgmma_e4m3_m64n128k32(p, da + 2 * k, db + 2 * k, k);
      wgmma_commit();
    };
    // Refill: stage kt + kAhead into the slot of stage kt - 1 (one group per step, possibly empty).
    auto refill = [&](int kt, int slot) {
      if (kt + kAhead < KT) load_stage(slot, kt + kAhead);
      cp_async_commit();
    };
    // Scales of K step kt from its ring slot (landed with the stage): this thread's two activation rows, its
    // two weight blocks (gate / up in GEMM1, its warpgroup's twice in GEMM2).
    float sc[4];
    auto read_scales = [&](int slot) {
      const float* ss = sscale + slot * kScaleFloats;
      sc[0] = ss[16 * w4 + lane / 4];
      sc[1] = ss[16 * w4 + lane / 4 + 8];
      sc[2] = ss[kBM + (g1 ? 0 : wg)];
      sc[3] = ss[kBM + (g1 ? 1 : wg)];
    };
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // acc += p * a_scale[row] * w_scale[block] of K step kt (p complete).
    auto promote = [&](const float (&p)[64], const float (&c)[4]) {
      const float f00 = c[0] * c[2], f01 = c[0] * c[3], f10 = c[1] * c[2], f11 = c[1] * c[3];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float fr0 = j < 8 ? f00 : f01, fr1 = j < 8 ? f10 : f11;
        acc[4 * j + 0] += p[4 * j + 0] * fr0;
        acc[4 * j + 1] += p[4 * j + 1] * fr0;
        acc[4 * j + 2] += p[4 * j + 2] * fr1;
        acc[4 * j + 3] += p[4 * j + 3] * fr1;
      }
    };
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
    float part[64];
    // Ring slots of the stage multiplied and of the one refilled (kt % kStages, (kt + kAhead) % kStages).
    int slot = 0, fill = kAhead % kStages;
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<kAhead - 1>();
      fence_proxy_async();
      __syncthreads();  // stage kt landed everywhere; every wgmma of stage kt-1 retired (wait<0> below)
      mma(slot, part);
      read_scales(slot);
      refill(kt, fill);
      slot = slot + 1 == kStages ? 0 : slot + 1;
      fill = fill + 1 == kStages ? 0 : fill + 1;
      wgmma_wait<0>();
      fence_regs(part);
      promote(part, sc);
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
            const float v = silu_fast(acc[4 * j + 2 * half + q]) * acc[4 * (j + 8) + 2 * half + q];
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
        const float sc = am > 0.0f ? am / kE4M3MaxF : 1.0f, inv = 1.0f / sc;
        const size_t p = static_cast<size_t>(rb + mrow[half]);
        auto* hq = static_cast<uint8_t*>(a.h) + p * a.I + tc.nt * 128 + 64 * wg;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t lo = f32_to_e4m3_sat(hv[half][2 * j] * inv), hi = f32_to_e4m3_sat(hv[half][2 * j + 1] * inv);
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
  static PerDeviceOnce smem_once;
  MOE_CUDA_CHECK(opt_in_dynamic_smem(smem_once, wgmma_fp8_kernel, kSmemBytes));
  launch(a.pdl, wgmma_fp8_kernel, a.num_sms, 256, kSmemBytes, a.stream, a);
}

}  // namespace ds::moe::detail
