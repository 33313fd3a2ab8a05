// KDA chunked prefill, stage 1 (parallel over chunks x heads): fused short conv + SiLU, q/k L2 norms, gate,
// beta, in-chunk cumulative decay, the intra-chunk matrices, the UT transform and the WY factors (spec 4.1
// steps 1-4). Writes the per-(chunk, head) factors that the scan stage (kda_prefill_scan.cu) consumes.
//
// One 256-thread CTA per (chunk of 64 tokens, head); ~101 KB of shared memory so two CTAs share an SM.
//   phase 1  a warp per 8 rows: conv of q/k/v from the raw projections (the 3 taps before a sequence start come
//            from the conv-state pool), SiLU (by default z/2 (1 + tanh(z/2)): one MUFU op per value instead of
//            two; KdaPrefillParams::intra_silu), norms, gate g -> smem  (fp32 math, q^/k^/v stored bf16),
//            and each warp's running sum of g over its 8 rows
//   phase 2  Gamma = cumsum(g): the earlier warps' totals added to each warp's running sums
//   phase 3  Akk / Aqk: the six off-diagonal 16x16 blocks on tensor cores with the sub-chunk reference point
//            (q_r e^{G_r - G_n}) . (k_j e^{G_n - G_j}), n = first row of the row block, so both factors are
//            <= 1 for any decay; the four diagonal blocks as 3xTF32 mma split at their middle row (exactly in
//            fp32 where that could overflow: strong decays). A warp computes both products of its blocks, so
//            each exponential is computed once
//   phase 4  qg = q^ e^G, kd = k^ e^{G_last - G} to global; smem k^ <- e^G k^
//   phase 5  M = (I + Akk)^-1 blockwise: the 16x16 diagonal blocks in registers (a lane per column), then
//            three levels of 16x16 block products (a serial 64-row substitution took ~15 us per CTA)
//   phase 6  W = M beta (e^G k^), U = M beta v on tensor cores. The unit diagonal of M is applied in fp32
//            and only the strictly-lower part goes through bf16: a bf16 beta on the diagonal alone would add
//            ~1e-3 of relative error to U, i.e. to the output (numpy model of the rounding points: 3.4e-3
//            total instead of 3.7e-3 vs the fp32 recurrence, bar 5e-3).
#include "kernels/common/pdl.cuh"
#include "kernels/common/smem_opt_in.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_cuda_check.h"
#include "kernels/kda/kda_decode_kernel.cuh"
#include "kernels/kda/kda_device.cuh"

namespace ds::kda {
namespace dev {
namespace {

constexpr int kC = kChunk;
constexpr int kPB = kD + 8;  // bf16 row pitch 272 B: 8 rows of an ldmatrix hit 8 different bank groups
constexpr int kPG = kD + 4;  // fp32 Gamma pitch
constexpr int kPA = kC + 4;  // fp32 64x64 pitch
// Gamma (sm.gam) is kept in log2 units (phase 1 computes the gate as -A log2(1 + e^z)): every use of it is an
// exponential, which then is one ex2 with no multiply before it.
// Phase 3b's scaled-product path while the factors stay below e^60 (fp32 overflows past e^88), in log2 units.
constexpr float kDiagSpreadMax = 60.f * kLog2e;

struct IntraSmem {
  bf16 q[kC][kPB];  // q^ (normalised, scaled)
  bf16 k[kC][kPB];  // k^, then e^Gamma k^ (phase 4)
  bf16 v[kC][kPB];  // conv output v
  union {
    float gam[kC][kPG];  // g summed from each warp's first row (phase 1), then Gamma (phase 2); log2 units
    struct {
      float m[kC][kPA];           // M - I, M = (I + Akk)^-1 (phase 5; Gamma is dead by then)
      float tmp[3][16][17];       // block products of the blocked inversion
    };
  };
  union {
    float akk[kC][kPA];  // strictly lower part used only (phase 3 on)
    struct {
      // Phase 1: the head's conv taps in fp32, [q|k|v][tap][4-channel group], so a lane's 4 channels of one tap
      // are one conflict-free float4 (L1 holds little beside the shared memory of two CTAs: per-row reloads of
      // the taps came from L2; stored as bf16 they cost an unpack per tap and row).
      float4 cw[3][kConvWidth][kD / 4];
      float gsum[8][kD];  // phases 1-2: each warp's sum of g over its 8 rows
    };
  };
  float beta[kC];
};

// Largest n in [0, N) with chunk_offsets[n] <= c: the sequence owning chunk c (empty sequences own none).
__device__ int find_sequence(const int32_t* chunk_offsets, int N, int c) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (chunk_offsets[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float4 scale4(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
__device__ __forceinline__ float4 mask4(float4 a, unsigned m) {
  return make_float4(__uint_as_float(__float_as_uint(a.x) & m), __uint_as_float(__float_as_uint(a.y) & m),
                     __uint_as_float(__float_as_uint(a.z) & m), __uint_as_float(__float_as_uint(a.w) & m));
}
// Rounded to bf16 and back, two values per conversion (round to nearest even, as __float2bfloat16).
__device__ __forceinline__ float4 round_bf16x4(float4 v) {
  const float2 a = unpack_bf16x2(pack_bf16x2(v.x, v.y)), b = unpack_bf16x2(pack_bf16x2(v.z, v.w));
  return make_float4(a.x, a.y, b.x, b.y);
}

// The L2-norm scales rsqrt(ss + 1e-6) * post of a pass's 4 rows, every lane holding a part of each row's ss: a
// reduce-scatter (a round sends half of what a lane still holds, so after 6 shuffles lane l has row
// 2 * bit4(l) + bit3(l)'s total), the rsqrt once per row, then a broadcast: 10 shuffles and 1 MUFU op per lane
// instead of 20 and 4 for a butterfly per row.
__device__ __forceinline__ void norm_scales4(const float (&ss)[4], int lane, float post, float (&scale)[4]) {
  const bool h4 = lane & 16, h3 = lane & 8;
  float k0 = h4 ? ss[2] : ss[0], k1 = h4 ? ss[3] : ss[1];
  const float x0 = h4 ? ss[0] : ss[2], x1 = h4 ? ss[1] : ss[3];
  k0 += __shfl_xor_sync(0xffffffffu, x0, 16);
  k1 += __shfl_xor_sync(0xffffffffu, x1, 16);
  float k = h3 ? k1 : k0;
  k += __shfl_xor_sync(0xffffffffu, h3 ? k0 : k1, 8);
  k = xor_sum<0, 2>(k);
  const float r = rsqrtf(k + 1e-6f) * post;
#pragma unroll
  for (int i = 0; i < 4; ++i) scale[i] = __shfl_sync(0xffffffffu, r, 16 * (i >> 1) + 8 * (i & 1));
}

// log2(1 + e^z) from zl = z log2(e): PyTorch's softplus (threshold 20) in log2 units, so that the gate in log2
// units is -exp(A_log) times it, with no ln 2 multiply. Below z = -15, where softplusf_ switches to e^z, this keeps
// the lg2's ~2e-7 absolute error of the range above (the gate's cumulative sum does not see that level).
__device__ __forceinline__ float softplus_log2(float zl) {
  const float l = lg2_ftz(1.0f + ex2_ftz(zl));
  return zl > 20.0f * kLog2e ? zl : l;
}

// Off-diagonal blocks (nb, mb0 .. mb0 + kBlocks - 1) of Aqk and Akk (beta applied), nb > every mb, with the
// sub-chunk reference point rref = 16 nb: (q_r e^{G_r - G_rref}) . (k_j e^{G_rref - G_j}), both factors <= 1. The
// row block's factors (the A operands) are computed once per k step and serve every column block.
template <int kBlocks>
__device__ __forceinline__ void offdiag_blocks(IntraSmem& sm, bf16* aqk, int nb, int mb0, int g, int t) {
  const int rref = 16 * nb;
  float accq[kBlocks][2][4] = {}, acck[kBlocks][2][4] = {};
#pragma unroll 2
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t aq[4], ak[4];
#pragma unroll
    for (int hc = 0; hc < 2; ++hc) {
      const int d = 16 * ks + 2 * t + 8 * hc;
      const float2 gr = *reinterpret_cast<const float2*>(&sm.gam[rref][d]);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = rref + g + 8 * hr;
        const float2 gv = *reinterpret_cast<const float2*>(&sm.gam[r][d]);
        const float e0 = ex2_ftz(gv.x - gr.x), e1 = ex2_ftz(gv.y - gr.y);  // <= 1
        const float2 qv = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.q[r][d]));
        const float2 kv = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.k[r][d]));
        aq[hr + 2 * hc] = pack_bf16x2(qv.x * e0, qv.y * e1);
        ak[hr + 2 * hc] = pack_bf16x2(kv.x * e0, kv.y * e1);
      }
    }
#pragma unroll
    for (int bi = 0; bi < kBlocks; ++bi)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = 16 * (mb0 + bi) + 8 * nt + g;
        uint32_t b[2];
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          const int d = 16 * ks + 2 * t + 8 * hc;
          const float2 gr = *reinterpret_cast<const float2*>(&sm.gam[rref][d]);
          const float2 gv = *reinterpret_cast<const float2*>(&sm.gam[j][d]);
          const float2 kv = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.k[j][d]));
          b[hc] = pack_bf16x2(kv.x * ex2_ftz(gr.x - gv.x), kv.y * ex2_ftz(gr.y - gv.y));  // <= 1
        }
        mma_bf16(accq[bi][nt], aq, b[0], b[1]);
        mma_bf16(acck[bi][nt], ak, b[0], b[1]);
      }
  }
#pragma unroll
  for (int bi = 0; bi < kBlocks; ++bi)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = rref + g + 8 * hr, j = 16 * (mb0 + bi) + 8 * nt + 2 * t;
        *reinterpret_cast<uint32_t*>(aqk + kda_aqk_offset(r, j)) =
            pack_bf16x2(accq[bi][nt][2 * hr], accq[bi][nt][2 * hr + 1]);
        sm.akk[r][j] = sm.beta[r] * acck[bi][nt][2 * hr];
        sm.akk[r][j + 1] = sm.beta[r] * acck[bi][nt][2 * hr + 1];
      }
}

template <bool kTanhSilu>
__global__ void __launch_bounds__(256, 2)
    kda_intra_kernel(const __grid_constant__ KdaPrefillParams p, const __grid_constant__ KdaChunkFactors fac) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  IntraSmem& sm = *reinterpret_cast<IntraSmem*>(smem_raw);
  const int c = blockIdx.x, h = blockIdx.y, H = p.H, P = H * kD;
  const int n = find_sequence(p.chunk_offsets, p.N, c);
  const int seq0 = p.cu_seqlens[n], seq1 = p.cu_seqlens[n + 1];
  const int t0 = seq0 + (c - p.chunk_offsets[n]) * kC;
  const int L = min(kC, seq1 - t0);
  const int slot = p.slot_ids[n];
  if (slot < 0) return;  // padding sequence: the scan zeroes its output and reads no factors
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const size_t tile = static_cast<size_t>(c) * H + h;
  const int64_t row3 = 3 * static_cast<int64_t>(P);
  long long phase_t0 = p.intra_phase_cycles && tid == 0 ? clock64() : 0;
  auto phase_end = [&](int i) {  // after a barrier: every warp has finished phase i
    if (p.intra_phase_cycles && tid == 0) {
      const long long now = clock64();
      atomicAdd(p.intra_phase_cycles + i, static_cast<unsigned long long>(now - phase_t0));
      phase_t0 = now;
    }
  };

  // ---- phase 1: a warp per 8 consecutive rows, 4 channels per lane -----------------------------------------
  // The conv window slides down the warp's rows: a pass of kPass rows loads its kPass + 3 input rows once
  // (every load of the pass issued before the first use). A pass has no per-row branch: its rows' shuffle
  // reductions and MUFU chains interleave (rows past the chunk's end compute on zeros and are masked).
  {
    constexpr int kPass = 4, kWin = kPass + kConvWidth - 1;
    const bf16* conv_w = reinterpret_cast<const bf16*>(p.conv_w);
    const bf16* cpool = reinterpret_cast<const bf16*>(p.conv_pool) + static_cast<size_t>(slot) * kConvRows * row3;
    const int cc = 4 * lane;
    // The taps of (which, channel) e = tid and tid + 256: loaded here, stored to sm.cw only after the first
    // pass has issued its window loads, so the two global latencies overlap instead of adding up.
    constexpr int kTapIters = (3 * kD + 255) / 256;
    float4 taps[kTapIters];
#pragma unroll
    for (int i = 0; i < kTapIters; ++i) {
      const int e = tid + 256 * i;
      taps[i] = e < 3 * kD ? ldg_bf16x4(conv_w + (static_cast<size_t>(e / kD) * P + h * kD + e % kD) * kConvWidth)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float negA = -expf(p.A_log[h]);  // g in log2 units: -A log2(1 + e^z), z = f + dt
    const float4 dt = *reinterpret_cast<const float4*>(p.dt_bias + h * kD + cc);
    const float4 dtl = scale4(dt, kLog2e);  // z log2(e) = f log2(e) + dt log2(e): one FFMA
    const bf16* xin[3] = {reinterpret_cast<const bf16*>(p.q.ptr), reinterpret_cast<const bf16*>(p.k.ptr),
                          reinterpret_cast<const bf16*>(p.v.ptr)};
    const int64_t xst[3] = {p.q.stride, p.k.stride, p.v.stride};
    const bf16* fin = reinterpret_cast<const bf16*>(p.f.ptr) + h * kD + cc;
    const bf16* bin = reinterpret_cast<const bf16*>(p.beta_logits.ptr) + h;
    float4 gs = make_float4(0.f, 0.f, 0.f, 0.f);  // running sum of g over the warp's rows (cumsum, phase 2)
#pragma unroll 1
    for (int r0 = 8 * warp; r0 < 8 * warp + 8; r0 += kPass) {
      uint2 xw[3][kWin], fw[kPass];
      const int tw = t0 + r0 - (kConvWidth - 1);  // token of the window's first row
      if (tw >= seq0 && r0 + kPass <= L) {  // warp-uniform: the window inside the sequence (all but its edges)
#pragma unroll
        for (int which = 0; which < 3; ++which) {
          const bf16* src = xin[which] + static_cast<int64_t>(tw) * xst[which] + h * kD + cc;
#pragma unroll
          for (int j = 0; j < kWin; ++j) xw[which][j] = __ldg(reinterpret_cast<const uint2*>(src + j * xst[which]));
        }
        const bf16* src = fin + static_cast<int64_t>(t0 + r0) * p.f.stride;
#pragma unroll
        for (int i = 0; i < kPass; ++i) fw[i] = __ldg(reinterpret_cast<const uint2*>(src + i * p.f.stride));
      } else {  // rows before the sequence start come from the conv state; rows past the chunk's end are zero
#pragma unroll
        for (int j = 0; j < kWin; ++j) {
          const int lr = r0 - (kConvWidth - 1) + j, tt = t0 + lr;
#pragma unroll
          for (int which = 0; which < 3; ++which) {
            const bf16* src = tt >= seq0 ? xin[which] + tt * xst[which] + h * kD + cc
                                         : cpool + (kConvWidth - 1 + tt - seq0) * row3 + which * P + h * kD + cc;
            xw[which][j] = lr < L ? __ldg(reinterpret_cast<const uint2*>(src)) : make_uint2(0u, 0u);
          }
        }
#pragma unroll
        for (int i = 0; i < kPass; ++i) {
          const int tok = t0 + r0 + i;
          fw[i] = r0 + i < L ? __ldg(reinterpret_cast<const uint2*>(fin + tok * p.f.stride)) : make_uint2(0u, 0u);
        }
      }
      // Lane i < kPass: the beta logit of row r0 + i.
      const float bl = lane < kPass && r0 + lane < L ? __bfloat162float(bin[(t0 + r0 + lane) * p.beta_logits.stride])
                                                     : 0.f;
      if (r0 == 8 * warp) {
        // The second pass's 4 new window rows of q/k/v and its 4 f rows (16 rows of 256 bytes, 32 lines: one
        // per lane) start towards L2 now, so its loads after this pass's math do not wait on DRAM.
        const int which = lane >> 3, row = r0 + kPass + ((lane >> 1) & 3);
        if (row < L) {  // selects, not xin[which]: a lane-dependent index would put the arrays on the stack
          const bf16* x0 = which == 0   ? xin[0]
                           : which == 1 ? xin[1]
                           : which == 2 ? xin[2]
                                        : reinterpret_cast<const bf16*>(p.f.ptr);
          const int64_t st = which == 0 ? xst[0] : which == 1 ? xst[1] : which == 2 ? xst[2] : p.f.stride;
          pdl::prefetch_l2(x0 + static_cast<int64_t>(t0 + row) * st + h * kD + 64 * (lane & 1));
        }
#pragma unroll
        for (int i = 0; i < kTapIters; ++i) {  // (which, channel): its 4 taps as fp32
          const int e = tid + 256 * i;
          if (e < 3 * kD) {
            float* dst = reinterpret_cast<float*>(&sm.cw[e / kD][0][(e % kD) / 4]) + e % 4;
            dst[0 * kD] = taps[i].x;
            dst[1 * kD] = taps[i].y;
            dst[2 * kD] = taps[i].z;
            dst[3 * kD] = taps[i].w;
          }
        }
        __syncthreads();  // sm.cw (the window loads above stay in flight)
      }
#pragma unroll
      for (int which = 0; which < 3; ++which) {
        float4 w[kConvWidth], x[kWin], y[kPass];
#pragma unroll
        for (int tap = 0; tap < kConvWidth; ++tap) w[tap] = sm.cw[which][tap][lane];
#pragma unroll
        for (int j = 0; j < kWin; ++j) x[j] = bf16x4_to_float4(xw[which][j]);
#pragma unroll
        for (int i = 0; i < kPass; ++i) {
          const float4 a = x[i], b = x[i + 1], c4 = x[i + 2], d = x[i + 3];
          auto tapsum = [&](float w0, float w1, float w2, float w3, float s0, float s1, float s2, float s3) {
            const float z = w0 * s0 + w1 * s1 + w2 * s2 + w3 * s3;
            return kTanhSilu ? silu_tanh(z) : siluf_(z);
          };
          y[i] = make_float4(tapsum(w[0].x, w[1].x, w[2].x, w[3].x, a.x, b.x, c4.x, d.x),
                             tapsum(w[0].y, w[1].y, w[2].y, w[3].y, a.y, b.y, c4.y, d.y),
                             tapsum(w[0].z, w[1].z, w[2].z, w[3].z, a.z, b.z, c4.z, d.z),
                             tapsum(w[0].w, w[1].w, w[2].w, w[3].w, a.w, b.w, c4.w, d.w));
        }
        // A row past the chunk's end sees the last rows through its taps: zeroed by a zero norm scale (q, k) or a
        // bit mask (v), never a select around the MUFU chains (that compiled to a branch per row, which kept the
        // rows from interleaving).
        if (which < 2) {  // q and k: rounded to bf16 before their L2 norms (v only by its bf16 store)
          float ss[kPass], sc[kPass];
#pragma unroll
          for (int i = 0; i < kPass; ++i) {
            y[i] = round_bf16x4(y[i]);
            ss[i] = y[i].x * y[i].x + y[i].y * y[i].y + y[i].z * y[i].z + y[i].w * y[i].w;
          }
          static_assert(kPass == 4, "norm_scales4 reduces 4 rows");
          norm_scales4(ss, lane, which == 0 ? rsqrtf(static_cast<float>(kD)) : 1.f, sc);
#pragma unroll
          for (int i = 0; i < kPass; ++i) y[i] = scale4(y[i], r0 + i < L ? sc[i] : 0.f);
        } else {
#pragma unroll
          for (int i = 0; i < kPass; ++i) y[i] = mask4(y[i], r0 + i < L ? 0xffffffffu : 0u);
        }
        bf16(*dst)[kPB] = which == 0 ? sm.q : which == 1 ? sm.k : sm.v;
#pragma unroll
        for (int i = 0; i < kPass; ++i) store_bf16x4(&dst[r0 + i][cc], y[i]);
      }
#pragma unroll
      for (int i = 0; i < kPass; ++i) {  // gate; rows past the end get g = 0, so Gamma stays at its last value
        const float4 f = bf16x4_to_float4(fw[i]);
        const float sc = r0 + i < L ? negA : 0.f;
        gs.x += sc * softplus_log2(fmaf(f.x, kLog2e, dtl.x));
        gs.y += sc * softplus_log2(fmaf(f.y, kLog2e, dtl.y));
        gs.z += sc * softplus_log2(fmaf(f.z, kLog2e, dtl.z));
        gs.w += sc * softplus_log2(fmaf(f.w, kLog2e, dtl.w));
        *reinterpret_cast<float4*>(&sm.gam[r0 + i][cc]) = gs;
      }
      if (lane < kPass) sm.beta[r0 + lane] = r0 + lane < L ? sigmoidf_(bl) : 0.f;
    }
    *reinterpret_cast<float4*>(&sm.gsum[warp][cc]) = gs;
  }
  __syncthreads();
  phase_end(0);

  // ---- phase 2: Gamma = cumsum(g): warp w's rows hold the sums from row 8w; add warps 0..w-1's totals -----
  bf16* aqk = reinterpret_cast<bf16*>(fac.aqk) + tile * kKdaAqkTile;  // swizzled rows (kda_aqk_offset)
  {
    const int cc = tid & (kD - 1), w0 = tid < kD ? 1 : 4, w1 = tid < kD ? 4 : 8;  // two threads per channel
    float base = 0.f;
    for (int w = 0; w < w0; ++w) base += sm.gsum[w][cc];
    for (int w = w0; w < w1; ++w) {
#pragma unroll
      for (int r = 8 * w; r < 8 * w + 8; ++r) sm.gam[r][cc] += base;
      base += sm.gsum[w][cc];
    }
  }
  __syncthreads();
  phase_end(1);

  // ---- phase 3: Aqk and Akk. Warps 0-3: diagonal block `warp`, both products; warps 4-7: the six off-diagonal
  // blocks (row block nb > column block mb), two of one row block per warp where they pair up ----------------------
  // Each exponential is computed once per warp that needs it and shared by the q and k products: the row factors of
  // a diagonal block (and its column factors) serve Aqk and Akk alike, and an off-diagonal row block's factors
  // serve both of its column blocks in one warp. (One warp per product and block computed them up to twice.)
  if (warp < 4) {
    // e^{G_r - G_j} = e^{G_r - G_m} e^{G_m - G_j} with m the block's middle row: the scaled rows are then a plain
    // product, run as 3xTF32 mma (~fp32 accuracy) instead of an exp per (r, j, d). The two factors are bounded
    // by e^{spread} (the block's largest decay from its middle to either end); where that could overflow fp32
    // (a strong decay), the block runs the exact per-pair loop instead.
    const int o = 16 * warp, m = o + 8;
    float spread = 0.f;
    for (int d = lane; d < kD; d += 32)
      spread = fmaxf(spread, fmaxf(sm.gam[o][d] - sm.gam[m][d], sm.gam[m][d] - sm.gam[o + 15][d]));
    spread = xor_max<0, 4>(spread);
    if (spread < kDiagSpreadMax) {
      float accq[2][4] = {}, acck[2][4] = {};
#pragma unroll 2
      for (int ks = 0; ks < kD / 8; ++ks) {
        const int d0 = 8 * ks + t, d1 = d0 + 4;
        const float gm0 = sm.gam[m][d0], gm1 = sm.gam[m][d1];
        uint32_t qhi[4], qlo[4], khi[4], klo[4];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = o + g + 8 * hr;
          const float e0 = ex2_ftz(sm.gam[r][d0] - gm0), e1 = ex2_ftz(sm.gam[r][d1] - gm1);
          split_tf32(__bfloat162float(sm.q[r][d0]) * e0, qhi[hr], qlo[hr]);
          split_tf32(__bfloat162float(sm.q[r][d1]) * e1, qhi[2 + hr], qlo[2 + hr]);
          split_tf32(__bfloat162float(sm.k[r][d0]) * e0, khi[hr], klo[hr]);
          split_tf32(__bfloat162float(sm.k[r][d1]) * e1, khi[2 + hr], klo[2 + hr]);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int j = o + 8 * nt + g;
          uint32_t bhi0, blo0, bhi1, blo1;
          split_tf32(__bfloat162float(sm.k[j][d0]) * ex2_ftz(gm0 - sm.gam[j][d0]), bhi0, blo0);
          split_tf32(__bfloat162float(sm.k[j][d1]) * ex2_ftz(gm1 - sm.gam[j][d1]), bhi1, blo1);
          mma3_tf32_split(accq[nt], qhi, qlo, bhi0, bhi1, blo0, blo1);
          mma3_tf32_split(acck[nt], khi, klo, bhi0, bhi1, blo0, blo1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = o + g + 8 * (e >> 1), j = o + 8 * nt + 2 * t + (e & 1);
          if (j < r) sm.akk[r][j] = sm.beta[r] * acck[nt][e];
          aqk[kda_aqk_offset(r, j)] = __float2bfloat16(j <= r ? accq[nt][e] : 0.f);  // upper triangle: zero
        }
    } else {
      for (int pi = lane; pi < 136; pi += 32) {  // exact: (rl, q) the q-th pair of row rl, q <= rl
        int q = pi, rl = 0;
        while (q > rl) q -= ++rl;
        const int r = o + rl, j = o + q;
        float sq = 0.f, sk = 0.f;
#pragma unroll 4
        for (int dd = 0; dd < kD; dd += 2) {
          const int d = (dd + 4 * lane) & (kD - 1);  // staggered start: fewer bank conflicts between lanes
          const float2 gr = *reinterpret_cast<const float2*>(&sm.gam[r][d]);
          const float2 gj = *reinterpret_cast<const float2*>(&sm.gam[j][d]);
          const float2 qr = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.q[r][d]));
          const float2 kr = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.k[r][d]));
          const float2 kj = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&sm.k[j][d]));
          const float e0 = kj.x * ex2_ftz(gr.x - gj.x), e1 = kj.y * ex2_ftz(gr.y - gj.y);  // <= 1 (j <= r)
          sq += qr.x * e0 + qr.y * e1;
          sk += kr.x * e0 + kr.y * e1;
        }
        if (j < r) sm.akk[r][j] = sm.beta[r] * sk;
        aqk[kda_aqk_offset(r, j)] = __float2bfloat16(sq);
      }
      for (int pi = lane; pi < 256; pi += 32)  // the block's upper triangle of Aqk: zero
        if ((pi & 15) > (pi >> 4)) aqk[kda_aqk_offset(o + (pi >> 4), o + (pi & 15))] = __float2bfloat16(0.f);
    }
  } else {
    const int w = warp - 4;  // (nb, mb): w 0 -> (3, 0), (3, 1); w 1 -> (2, 0), (2, 1); w 2 -> (3, 2); w 3 -> (1, 0)
    const int nb = w == 0 || w == 2 ? 3 : w == 1 ? 2 : 1;
    if (w < 2) {
      offdiag_blocks<2>(sm, aqk, nb, 0, g, t);
    } else {
      // The zero blocks above the diagonal of Aqk, 16 bytes at a time: row block 0's chunks 2-7 (96), row
      // block 1's 4-7 (64), row block 2's 6-7 (32).
      for (int e = lane + 32 * (w - 2); e < 192; e += 64) {
        const int r = e < 96 ? e / 6 : e < 160 ? 16 + (e - 96) / 4 : 32 + (e - 160) / 2;
        const int ch = e < 96 ? 2 + e % 6 : e < 160 ? 4 + (e - 96) % 4 : 6 + (e - 160) % 2;
        *reinterpret_cast<uint4*>(aqk + kda_aqk_offset(r, 8 * ch)) = make_uint4(0u, 0u, 0u, 0u);
      }
      offdiag_blocks<1>(sm, aqk, nb, w == 2 ? 2 : 0, g, t);
    }
  }
  __syncthreads();
  phase_end(2);

  // ---- phase 4: qg, kd, gl to global; k^ <- e^Gamma k^ in place ---------------------------------------------
  {
    bf16* qg = reinterpret_cast<bf16*>(fac.qg) + tile * kKdaFactorTile;  // swizzled rows (kda_factor_offset)
    bf16* kd = reinterpret_cast<bf16*>(fac.kd) + tile * kKdaFactorTile;
    for (int e = tid; e < kC * (kD / 4); e += 256) {
      const int r = e / (kD / 4), cc = (e % (kD / 4)) * 4;
      const float4 gm = *reinterpret_cast<const float4*>(&sm.gam[r][cc]);
      const float4 gl = *reinterpret_cast<const float4*>(&sm.gam[kC - 1][cc]);
      const float4 q4 = load_bf16x4(&sm.q[r][cc]), k4 = load_bf16x4(&sm.k[r][cc]);
      const float4 eg = make_float4(ex2_ftz(gm.x), ex2_ftz(gm.y), ex2_ftz(gm.z), ex2_ftz(gm.w));
      const int o = kda_factor_offset(r, cc);
      store_bf16x4(qg + o, make_float4(q4.x * eg.x, q4.y * eg.y, q4.z * eg.z, q4.w * eg.w));
      store_bf16x4(kd + o, make_float4(k4.x * ex2_ftz(gl.x - gm.x), k4.y * ex2_ftz(gl.y - gm.y),
                                       k4.z * ex2_ftz(gl.z - gm.z), k4.w * ex2_ftz(gl.w - gm.w)));
      store_bf16x4(&sm.k[r][cc], make_float4(k4.x * eg.x, k4.y * eg.y, k4.z * eg.z, k4.w * eg.w));
    }
    if (tid < kD) fac.gl[tile * kD + tid] = ex2_ftz(sm.gam[kC - 1][tid]);
  }
  __syncthreads();
  phase_end(3);

  // ---- phase 5: M = (I + Akk)^-1 by blocks of 16 (sm.m holds M - I) ------------------------------------------
  // (a) the four diagonal blocks, one column per lane (warps 0-1): column c of a unit lower-triangular
  //     inverse is m_r = -sum_{j<r} A[r][j] m_j (m_c = 1, m_r = 0 above), all in registers.
  if (warp < 2) {
    const int b = 2 * warp + (lane >> 4), c = lane & 15, o = 16 * b;
    float mc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < r; ++j) acc += sm.akk[o + r][o + j] * mc[j];
      mc[r] = r < c ? 0.f : r == c ? 1.f : -acc;
      sm.m[o + r][o + c] = r > c ? mc[r] : 0.f;
    }
  }
  // (b) block rows i = 1..3, a warp per (i, j < i): T = sum_{k=j}^{i-1} A_ik (M_kj + [k = j] I), then
  //     M_ij = -(I + M_ii) T; both 16x16x16 products as 3xTF32 mma (~fp32), T through sm.tmp[j] between them,
  //     so a level needs one barrier (the CUDA-core version took two and 8k cycles per CTA for the phase).
  for (int i = 1; i < 4; ++i) {
    __syncthreads();
    if (warp < i) {
      const int j = warp;
      Mma3Acc tacc[2];
      for (int k = j; k < i; ++k)
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          const int c0 = 16 * k + 8 * ks + t;  // columns of A_ik, rows of M_kj: c0 and c0 + 4
          const float a[4] = {sm.akk[16 * i + g][c0], sm.akk[16 * i + g + 8][c0], sm.akk[16 * i + g][c0 + 4],
                              sm.akk[16 * i + g + 8][c0 + 4]};
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int n = 16 * j + 8 * nt + g;
            mma3_tf32(tacc[nt], a, sm.m[c0][n] + (c0 == n ? 1.f : 0.f), sm.m[c0 + 4][n] + (c0 + 4 == n ? 1.f : 0.f));
          }
        }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sm.tmp[j][g + 8 * (e >> 1)][8 * nt + 2 * t + (e & 1)] = tacc[nt].value(e);
      __syncwarp();
      Mma3Acc racc[2];
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int c0 = 8 * ks + t, o = 16 * i;  // columns of M_ii, rows of T
        const float a[4] = {sm.m[o + g][o + c0] + (g == c0 ? 1.f : 0.f),
                            sm.m[o + g + 8][o + c0] + (g + 8 == c0 ? 1.f : 0.f),
                            sm.m[o + g][o + c0 + 4] + (g == c0 + 4 ? 1.f : 0.f),
                            sm.m[o + g + 8][o + c0 + 4] + (g + 8 == c0 + 4 ? 1.f : 0.f)};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) mma3_tf32(racc[nt], a, sm.tmp[j][c0][8 * nt + g], sm.tmp[j][c0 + 4][8 * nt + g]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sm.m[16 * i + g + 8 * (e >> 1)][16 * j + 8 * nt + 2 * t + (e & 1)] = -racc[nt].value(e);
    }
  }
  __syncthreads();
  phase_end(4);

  // ---- phase 6: W (warps 0-3) / U (warps 4-7), 16 rows x 128 columns per warp ---------------------------------
  {
    const bool is_u = warp >= 4;
    const int rb = warp & 3;
    bf16(*src)[kPB] = is_u ? sm.v : sm.k;
    float acc[16][4] = {};
    for (int ks = 0; ks <= rb; ++ks) {
      uint32_t a[4];  // (M - I) diag(beta), rows 16rb + g (+8), columns 16ks + 2t (+1) (+8)
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {
        const int j = 16 * ks + 2 * t + 8 * hc;
        const float b0 = sm.beta[j], b1 = sm.beta[j + 1];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const float2 mv = *reinterpret_cast<const float2*>(&sm.m[16 * rb + g + 8 * hr][j]);
          a[hr + 2 * hc] = pack_bf16x2(mv.x * b0, mv.y * b1);
        }
      }
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t b[4];
        ldsm_x4_trans(b, &src[16 * ks + ldsm_row(lane)][16 * np + ldsm_col(lane)]);
        mma_bf16(acc[2 * np], a, b[0], b[1]);
        mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
    // The store loop once per output (W or U): with the choice inside it, each of the 32 stores sat in its own
    // branch, which kept them from interleaving and recomputed 64-bit addresses per store.
    auto store_rows = [&](auto store) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 16 * rb + g + 8 * hr;
        const float br = sm.beta[r];
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          const int cc = 8 * nt + 2 * t;
          const float2 diag = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(&src[r][cc]));
          store(r, cc, acc[nt][2 * hr] + br * diag.x, acc[nt][2 * hr + 1] + br * diag.y);
        }
      }
    };
    if (is_u) {
      float* u = fac.u + tile * kKdaUTile;
      store_rows([&](int r, int cc, float x0, float x1) {
        *reinterpret_cast<float2*>(u + kda_u_offset(r, cc)) = make_float2(x0, x1);
      });
    } else {
      bf16* w = reinterpret_cast<bf16*>(fac.w) + tile * kKdaFactorTile;
      store_rows([&](int r, int cc, float x0, float x1) {
        *reinterpret_cast<uint32_t*>(w + kda_factor_offset(r, cc)) = pack_bf16x2(x0, x1);
      });
    }
  }
  if (p.intra_phase_cycles) {  // the W/U phase ends with the kernel: one more barrier, profiling only
    __syncthreads();
    phase_end(5);
  }
}

}  // namespace
}  // namespace dev

void kda_prefill_intra(const KdaPrefillParams& p, Stream stream) {
  if (p.num_chunks == 0) return;
  const int silu = detail::intra_silu_of(p.intra_silu);
  static PerDeviceOnce smem_exact, smem_tanh;
  const auto kernel = silu == kKdaSiluTanh ? dev::kda_intra_kernel<true> : dev::kda_intra_kernel<false>;
  KDA_CUDA_CHECK(opt_in_dynamic_smem(silu == kKdaSiluTanh ? smem_tanh : smem_exact, kernel, sizeof(dev::IntraSmem)));
  const KdaChunkFactors fac = kda_chunk_factors(p.workspace, p.num_chunks, p.H);
  const dim3 grid(p.num_chunks, p.H);
  kernel<<<grid, 256, sizeof(dev::IntraSmem), stream>>>(p, fac);
  KDA_CHECK_LAUNCH();
}

}  // namespace ds::kda
