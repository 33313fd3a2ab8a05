// KDA chunked prefill, stage 2: the sequential inter-chunk state scan fused with the chunk output (spec 4.1
// steps 5-6) and the conv-state write-back; stage 3: the gated RMSNorm of the output.
//
// Grid (V-tiles, H, N): each CTA keeps one 128 x 32 (4 V-tiles) or 128 x 64 (2 V-tiles) fp32 slice of one
// head's state in mma accumulator registers (8 warps x 16 rows) and walks the sequence's chunks. Splitting V
// gives a single long sequence 4 * H CTAs (128 at H = 32), the parallelism fla gets from its V-split scan. Per
// chunk, all on tensor cores (warps 0-3 own chunk rows for P, warps 4-7 for O, all own 16 state rows; mma
// counts at 32 columns, twice at 64):
//   P = W Sb | O = Qg Sb         32 mma per warp   (Sb = state entering the chunk, bf16)
//   Vn = U - P  -> smem bf16
//   O += tril(Aqk) Vn            <= 16 mma per O warp (only column blocks <= the row block)
//   S = diag(gl) S + Kd^T Vn     16 mma per warp   (Kd^T via ldmatrix.trans)
// The factors of the next chunks stream in while one computes (configurations below). The intra stage stores
// each factor tile in this kernel's shared-memory layout (kda.h), so a stage is six contiguous copies, made by one
// of two loaders: cp.async, 16 bytes per instruction from every thread, each waiting on its own groups and a
// barrier publishing them; or bulk copies (the TMA unit), six per stage from one thread, landing on the stage's
// mbarrier that every thread waits on, which also drops the barrier at the top of each chunk's step with more
// than one stage (the barrier after the state store already says every warp is done with the previous chunk's
// stage). O goes out in fp32 and a separate elementwise kernel applies the gated RMSNorm over the 128 columns of
// each head: the first version exchanged the norm's partial sums between the 4 V-tiles in a cluster, but with
// 158 KB of shared memory per CTA only 30 four-CTA clusters are resident on the H200 (ncu), so the 128 CTAs of
// one 32-head sequence ran in two waves; the extra pass over O costs ~8 bytes per output element instead.
#include "kernels/common/smem_opt_in.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_cuda_check.h"
#include "kernels/kda/kda_device.cuh"

namespace ds::kda {
namespace dev {
namespace {

constexpr int kD = kHeadDim;
constexpr int kC = kChunk;
// Configurations (kda_prefill_scan_config_for picks one by waves x measured cost per wave; H200, 2026-12-04):
//  - 4 V-tiles of 32 columns, 3 stages of factors (71 KB each) at one CTA per SM: the loads run two chunks
//    ahead. One long 32-head sequence (128 CTAs, one wave) takes it: 365 us at 8192 x 1.
//  - 4 V-tiles, 1 stage at two CTAs per SM, which hide each other's loads: 1.85x the cost per CTA, twice the
//    CTAs per wave.
//  - 2 V-tiles of 64 columns, 2 stages (79 KB each) or 1 stage at two CTAs per SM: a CTA does twice the work
//    per chunk for the same barriers and load waits (the per-chunk chain is latency-bound: ncu at 8192 x 1, 4 x
//    3: 2 warps per scheduler, an instruction every 4.4 cycles, L2 at 44 % and DRAM at 26 % of peak), and each
//    head's W, Qg, Kd and Aqk are read by 2 CTAs instead of 4. 8192 x 1 at H = 64: 2 x 2 565 us against 714
//    (4 x 3); 1024 x 8 at H = 32: 2 x 1 270 us against 345 (4 x 1) and 384 (4 x 3).
constexpr int kStagesWide = 3;
constexpr int kThreads = 256;         // 8 warps: with one CTA per SM, 4 warps left the mma/ldmatrix latencies bare
constexpr int kUB = kKdaUBlock;       // U comes in blocks of 32 columns
// kBV: V columns per CTA (32: 4 CTAs per head; 64: 2, which read each head's W, Qg, Kd and Aqk half as often).
template <int kBV>
constexpr int kPV = kBV + 8;          // bf16 pitch of Sb / Vn (80 B at kBV = 32)

template <int kBV>
struct ScanStage {
  // The tiles as the intra stage stored them (kda.h): swizzled rows, addressed through kda_*_offset.
  bf16 qg[kKdaFactorTile];
  bf16 kd[kKdaFactorTile];
  bf16 w[kKdaFactorTile];
  float u[kBV / kUB * kC * kUB];  // this CTA's U blocks
  bf16 aqk[kKdaAqkTile];
  float gl[kD];
};
static_assert(sizeof(ScanStage<32>) == (3 * kKdaFactorTile + kKdaAqkTile) * sizeof(bf16) +
                                           (kC * kUB + kD) * sizeof(float),
              "a stage is its six tiles back to back (bulk copies land on the members' offsets)");
template <int kStages, int kBV>
struct ScanSmem {
  ScanStage<kBV> st[kStages];
  bf16 sb[kD][kPV<kBV>];  // state entering the chunk (this CTA's kBV columns), bf16
  bf16 vn[kC][kPV<kBV>];  // pseudo-values
  uint64_t full[kStages];  // bulk loader: stage s's bytes have landed (phase parity = fill count & 1)
};

// The global sources of one stage: tile `tile`'s factors and the U blocks of V-tile vt.
template <int kBV>
struct StageSrc {
  const bf16 *qg, *kd, *w, *aqk;
  const float *u, *gl;
};
template <int kBV>
__device__ StageSrc<kBV> stage_src(const KdaChunkFactors& f, size_t tile, int vt) {
  return {reinterpret_cast<const bf16*>(f.qg) + tile * kKdaFactorTile,
          reinterpret_cast<const bf16*>(f.kd) + tile * kKdaFactorTile,
          reinterpret_cast<const bf16*>(f.w) + tile * kKdaFactorTile,
          reinterpret_cast<const bf16*>(f.aqk) + tile * kKdaAqkTile,
          f.u + tile * kKdaUTile + static_cast<size_t>(vt) * kC * kBV,
          f.gl + tile * kD};
}

template <int kBV>
__device__ void load_stage(ScanStage<kBV>& s, const KdaChunkFactors& f, size_t tile, int vt, int tid) {
  const StageSrc<kBV> src = stage_src<kBV>(f, tile, vt);
  const auto copy = [tid](void* dst, const void* from, int bytes) {
    for (int e = tid; e < bytes / 16; e += kThreads)
      cp_async16(static_cast<char*>(dst) + 16 * e, static_cast<const char*>(from) + 16 * e);
  };
  copy(s.qg, src.qg, sizeof(s.qg));
  copy(s.kd, src.kd, sizeof(s.kd));
  copy(s.w, src.w, sizeof(s.w));
  copy(s.u, src.u, sizeof(s.u));
  copy(s.aqk, src.aqk, sizeof(s.aqk));
  copy(s.gl, src.gl, sizeof(s.gl));
}
// The bulk loader: thread 0 posts the stage's bytes on its mbarrier and issues the six copies.
template <int kBV>
__device__ void load_stage_bulk(ScanStage<kBV>& s, uint64_t* bar, const KdaChunkFactors& f, size_t tile, int vt,
                                int tid) {
  if (tid != 0) return;
  const StageSrc<kBV> src = stage_src<kBV>(f, tile, vt);
  mbar_arrive_expect_tx(bar, sizeof(ScanStage<kBV>));
  bulk_copy_g2s(s.qg, src.qg, sizeof(s.qg), bar);
  bulk_copy_g2s(s.kd, src.kd, sizeof(s.kd), bar);
  bulk_copy_g2s(s.w, src.w, sizeof(s.w), bar);
  bulk_copy_g2s(s.u, src.u, sizeof(s.u), bar);
  bulk_copy_g2s(s.aqk, src.aqk, sizeof(s.aqk), bar);
  bulk_copy_g2s(s.gl, src.gl, sizeof(s.gl), bar);
}

// New conv state of this CTA's channels (q|k|v channels vt*kBV .. +kBV-1 of head h): the last W-1 inputs of the
// sequence, older ones from the old state when the sequence is shorter than W-1. Rows are rewritten oldest
// first, and new row r only ever reads old row r + len >= r, so the in-place update is safe.
template <int kBV>
__device__ void write_conv_state(const KdaPrefillParams& p, int slot, int h, int vt, int seq0, int len, int tid) {
  const int P = p.H * kD;
  const int64_t row3 = 3 * static_cast<int64_t>(P);
  bf16* cpool = reinterpret_cast<bf16*>(p.conv_pool) + static_cast<size_t>(slot) * (kConvWidth - 1) * row3;
  if (tid >= 3 * kBV / 4) return;
  const int which = tid / (kBV / 4);
  const int cc = h * kD + vt * kBV + (tid % (kBV / 4)) * 4;  // channel within q, k or v
  const Bf16Rows& x = which == 0 ? p.q : which == 1 ? p.k : p.v;
  for (int r = 0; r < kConvWidth - 1; ++r) {
    const int tau = len - (kConvWidth - 1) + r;  // local time of the input that becomes row r
    const float4 val =
        tau >= 0 ? load_bf16x4(reinterpret_cast<const bf16*>(x.ptr) + (seq0 + tau) * x.stride + cc)
                 : load_bf16x4(cpool + (r + len) * row3 + which * P + cc);
    store_bf16x4(cpool + r * row3 + which * P + cc, val);
  }
}

template <int kStages, int kBV, bool kBulk>
__global__ void __launch_bounds__(kThreads, kStages == 1 ? 2 : 1)
    kda_scan_kernel(const __grid_constant__ KdaPrefillParams p, const __grid_constant__ KdaChunkFactors fac) {
  constexpr int kNT = kBV / 8;  // 8-column mma tiles per CTA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ScanSmem<kStages, kBV>& sm = *reinterpret_cast<ScanSmem<kStages, kBV>*>(smem_raw);
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = p.H;
  const int seq0 = p.cu_seqlens[n], seq1 = p.cu_seqlens[n + 1];
  if (seq1 == seq0) return;
  const int slot = p.slot_ids[n];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int vcol0 = vt * kBV;
  const int64_t ld_o = static_cast<int64_t>(H) * kD;
  bf16* obuf = reinterpret_cast<bf16*>(fac.o) + h * kD + vcol0;  // [T, H, V] unnormalised output, bf16
  if (slot < 0) {  // padding sequence: zero output (the norm keeps it zero), no state
    for (int e = tid; e < (seq1 - seq0) * (kBV / 4); e += kThreads) {
      const int row = seq0 + e / (kBV / 4), cc = (e % (kBV / 4)) * 4;
      *reinterpret_cast<uint2*>(obuf + row * ld_o + cc) = make_uint2(0u, 0u);
    }
    return;
  }
  const int nchunks = (seq1 - seq0 + kC - 1) / kC;
  const int chunk0 = p.chunk_offsets[n];
  // Roles: every warp owns 16 state rows (d0 = 16 * warp). Warps 0-3 ("P warps") compute P = W Sb and Vn for
  // chunk rows 16 * warp; warps 4-7 ("O warps") compute and store O for chunk rows r0 = 16 * (warp - 4).
  const bool o_warp = warp >= 4;
  const int r0 = 16 * (warp & 3), d0 = 16 * warp;

  // Initial state slice: rows d0 + {g, g+8}, columns 8 * nt + {2t, 2t+1}.
  float* S0 = p.state_pool + (static_cast<size_t>(slot) * H + h) * kD * kD + vcol0;
  float S[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int cc = 8 * nt + 2 * t;
    const float2 lo = *reinterpret_cast<const float2*>(S0 + (d0 + g) * kD + cc);
    const float2 hi = *reinterpret_cast<const float2*>(S0 + (d0 + g + 8) * kD + cc);
    S[nt][0] = lo.x, S[nt][1] = lo.y, S[nt][2] = hi.x, S[nt][3] = hi.y;
  }
  write_conv_state<kBV>(p, slot, h, vt, seq0, seq1 - seq0, tid);

  const auto tile_of = [&](int ci) { return static_cast<size_t>(chunk0 + ci) * H + h; };
  if constexpr (kBulk) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(&sm.full[s], 1);
      mbar_fence_init();
    }
    __syncthreads();
    for (int s = 0; s < kStages - 1 && s < nchunks; ++s)
      load_stage_bulk(sm.st[s], &sm.full[s], fac, tile_of(s), vt, tid);
  } else {
    for (int s = 0; s < kStages - 1; ++s) {  // one cp.async group per stage, empty past the last chunk
      if (s < nchunks) load_stage(sm.st[s], fac, tile_of(s), vt, tid);
      cp_async_commit();
    }
  }
  for (int ci = 0; ci < nchunks; ++ci) {
    const int buf = ci % kStages;
    ScanStage<kBV>& st = sm.st[buf];
    const int t0 = seq0 + ci * kC, L = min(kC, seq1 - t0);
    if constexpr (kBulk) {
      if constexpr (kStages == 1) {
        __syncthreads();  // every warp is done with chunk ci-1 (the stage is free)
        load_stage_bulk(st, &sm.full[0], fac, tile_of(ci), vt, tid);
      }
      mbar_wait(&sm.full[buf], (ci / kStages) & 1);
      __syncwarp();  // the lanes leave the wait apart; ldmatrix and mma below are warp-synchronous
    } else if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with chunk ci-1 (the stage, sb and vn are free)
      load_stage(st, fac, tile_of(ci), vt, tid);
      cp_async_commit();
      cp_async_wait_group<0>();
      __syncthreads();
    } else {
      cp_async_wait_group<kStages - 2>();
      __syncthreads();  // stage ci has landed; every warp is done with chunk ci-1 (its stage, sb and vn are free)
      if (ci + kStages - 1 < nchunks)
        load_stage(sm.st[(ci + kStages - 1) % kStages], fac, tile_of(ci + kStages - 1), vt, tid);
      cp_async_commit();
    }

#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int cc = 8 * nt + 2 * t;
      *reinterpret_cast<uint32_t*>(&sm.sb[d0 + g][cc]) = pack_bf16x2(S[nt][0], S[nt][1]);
      *reinterpret_cast<uint32_t*>(&sm.sb[d0 + g + 8][cc]) = pack_bf16x2(S[nt][2], S[nt][3]);
    }
    __syncthreads();
    if constexpr (kBulk && kStages > 1) {  // past this barrier every warp is done with chunk ci-1's stage
      const int next = ci + kStages - 1;
      if (next < nchunks) load_stage_bulk(sm.st[next % kStages], &sm.full[next % kStages], fac, tile_of(next), vt, tid);
    }

    // P warps: P = W Sb, Vn = U - P.  O warps: O = Qg Sb.
    float acc[kNT][4] = {};
    {
      const bf16* a_src = o_warp ? st.qg : st.w;
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t a[4];
        ldsm_x4(a, &a_src[kda_factor_offset(r0 + ldsm_row(lane), 16 * ks + ldsm_col(lane))]);
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_trans(b, &sm.sb[16 * ks + ldsm_row(lane)][16 * np + ldsm_col(lane)]);
          mma_bf16(acc[2 * np], a, b[0], b[1]);
          mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    if (!o_warp) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = r0 + g + 8 * hr, cc = 8 * nt + 2 * t;
          const float2 uu = *reinterpret_cast<const float2*>(&st.u[kda_u_offset(r, cc)]);
          *reinterpret_cast<uint32_t*>(&sm.vn[r][cc]) =
              pack_bf16x2(uu.x - acc[nt][2 * hr], uu.y - acc[nt][2 * hr + 1]);
        }
    }
    __syncthreads();

    if (o_warp) {  // O += tril(Aqk) Vn: column blocks <= the row block only
      for (int ks = 0; ks <= (warp & 3); ++ks) {
        uint32_t a[4];
        ldsm_x4(a, &st.aqk[kda_aqk_offset(r0 + ldsm_row(lane), 16 * ks + ldsm_col(lane))]);
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_trans(b, &sm.vn[16 * ks + ldsm_row(lane)][16 * np + ldsm_col(lane)]);
          mma_bf16(acc[2 * np], a, b[0], b[1]);
          mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + g + 8 * hr;
        if (r >= L) continue;
        bf16* orow = obuf + (t0 + r) * ld_o;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          *reinterpret_cast<uint32_t*>(orow + 8 * nt + 2 * t) = pack_bf16x2(acc[nt][2 * hr], acc[nt][2 * hr + 1]);
      }
    }

    // State update: S = diag(gl) S + Kd^T Vn.
    {
      const float g0 = st.gl[d0 + g], g1 = st.gl[d0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) S[nt][0] *= g0, S[nt][1] *= g0, S[nt][2] *= g1, S[nt][3] *= g1;
#pragma unroll
      for (int ks = 0; ks < kC / 16; ++ks) {
        uint32_t a[4];  // A = Kd^T: rows d (state rows), columns = chunk rows
        ldsm_x4_trans(a, &st.kd[kda_factor_offset(16 * ks + (lane & 7) + (lane >> 4) * 8, d0 + ((lane >> 3) & 1) * 8)]);
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_trans(b, &sm.vn[16 * ks + ldsm_row(lane)][16 * np + ldsm_col(lane)]);
          mma_bf16(S[2 * np], a, b[0], b[1]);
          mma_bf16(S[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
  }

#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int cc = 8 * nt + 2 * t;
    *reinterpret_cast<float2*>(S0 + (d0 + g) * kD + cc) = make_float2(S[nt][0], S[nt][1]);
    *reinterpret_cast<float2*>(S0 + (d0 + g + 8) * kD + cc) = make_float2(S[nt][2], S[nt][3]);
  }
}

// Gated RMSNorm of the unnormalised output, one warp per (token, head): o [T, H, V] bf16 -> out bf16.
__global__ void __launch_bounds__(256) kda_gated_norm_kernel(const __grid_constant__ KdaPrefillParams p,
                                                             const bf16* __restrict__ o) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);  // token * H + head
  if (item >= static_cast<int64_t>(p.T) * p.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t tok = item / p.H;
  const int h = static_cast<int>(item % p.H), cc = h * kD + 4 * lane;
  const float4 x = load_bf16x4(o + item * kD + 4 * lane);  // the model's o is bf16 (kda_ref.h, gated_rmsnorm_ref)
  const float4 z = ldg_bf16x4(reinterpret_cast<const bf16*>(p.gz.ptr) + tok * p.gz.stride + cc);
  const float4 w = __ldg(reinterpret_cast<const float4*>(p.o_norm_w + 4 * lane));
  const float rs = rsqrtf(xor_sum<0, 4>(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w) / kD + p.norm_eps);
  store_bf16x4(reinterpret_cast<bf16*>(p.out) + tok * p.out_stride + cc,
               make_float4(x.x * rs * w.x * sigmoidf_(z.x), x.y * rs * w.y * sigmoidf_(z.y),
                           x.z * rs * w.z * sigmoidf_(z.z), x.w * rs * w.w * sigmoidf_(z.w)));
}

}  // namespace
}  // namespace dev

namespace {
template <int kStages, int kBV>
cudaError_t scan_allow_smem() {
  for (auto* kernel : {dev::kda_scan_kernel<kStages, kBV, false>, dev::kda_scan_kernel<kStages, kBV, true>})
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(sizeof(dev::ScanSmem<kStages, kBV>)));
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}
// The device's SM count; the first call on each device also raises the scan kernels' dynamic shared-memory limits
// there (smem_opt_in.h).
int scan_setup_sms() {
  static PerDeviceOnce smem_once;
  KDA_CUDA_CHECK(smem_once.run([] {
    for (cudaError_t e : {scan_allow_smem<dev::kStagesWide, 32>(), scan_allow_smem<1, 32>(),
                          scan_allow_smem<2, 64>(), scan_allow_smem<1, 64>()})
      if (e != cudaSuccess) return e;
    return cudaSuccess;
  }));
  return detail::current_device_sm_count();
}
template <int kStages, int kBV>
void launch_scan(const KdaPrefillParams& p, const KdaChunkFactors& fac, bool bulk, cudaStream_t stream) {
  const dim3 grid(kHeadDim / kBV, p.H, p.N);
  auto* kernel = bulk ? dev::kda_scan_kernel<kStages, kBV, true> : dev::kda_scan_kernel<kStages, kBV, false>;
  kernel<<<grid, dev::kThreads, sizeof(dev::ScanSmem<kStages, kBV>), stream>>>(p, fac);
}
}  // namespace

KdaScanConfig kda_prefill_scan_config(const KdaPrefillParams& p) {
  if (p.scan_vtiles != 0 || p.scan_stages != 0) {  // forced (benchmarks, tests): checked even past kda_prefill
    detail::check_forced_scan_config(p.scan_vtiles, p.scan_stages);
    return {p.scan_vtiles, p.scan_stages};
  }
  return kda_prefill_scan_config_for(static_cast<int64_t>(p.H) * p.N, scan_setup_sms());
}

void kda_prefill_scan(const KdaPrefillParams& p, Stream stream) {
  if (p.N == 0 || p.T == 0) return;
  const KdaChunkFactors fac = kda_chunk_factors(p.workspace, p.num_chunks, p.H);
  scan_setup_sms();
  const KdaScanConfig cfg = kda_prefill_scan_config(p);
  const bool bulk = detail::scan_loader_of(p.scan_loader) == kKdaScanLoaderBulk;
  if (cfg.vtiles == 2)
    cfg.stages == 1 ? launch_scan<1, 64>(p, fac, bulk, stream) : launch_scan<2, 64>(p, fac, bulk, stream);
  else
    cfg.stages == 1 ? launch_scan<1, 32>(p, fac, bulk, stream)
                    : launch_scan<dev::kStagesWide, 32>(p, fac, bulk, stream);
  KDA_CHECK_LAUNCH();
  const int64_t items = static_cast<int64_t>(p.T) * p.H;
  dev::kda_gated_norm_kernel<<<static_cast<unsigned>((items + 7) / 8), 256, 0, stream>>>(
      p, reinterpret_cast<const dev::bf16*>(fac.o));
  KDA_CHECK_LAUNCH();
}

}  // namespace ds::kda
