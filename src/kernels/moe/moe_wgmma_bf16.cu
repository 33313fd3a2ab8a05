// Prefill expert GEMMs in bf16 on sm_90a tensor cores (wgmma), grouped over experts, persistent CTAs.
//
// CTA tile 128 x 256 x 64, two consumer warpgroups (rows 0-63 and 64-127, each m64n256k16 into 128 fp32
// registers per thread); every thread also issues cp.async for a 4-stage ring (48 KB a stage: A 16 KB +
// B 32 KB, 192 KB in all), loads run two stages ahead of the MMAs. GEMM1's B tile is 128 gate rows + the 128
// up rows of the same h columns, so SwiGLU is thread-local in the epilogue. At 64 K per stage a CTA issues
// 8 x 128-cycle wgmmas per stage, which covers two stages (~1 us) of load latency.
#include "kernels/common/smem_opt_in.h"
#include "kernels/moe/moe_sm90.cuh"

namespace ds::moe::detail {
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;
constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack (tiles must be 1024-aligned)
static_assert(kBM == kWgmmaTileMBf16);

__global__ void __launch_bounds__(256, 1) wgmma_bf16_kernel(const GemmArgs a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t sbase = smem_u32(smem);
  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const int tid = threadIdx.x, wg = tid / 128, w4 = (tid % 128) / 32, lane = tid % 32;
  const bool g1 = a.gemm1;
  const int K = g1 ? a.D : a.I, N = g1 ? 2 * a.I : a.D;
  const int ntn = g1 ? a.I / 128 : (a.D + kBN - 1) / kBN;
  const int KT = K / kBK;
  const int total = ::ds::pdl::load_prior(P.tile_prefix + P.G) * ntn;
  const int lc = tid % 8, lr = tid / 8;  // this thread's 16-byte chunk and first row in each tile

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const TileCoord tc = tile_coord(P, tile, ntn, kBM);
    const int rb = P.grp_begin[tc.g], cnt = P.grp_count[tc.g];
    const bool is_shared = tc.g == P.EL;
    const ExpertWeights& W = is_shared ? a.shared : a.experts;
    const size_t e = is_shared ? 0 : tc.g;
    const auto* wbase = static_cast<const uint8_t*>(g1 ? W.w13 : W.w2) + e * N * static_cast<size_t>(K) * 2;

    // Source rows of this thread's chunks: A rows lr + 32 i (i < 4), B rows lr + 32 i (i < 8).
    const uint8_t* asrc[4];
    bool aval[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = tc.m0 + lr + 32 * i;
      aval[i] = m < cnt;
      const int p = rb + min(m, cnt - 1);
      asrc[i] = static_cast<const uint8_t*>(a.a) +
                static_cast<size_t>(g1 ? P.row_token[p] : p) * K * 2 + lc * 16;
    }
    const uint8_t* bsrc[8];
    bool bval[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nl = lr + 32 * i;
      const int n = g1 ? (nl < 128 ? tc.nt * 128 + nl : a.I + tc.nt * 128 + nl - 128) : tc.nt * kBN + nl;
      bval[i] = n < N;
      bsrc[i] = wbase + static_cast<size_t>(min(n, N - 1)) * K * 2 + lc * 16;
    }
    auto load_stage = [&](int slot, int kt) {
      const uint32_t sa = sbase + slot * kStageBytes, sb = sa + kABytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(sa + swz(lr + 32 * i, lc), asrc[i] + kt * 128, aval[i]);
#pragma unroll
      for (int i = 0; i < 8; ++i) cp_async16(sb + swz(lr + 32 * i, lc), bsrc[i] + kt * 128, bval[i]);
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<kStages - 3>();
      fence_proxy_async();
      __syncthreads();  // stage kt is complete for all threads; every wgmma of stage kt-2 has retired
      if (kt + kStages - 2 < KT) load_stage((kt + kStages - 2) % kStages, kt + kStages - 2);
      cp_async_commit();
      const uint32_t sa = sbase + (kt % kStages) * kStageBytes + wg * 64 * 128, sb = sbase + (kt % kStages) * kStageBytes + kABytes;
      wgmma_fence();
      fence_regs(acc);
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) wgmma_bf16_m64n256k16(acc, smem_desc(sa + 32 * k), smem_desc(sb + 32 * k), 1);
      wgmma_commit();
      wgmma_wait<1>();
      fence_regs(acc);
    }
    wgmma_wait<0>();
    fence_regs(acc);

    // Epilogue. Fragment: acc[4j + q] is row (16 w4 + lane/4 + 8 (q >= 2)) of this warpgroup's 64, column
    // 8 j + 2 (lane % 4) + (q & 1).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = tc.m0 + wg * 64 + 16 * w4 + lane / 4 + 8 * half;
      if (m >= cnt) continue;
      const size_t p = static_cast<size_t>(rb + m);
      if (g1) {
        auto* h = static_cast<uint32_t*>(a.h);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float* gt = acc + 4 * j + 2 * half;
          const float* up = acc + 4 * (j + 16) + 2 * half;
          const int col = tc.nt * 128 + 8 * j + 2 * (lane % 4);
          h[(p * a.I + col) / 2] = pack_bf16x2(silu(gt[0]) * up[0], silu(gt[1]) * up[1]);
        }
      } else {
        const int dst = P.row_dest[p];
        bf16_t* out = dst >= 0 ? a.expert_out + static_cast<size_t>(dst) * a.D
                               : a.shared_out + static_cast<size_t>(-1 - dst) * a.D;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int col = tc.nt * kBN + 8 * j + 2 * (lane % 4);
          if (col < N) reinterpret_cast<uint32_t*>(out)[col / 2] = pack_bf16x2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
      }
    }
    __syncthreads();  // the next tile's prologue overwrites stages that this tile's last wgmmas read
  }
}

}  // namespace

void launch_wgmma_bf16(const GemmArgs& a) {
  static PerDeviceOnce smem_once;
  MOE_CUDA_CHECK(opt_in_dynamic_smem(smem_once, wgmma_bf16_kernel, kSmemBytes));
  // Persistent grid: one CTA per SM (192 KB of shared memory each).
  launch(a.pdl, wgmma_bf16_kernel, a.num_sms, 256, kSmemBytes, a.stream, a);
}

}  // namespace ds::moe::detail
