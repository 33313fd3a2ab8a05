// Prefill expert GEMMs with FP8 block scaling on sm_90a tensor cores, warp-specialised, 128-row tiles
// (GemmArgs::fp8_tile_m == 128; the 64-row kernel is moe_wgmma_fp8.cu).
//
// Why: the 64 x 256 kernel loads 40 KB per 128-wide K step for 4.2 MFLOP, and at T = 16,384 its CTAs pull
// ~6.7 TB/s out of L2 (docs/perf-moe.md, run 12): the feed, not the tensor cores, sets its pace. A 128 x 256 tile
// loads 48 KB for twice the work.
//
// CTA = 3 warpgroups. Warpgroup 0 is the producer (40 registers): per K step it gathers the 128 activation rows
// with cp.async (8 x 16 bytes per thread, rows by token for GEMM1) plus their scales and the two weight-block
// scales, and thread 0 loads the 256 x 128 weight tile as two TMA boxes (3D maps [expert][column][K], 128-byte
// swizzle: the layout wgmma reads). Both complete on the stage's `full` mbarrier (cp.async.mbarrier.arrive.noinc
// per thread + expect_tx). Warpgroups 1 and 2 are consumers (232 registers), each 64 rows x 256 columns: per
// stage, for each 128-column half, four m64n128k32 wgmmas into a 64-register partial sum, then
// acc += partial * a_scale[row] * w_scale[block] (the 64-row kernel's arithmetic, so the same bits), and each
// warp arrives on the stage's `empty` mbarrier. A 4-stage ring of 48 KB runs on across tiles; no CTA barrier in
// the loop, so the two consumers drift apart and one's promotion overlaps the other's MMAs.
// GEMM1's B tile is the gate block's 128 columns then the up block's, so a consumer holds gate and up of the same
// 128 h columns for its rows: SwiGLU and the 1x128 FP8 quantisation of h need only a 4-lane reduction.

#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/smem_opt_in.h"
#include "kernels/moe/moe_sm90.cuh"

namespace ds::moe::detail {
namespace {

using ::ds::mbar::mbar_arrive;
using ::ds::mbar::mbar_arrive_cp_async;
using ::ds::mbar::mbar_arrive_expect_tx;
using ::ds::mbar::mbar_wait;
using ::ds::mbar::tma_load_3d;

constexpr int kBM = 128, kBN = 256, kBK = 128, kStages = 4, kThreads = 384;
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
constexpr int kBoxRows = 128;        // a TMA box: 128 weight rows x 128 K bytes (16 KB)
constexpr int kScaleFloats = kBM + 2;  // per stage: the 128 rows' activation scales, 2 weight-block scales
constexpr int kConsumerWarps = 8;
// + alignment slack + full/empty mbarriers + the scale ring + tile_prefix[0..G], grp_begin[G], grp_count[G]
constexpr int kSmemBytes =
    kStages * kStageBytes + 1024 + 2 * kStages * 8 + kStages * kScaleFloats * 4 + (3 * kMaxExperts + 4) * 4;
static_assert(kBM == kWgmmaTileMFp8Ws);
static_assert(kSmemBytes <= 227 * 1024);

__device__ __forceinline__ float lds_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
// Registers move between warpgroups inside the CTA's allocation (168 per thread at launch, ptxas's cap for 384
// threads): 128 x 40 + 256 x 232 = 384 x 168. Consumers need ~230 (acc 128 + partial 64; 224 spilled), the
// producer spills ~40 bytes at 40 (its copy sources), which costs it little: it mostly waits on `empty`.
// Whether tile column block nt has its second 128-column half: always in GEMM1 (gate, up), not in GEMM2's last
// tile when N is an odd multiple of 128. The producer loads that box and the consumers multiply it by this test.
__device__ __forceinline__ bool has_second_half(bool g1, int nt, int N) { return g1 || nt * kBN + kBoxRows < N; }

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__global__ void __launch_bounds__(kThreads, 1)
    wgmma_fp8_ws_kernel(const GemmArgs a, const __grid_constant__ CUtensorMap tb_experts,
                        const __grid_constant__ CUtensorMap tb_shared) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);  // [kStages]
  uint64_t* empty = full + kStages;                                             // [kStages]
  float* sscale = reinterpret_cast<float*>(empty + kStages);                     // [kStages][kScaleFloats]
  int32_t* sprefix = reinterpret_cast<int32_t*>(sscale + kStages * kScaleFloats);  // [G + 1]
  int32_t* sbegin = sprefix + kMaxExperts + 2;                                      // [G]
  int32_t* scount = sbegin + kMaxExperts + 1;                                       // [G]
  const uint32_t sbase = smem_u32(smem);
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      ::ds::mbar::mbar_init(full + s, 128 + 1);  // each producer thread's cp.async, thread 0's expect_tx
      ::ds::mbar::mbar_init(empty + s, kConsumerWarps);
    }
    ::ds::mbar::mbar_fence_init();
  }

  pdl_wait();
  pdl_trigger();
  const Plan& P = a.plan;
  const bool g1 = a.gemm1;
  const int K = g1 ? a.D : a.I, N = g1 ? 2 * a.I : a.D, KB = K / 128;
  const int ntn = g1 ? a.I / 128 : (a.D + kBN - 1) / kBN;
  const int KT = K / kBK;
  // The schedule's arrays in shared memory: a tile's start then costs no dependent round trips to L2.
  for (int g = tid; g <= P.G; g += blockDim.x) {
    sprefix[g] = ::ds::pdl::load_prior(P.tile_prefix + g);
    if (g < P.G) {
      sbegin[g] = ::ds::pdl::load_prior(P.grp_begin + g);
      scount[g] = ::ds::pdl::load_prior(P.grp_count + g);
    }
  }
  __syncthreads();  // the barriers' init and the schedule
  const int total = sprefix[P.G] * ntn;

  if (wg == 0) {
    // ---- producer ------------------------------------------------------------------------------------------
    setmaxnreg_dec<40>();
    const int lc = tid % 8, lr = tid / 8;  // 16-byte chunk lc of rows lr + 16 i; scales of row tid
    const float* a_scale = static_cast<const float*>(a.a_scale);
    const uint8_t* abase = static_cast<const uint8_t*>(a.a) + lc * 16;
    int slot = 0;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const TileCoord tc = tile_coord_smem(sprefix, P.G, tile, ntn, kBM);
      const int rb = sbegin[tc.g], cnt = scount[tc.g];
      const bool is_shared = tc.g == P.EL;
      const ExpertWeights& W = is_shared ? a.shared : a.experts;
      const int e = is_shared ? 0 : tc.g;
      const CUtensorMap* tmap = is_shared ? &tb_shared : &tb_experts;
      const float* wscale = static_cast<const float*>(g1 ? W.w13_scale : W.w2_scale) + e * (N / 128) * KB;
      uint32_t aoff[8], aval = 0;  // byte offsets of this thread's A rows (< 2^32: T * K is)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int m = tc.m0 + lr + 16 * i;
        aval |= (m < cnt ? 1u : 0u) << i;
        const int p = rb + min(m, cnt - 1);
        aoff[i] = static_cast<uint32_t>(g1 ? P.row_token[p] : p) * static_cast<uint32_t>(K);
      }
      const int ms = tc.m0 + tid;
      const bool scale_valid = ms < cnt;
      const int ps = rb + min(ms, cnt - 1);
      const float* scale_src = a_scale + static_cast<size_t>(g1 ? P.row_token[ps] : ps) * KB;
      // Thread 0: the two weight blocks' scale rows and the TMA boxes' first columns (GEMM1: gate, up).
      const int col0 = g1 ? tc.nt * 128 : tc.nt * kBN, col1 = g1 ? a.I + tc.nt * 128 : tc.nt * kBN + kBoxRows;
      const bool box1 = has_second_half(g1, tc.nt, N);
      const float* wsc0 = wscale + static_cast<size_t>(col0 / 128) * KB;
      const float* wsc1 = wscale + static_cast<size_t>(min(col1, N - 1) / 128) * KB;
      for (int kt = 0; kt < KT; ++kt) {
        mbar_wait(empty + slot, phase ^ 1u);  // both consumers are done with the slot's previous fill
        const uint32_t sa = sbase + slot * kStageBytes;
        const uint32_t ss = smem_u32(sscale + slot * kScaleFloats);
#pragma unroll
        for (int i = 0; i < 8; ++i) cp_async16(sa + swz(lr + 16 * i, lc), abase + aoff[i] + kt * 128, (aval >> i) & 1u);
        cp_async4(ss + tid * 4, scale_src + kt, scale_valid);
        if (tid == 0) {
          cp_async4(ss + kBM * 4, wsc0 + kt, true);
          cp_async4(ss + (kBM + 1) * 4, wsc1 + kt, true);
          mbar_arrive_expect_tx(full + slot, box1 ? kBBytes : kBBytes / 2);
          tma_load_3d(sa + kABytes, tmap, kt * kBK, col0, e, full + slot);
          if (box1) tma_load_3d(sa + kABytes + kBoxRows * kBK, tmap, kt * kBK, col1, e, full + slot);
        }
        mbar_arrive_cp_async(full + slot);
        if (++slot == kStages) {
          slot = 0;
          phase ^= 1u;
        }
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy of this thread left in flight at exit
    return;
  }

  // ---- consumers: warpgroup 1 rows 0-63 of the tile, warpgroup 2 rows 64-127 --------------------------------
  setmaxnreg_inc<232>();
  const int cw = wg - 1, w4 = (tid % 128) / 32, lane = tid % 32;
  const uint64_t desc_a0 = smem_desc(sbase + cw * 64 * 128), desc_b0 = smem_desc(sbase + kABytes);
  int slot = 0;
  uint32_t phase = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const TileCoord tc = tile_coord_smem(sprefix, P.G, tile, ntn, kBM);
    const int rb = sbegin[tc.g], cnt = scount[tc.g];
    const bool half1 = has_second_half(g1, tc.nt, N);
    const int rl = 64 * cw + 16 * w4 + lane / 4;    // this thread's rows in the tile: rl, rl + 8
    const int mrow[2] = {tc.m0 + rl, tc.m0 + rl + 8};
    // GEMM2's row destinations, loaded now so they land during the K loop (after it, their round trip was ~20 %
    // of GEMM2's consumer stalls).
    int dst[2] = {0, 0};
    if (!g1)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) dst[hr] = mrow[hr] < cnt ? P.row_dest[rb + mrow[hr]] : 0;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    float part[64];
    for (int kt = 0; kt < KT; ++kt) {
      mbar_wait(full + slot, phase);
      fence_proxy_async();  // the producer's cp.async rows (generic proxy) before the wgmma reads them
      __syncwarp();
      // ld.shared by address: through the aligned-up generic pointer they compiled to generic loads.
      const uint32_t ss = smem_u32(sscale + slot * kScaleFloats);
      const float s0 = lds_f32(ss + 4 * rl), s1 = lds_f32(ss + 4 * (rl + 8));
      const float w0 = lds_f32(ss + 4 * kBM), w1 = lds_f32(ss + 4 * (kBM + 1));
      const uint64_t da = desc_a0 + static_cast<uint32_t>(slot * kStageBytes / 16);
      const uint64_t db = desc_b0 + static_cast<uint32_t>(slot * kStageBytes / 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && !half1) break;
        wgmma_fence();
        fence_regs(part);
#pragma unroll
        for (int k = 0; k < kBK / 32; ++k) wgmma_e4m3_m64n128k32(part, da + 2 * k, db + h * (128 * 128 / 16) + 2 * k, k);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(part);
        // acc += part * a_scale[row] * w_scale[block h]: the 64-row kernel's products, in its order.
        const float wsc = h == 0 ? w0 : w1, f0 = s0 * wsc, f1 = s1 * wsc;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          acc[64 * h + 4 * j + 0] += part[4 * j + 0] * f0;
          acc[64 * h + 4 * j + 1] += part[4 * j + 1] * f0;
          acc[64 * h + 4 * j + 2] += part[4 * j + 2] * f1;
          acc[64 * h + 4 * j + 3] += part[4 * j + 3] * f1;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + slot);  // this warp's MMAs and scale reads of the slot are done
      if (++slot == kStages) {
        slot = 0;
        phase ^= 1u;
      }
    }

    // Epilogue. acc[64 h + 4 j + q]: row rl + 8 (q >= 2), column 128 h + 8 j + 2 (lane % 4) + (q & 1) of the tile.
    if (g1) {
      // h = silu(gate) * up for the tile's 128 h columns; the 1x128 scale from the row's maximum over them.
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float hv[32];
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float v = silu_fast(acc[4 * j + 2 * hr + q]) * acc[64 + 4 * j + 2 * hr + q];
            hv[2 * j + q] = v;
            amax = fmaxf(amax, fabsf(v));
          }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        if (mrow[hr] >= cnt) continue;
        const float sc = amax > 0.0f ? amax / kE4M3MaxF : 1.0f, inv = 1.0f / sc;
        const size_t p = static_cast<size_t>(rb + mrow[hr]);
        auto* hq = static_cast<uint8_t*>(a.h) + p * a.I + tc.nt * 128;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint32_t lo = f32_to_e4m3_sat(hv[2 * j] * inv), hi = f32_to_e4m3_sat(hv[2 * j + 1] * inv);
          *reinterpret_cast<uint16_t*>(hq + 8 * j + 2 * (lane % 4)) = static_cast<uint16_t>(lo | (hi << 8));
        }
        if (lane % 4 == 0) static_cast<float*>(a.h_scale)[p * (a.I / 128) + tc.nt] = sc;
      }
    } else {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (mrow[hr] >= cnt) continue;
        bf16_t* out = dst[hr] >= 0 ? a.expert_out + static_cast<size_t>(dst[hr]) * a.D
                                   : a.shared_out + static_cast<size_t>(-1 - dst[hr]) * a.D;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const int col = tc.nt * kBN + 128 * h + 8 * j + 2 * (lane % 4);
            if (col < N)
              reinterpret_cast<uint32_t*>(out)[col / 2] =
                  pack_bf16x2(acc[64 * h + 4 * j + 2 * hr], acc[64 * h + 4 * j + 2 * hr + 1]);
          }
      }
    }
  }
}

// A 3D tensor map [experts][N columns][K bytes] of e4m3 weights, box {128 bytes, 128 rows, 1}, 128-byte swizzle;
// columns past N read as zeros. Encoded on the host per launch (a few microseconds; prefill only), through the
// runtime's driver entry point (no libcuda link).
CUtensorMap weight_map(const void* w, int experts, int N, int K) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) MOE_CUDA_CHECK(cudaErrorNotSupported);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap m{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N) * K};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(kBoxRows), 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(w), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) MOE_CUDA_CHECK(cudaErrorInvalidValue);
  return m;
}

}  // namespace

void launch_wgmma_fp8_ws(const GemmArgs& a) {
  static PerDeviceOnce smem_once;
  MOE_CUDA_CHECK(opt_in_dynamic_smem(smem_once, wgmma_fp8_ws_kernel, kSmemBytes));
  const int K = a.gemm1 ? a.D : a.I, N = a.gemm1 ? 2 * a.I : a.D;
  const CUtensorMap te = weight_map(a.gemm1 ? a.experts.w13 : a.experts.w2, a.plan.EL, N, K);
  const CUtensorMap ts = a.plan.has_shared ? weight_map(a.gemm1 ? a.shared.w13 : a.shared.w2, 1, N, K) : te;
  launch(a.pdl, wgmma_fp8_ws_kernel, a.num_sms, kThreads, kSmemBytes, a.stream, a, te, ts);
}

}  // namespace ds::moe::detail
