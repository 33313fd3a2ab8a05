// KDA decode kernel template (one token per sequence, fused conv -> gate -> norms -> in-place delta-rule
// update -> gated RMSNorm) and its launcher. Instantiated by kda_decode.cu (many-heads) and
// kda_decode_compact*.cu (compact-heads, one instantiation per supported head count).
//
// Work split. A warp owns 16 V columns x all 128 K rows of one head's fp32 state: each lane holds a 16-row x
// 4-column slab (16 float4 = 64 registers; rows rg + 8i, rg = lane / 4), loads it with 16 independent 16-byte
// loads issued right after the slot id is known, and reduces over rows with 3 shuffles. The V columns of a
// head are spread over kSplit CTAs of 8 / kSplit warps each:
//   many-heads   kSplit = 1: one 256-thread CTA per (sequence, head); the RMSNorm over V is CTA-local.
//   compact-heads kFixedHeads = H: kSplit = compact_split(H) CTAs per head form a thread-block cluster and
//                exchange the RMSNorm partial sums through distributed shared memory. Chosen so that one
//                sequence already launches ~96-128 CTAs (H * kSplit), i.e. most of the 132 SMs stream state
//                at N = 1, at the cost of kSplit-fold redundant q/k conv + norm work per head.
#pragma once

#include "kernels/common/pdl.cuh"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_cuda_check.h"
#include "kernels/kda/kda_device.cuh"

namespace ds::kda {

// CTAs per head of the compact layout for H heads: H * split is 96..128 CTAs for one sequence (>= 64 for
// every H >= 8), never more than 8 (the portable cluster size).
constexpr int compact_split(int H) { return H <= 16 ? 8 : H <= 32 ? 4 : H <= 64 ? 2 : 1; }

namespace dev {

constexpr int kD = kHeadDim;
constexpr int kConvRows = kConvWidth - 1;

// Conv (4 taps, oldest first) of 4 consecutive channels starting at `ch` (of 3P), then SiLU, rounded to bf16.
__device__ __forceinline__ float4 conv4_silu(const bf16* conv_w, int ch, float4 s0, float4 s1, float4 s2,
                                             float4 x) {
  const uint4* wp = reinterpret_cast<const uint4*>(conv_w + static_cast<size_t>(ch) * kConvWidth);
  const uint4 wa = wp[0], wb = wp[1];  // channels ch, ch+1 | ch+2, ch+3; 4 taps each
  const uint32_t wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
  const float sv0[4] = {s0.x, s0.y, s0.z, s0.w}, sv1[4] = {s1.x, s1.y, s1.z, s1.w};
  const float sv2[4] = {s2.x, s2.y, s2.z, s2.w}, xv[4] = {x.x, x.y, x.z, x.w};
  float y[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 w01 = unpack_bf16x2(wv[2 * e]), w23 = unpack_bf16x2(wv[2 * e + 1]);
    const float acc = w01.x * sv0[e] + w01.y * sv1[e] + w23.x * sv2[e] + w23.y * xv[e];
    y[e] = round_bf16(siluf_(acc));
  }
  return make_float4(y[0], y[1], y[2], y[3]);
}

// The q/k L2 norms (eps 1e-6 inside the sqrt; q also scaled by K^-0.5) and q^.k^, from the conv outputs in
// shared memory; each lane reads 4 channels, so one warp covers the 128 and every lane gets the result.
struct QkNorms {
  float rq, rk, qk;
};
__device__ __forceinline__ QkNorms qk_norms(const float* q, const float* k, int lane) {
  const float4 q4 = *reinterpret_cast<const float4*>(q + 4 * lane);
  const float4 k4 = *reinterpret_cast<const float4*>(k + 4 * lane);
  const float sq = xor_sum<0, 4>(q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w);
  const float sk = xor_sum<0, 4>(k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w);
  const float sqk = xor_sum<0, 4>(q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w);
  const float rq = rsqrtf(sq + 1e-6f) * rsqrtf(static_cast<float>(kD));
  const float rk = rsqrtf(sk + 1e-6f);
  return {rq, rk, sqk * rq * rk};
}

template <int kSplit, int kHeads>
__global__ void __launch_bounds__(256 / kSplit, 2 * kSplit)
    kda_decode_kernel(const __grid_constant__ KdaDecodeParams p) {
  constexpr int kWarps = 8 / kSplit;
  constexpr int kThreads = 32 * kWarps;
  constexpr int kBV = kD / kSplit;                  // V columns of this CTA
  constexpr int kConvJobs = 64 + kBV / 4;           // 4-channel groups: 32 q, 32 k, kBV/4 v
  const int H = kHeads > 0 ? kHeads : p.H;
  const int P = H * kD;
  const int rank = kSplit > 1 ? static_cast<int>(blockIdx.x) % kSplit : 0;  // == cluster rank
  const int nh = static_cast<int>(blockIdx.x) / kSplit;
  const int h = nh % H, n = nh / H;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = lane >> 2, cq = lane & 3;
  const int lcol = warp * 16 + cq * 4;  // first of this lane's 4 V columns within the CTA
  const int col = rank * kBV + lcol;    // ... within the head

  __shared__ __align__(16) float s_q[kD], s_k[kD], s_alpha[kD], s_v[kBV];
  __shared__ float s_part[kWarps];
  __shared__ float s_cta_ss;  // sum of o^2 over this CTA's columns (read by the cluster)
  __shared__ float s_beta;

  // Programmatic dependent launch: let the next kernel get scheduled now; wait for the previous one (it
  // writes our inputs) before the first read. Hides the ~1-2 us launch gap of back-to-back small calls. With
  // qkv_ready only f and gz come from the previous kernel: the slot id, the state and the q/k/v conv (the
  // kernel's longest chain of memory latencies) run before the wait, overlapping the f_b/g_b GEMV.
  pdl::launch_dependents();
  if (!p.qkv_ready) pdl::wait();
  const int slot = p.slot_ids[n];
  bf16* out_row = reinterpret_cast<bf16*>(p.out) + static_cast<int64_t>(n) * p.out_stride + h * kD;
  if (slot < 0) {  // padding row: zero output, touch no state (uniform over the cluster: same n)
    if (rg == 0) store_bf16x4(out_row + col, make_float4(0.f, 0.f, 0.f, 0.f));
    return;
  }

  float* S = p.state_pool + (static_cast<size_t>(slot) * H + h) * kD * kD;
  float4 s[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = __ldcs(reinterpret_cast<const float4*>(S + (rg + 8 * i) * kD + col));

  const bf16* conv_w = reinterpret_cast<const bf16*>(p.conv_w);
  bf16* cpool = reinterpret_cast<bf16*>(p.conv_pool) + static_cast<size_t>(slot) * kConvRows * 3 * P;
  const int64_t row3 = 3 * static_cast<int64_t>(P);  // conv-state row length
  auto input_row = [&](int which) -> const bf16* {
    const Bf16Rows& r = which == 0 ? p.q : which == 1 ? p.k : p.v;
    return reinterpret_cast<const bf16*>(r.ptr) + static_cast<int64_t>(n) * r.stride + h * kD;
  };

  // Prologue: 4-channel jobs spread over the CTA. q/k conv for all 128 channels (the norms need them),
  // v conv for this CTA's columns; then, after the wait, the gate for all 128 key channels.
#pragma unroll
  for (int it = 0; it < (kConvJobs + kThreads - 1) / kThreads; ++it) {
    const int job = tid + it * kThreads;
    if (job < kConvJobs) {
      const int which = job < 32 ? 0 : job < 64 ? 1 : 2;
      const int c = which < 2 ? (job & 31) * 4 : rank * kBV + (job - 64) * 4;
      const int ch = which * P + h * kD + c;
      const float4 x = load_bf16x4(input_row(which) + c);
      const float4 s0 = load_bf16x4(cpool + ch), s1 = load_bf16x4(cpool + row3 + ch);
      const float4 s2 = load_bf16x4(cpool + 2 * row3 + ch);
      const float4 y = conv4_silu(conv_w, ch, s0, s1, s2, x);
      float* dst = which == 0 ? s_q + c : which == 1 ? s_k + c : s_v + (c - rank * kBV);
      *reinterpret_cast<float4*>(dst) = y;
      // Shift the window. With kSplit > 1 the other CTAs of the cluster read this head's q/k state too, so
      // only the v channels (read by this CTA alone) are written here; q/k after the cluster barrier below.
      if (kSplit == 1 || which == 2) {
        store_bf16x4(cpool + ch, s1);
        store_bf16x4(cpool + row3 + ch, s2);
        store_bf16x4(cpool + 2 * row3 + ch, x);
      }
    }
  }
  // The gate's 4-channel jobs go to the threads after the last conv job (the idle ones when conv ran after the
  // wait too; every CTA has at least kD / 4 = 32 threads). Its weights are read before the wait.
  const int gj = (tid - kConvJobs % kThreads + kThreads) % kThreads, gc = gj * 4;
  float negA = 0.f;
  float4 dt = {};
  if (gj < kD / 4) {
    negA = -expf(p.A_log[h]);
    dt = *reinterpret_cast<const float4*>(p.dt_bias + h * kD + gc);
  }
  pdl::wait();  // f and gz (a no-op when waited above)
  // The output gate, fetched now so its latency overlaps the gate math instead of ending the kernel (kept
  // packed: 2 registers; the 512-byte o_norm weight is cache-resident and read at the end).
  uint2 gz_raw = {};
  if (rg == 0)
    gz_raw = __ldcg(reinterpret_cast<const uint2*>(reinterpret_cast<const bf16*>(p.gz.ptr) +  // L2: pdl.cuh
                                                  static_cast<int64_t>(n) * p.gz.stride + h * kD + col));
  if (gj < kD / 4) {
    const float4 f =
        load_bf16x4(reinterpret_cast<const bf16*>(p.f.ptr) + static_cast<int64_t>(n) * p.f.stride + h * kD + gc);
    float4 a;
    a.x = exp_fast(negA * softplusf_(f.x + dt.x));
    a.y = exp_fast(negA * softplusf_(f.y + dt.y));
    a.z = exp_fast(negA * softplusf_(f.z + dt.z));
    a.w = exp_fast(negA * softplusf_(f.w + dt.w));
    *reinterpret_cast<float4*>(s_alpha + gc) = a;
  }
  if (tid == 0) {
    const bf16* b = reinterpret_cast<const bf16*>(p.beta_logits.ptr);
    s_beta = sigmoidf_(__bfloat162float(b[static_cast<int64_t>(n) * p.beta_logits.stride + h]));
  }
  __syncthreads();

  // L2 norms and q^.k^, computed by every warp (saves a block barrier).
  const auto [rq, rk, qk] = qk_norms(s_q, s_k, lane);

  // Decay rows, then S^T k^ and S^T q^ of the decayed state in one pass; o = Sd^T q^ + (q^.k^) u equals the
  // read of the updated state (Sd + k^ u^T)^T q^.
  float kS[4] = {0.f, 0.f, 0.f, 0.f}, qS[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = rg + 8 * i;
    const float a = s_alpha[r], kr = s_k[r] * rk, qr = s_q[r] * rq;
    s[i].x *= a, s[i].y *= a, s[i].z *= a, s[i].w *= a;
    kS[0] += kr * s[i].x, kS[1] += kr * s[i].y, kS[2] += kr * s[i].z, kS[3] += kr * s[i].w;
    qS[0] += qr * s[i].x, qS[1] += qr * s[i].y, qS[2] += qr * s[i].z, qS[3] += qr * s[i].w;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) kS[e] = xor_sum<2, 4>(kS[e]), qS[e] = xor_sum<2, 4>(qS[e]);
  const float beta = s_beta;
  const float4 v4 = *reinterpret_cast<const float4*>(s_v + lcol);
  const float u[4] = {beta * (v4.x - kS[0]), beta * (v4.y - kS[1]), beta * (v4.z - kS[2]), beta * (v4.w - kS[3])};
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = round_bf16(qS[e] + qk * u[e]);  // the model's o is bf16 (gated_rmsnorm_ref)
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = rg + 8 * i;
    const float kr = s_k[r] * rk;
    s[i].x += kr * u[0], s[i].y += kr * u[1], s[i].z += kr * u[2], s[i].w += kr * u[3];
    __stcs(reinterpret_cast<float4*>(S + r * kD + col), s[i]);
  }

  // Gated RMSNorm over the 128 V columns: warp -> CTA (shared) -> cluster (distributed shared memory).
  const float ss = xor_sum<0, 1>(o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3]);
  if (lane == 0) s_part[warp] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) tot += s_part[w];
  if constexpr (kSplit > 1) {
    if (tid == 0) s_cta_ss = tot;
    cluster_sync();  // also orders every CTA's conv-state reads before the q/k writes below
    tot = 0.f;
#pragma unroll
    for (int r = 0; r < kSplit; ++r) tot += ld_cluster_f32(&s_cta_ss, r);
  }
  if (rg == 0) {
    const float rs = rsqrtf(tot / kD + p.norm_eps);
    const float2 gz01 = unpack_bf16x2(gz_raw.x), gz23 = unpack_bf16x2(gz_raw.y);
    const float4 gz = make_float4(gz01.x, gz01.y, gz23.x, gz23.y);
    const float4 onw = __ldg(reinterpret_cast<const float4*>(p.o_norm_w + col));
    store_bf16x4(out_row + col,
                 make_float4(o[0] * rs * onw.x * sigmoidf_(gz.x), o[1] * rs * onw.y * sigmoidf_(gz.y),
                             o[2] * rs * onw.z * sigmoidf_(gz.z), o[3] * rs * onw.w * sigmoidf_(gz.w)));
  }
  if constexpr (kSplit > 1) {
    // q/k conv-state channels of this CTA's partition (kBV of each), now that every CTA has read the old rows.
    for (int j = tid; j < kBV / 2; j += kThreads) {
      const int which = j < kBV / 4 ? 0 : 1;
      const int c = rank * kBV + (j % (kBV / 4)) * 4;
      const int ch = which * P + h * kD + c;
      const float4 x = load_bf16x4(input_row(which) + c);
      const float4 s1 = load_bf16x4(cpool + row3 + ch), s2 = load_bf16x4(cpool + 2 * row3 + ch);
      store_bf16x4(cpool + ch, s1);
      store_bf16x4(cpool + row3 + ch, s2);
      store_bf16x4(cpool + 2 * row3 + ch, x);
    }
    cluster_sync();  // no CTA exits while another may still read its s_cta_ss
  }
}

}  // namespace dev

// Launches the decode kernel with kSplit CTAs per head (a cluster when kSplit > 1), allowing programmatic
// dependent launch (the kernel waits for its predecessor with griddepcontrol.wait before reading anything).
template <int kSplit, int kHeads>
void launch_kda_decode(const KdaDecodeParams& p, cudaStream_t stream) {
  if (p.N == 0) return;
  KDA_CUDA_CHECK(pdl::launch_cluster(kSplit, true, dev::kda_decode_kernel<kSplit, kHeads>,
                                     dim3(static_cast<unsigned>(p.N) * p.H * kSplit), dim3(256 / kSplit), 0, stream,
                                     p));
  KDA_CHECK_LAUNCH();
}

// The compact-heads launcher for kFixedHeads heads (explicitly instantiated in kda_decode_compact_*.cu).
template <int kFixedHeads>
void launch_kda_decode_compact(const KdaDecodeParams& p, cudaStream_t stream) {
  static_assert(is_compact_head_count(kFixedHeads), "not in DS_KDA_COMPACT_HEADS");
  launch_kda_decode<compact_split(kFixedHeads), kFixedHeads>(p, stream);
}

#define DS_KDA_DECLARE_COMPACT(H) \
  extern template void launch_kda_decode_compact<H>(const KdaDecodeParams&, cudaStream_t);
DS_KDA_COMPACT_HEADS(DS_KDA_DECLARE_COMPACT)
#undef DS_KDA_DECLARE_COMPACT

}  // namespace ds::kda
