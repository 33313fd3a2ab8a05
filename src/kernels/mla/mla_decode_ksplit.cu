// MLA decode split kernel, variant 2 (8 warps, K split). The 4-warp column split (mla_decode.cu) re-reads all of Q
// from shared memory in every tile and runs 36-deep mma chains on 4 accumulators per warp; the first H200 run put
// it at ~5 us per 64-row tile against ~2.2 us of memory time. Here each warp owns a slice of the 576-wide score
// reduction (warps 0-3: 5 k-steps, 4-7: 4), keeps its Q fragments in registers for the block's lifetime and
// accumulates partial scores for all 64 columns (16 independent accumulators); the 8 partials are summed in
// shared memory during the softmax. P.V is split by latent columns (64 per warp).
// Shared memory (32 heads): partial scores 72 KB (also stages Q at the start) + two 73 KB tiles + P 4.5 KB.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/smem_opt_in.h"
#include "kernels/mla/mla_decode.cuh"
#include "kernels/mla/mla_mma.cuh"

namespace ds::mla::decode_detail {

namespace {

constexpr int kWarps = 8, kPartPitch = 72;  // 72 floats: the float2 stores of a half-warp hit 32 distinct banks

template <int MT>
constexpr size_t ksplit_smem_bytes() {
  return static_cast<size_t>(kWarps) * 16 * MT * kPartPitch * 4 + 2ull * kBJ * kPitch * 2 + 16 * MT * kPPitch * 2 +
         3 * 16 * MT * 4;
}

template <int MT>
__global__ void __launch_bounds__(256, 1) decode_ksplit_kernel(const SplitArgs a) {
  constexpr int HR = 16 * MT, TPR = 256 / HR, CPT = kBJ / TPR;  // head rows; softmax threads per row, columns each
  static_assert(HR * kPitch * 2 <= kWarps * HR * kPartPitch * 4, "Q staging must fit in the partial-score area");
  extern __shared__ __align__(16) uint8_t smem[];
  float* sPart = reinterpret_cast<float*>(smem);  // [8][HR][72]
  bf16* sQ = reinterpret_cast<bf16*>(smem);       // [HR][584], aliases sPart until the fragments are in registers
  bf16* sKV = reinterpret_cast<bf16*>(smem + static_cast<size_t>(kWarps) * HR * kPartPitch * 4);
  bf16* sP = sKV + 2 * kBJ * kPitch;
  float* sAlpha = reinterpret_cast<float*>(sP + HR * kPPitch);
  float* sL = sAlpha + HR;
  float* sM = sL + HR;

  const int s = blockIdx.x, n = blockIdx.y, h0 = blockIdx.z * HR, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nh = min(HR, a.H - h0);
  pdl::wait();  // programmatic dependent launch: everything above is independent of the predecessor
  pdl::launch_dependents();
  const SplitTiles<256, 6> tiles(a, s, n, tid);  // a row in four threads
  const int ntiles = tiles.ntiles;
  stage_q<256, HR>(a, sQ, n, h0, nh, tid);
  if (ntiles > 0) tiles.load(tiles.row_src(0), sKV, 0);
  dev::cp_async_commit();
  const bf16* next_src = tiles.row_src(1);

  const int ks0 = warp < 4 ? 5 * warp : 20 + 4 * (warp - 4), nks = warp < 4 ? 5 : 4;  // 4 x 5 + 4 x 4 = 36
  uint32_t qf[MT][5][4];
  float o[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][nt][i] = 0.0f;
  const int brow = tid / TPR, bpart = tid % TPR;
  float m_run = -INFINITY, l_run = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) tiles.load(next_src, sKV, buf ^ 1);
    dev::cp_async_commit();
    next_src = tiles.row_src(it + 2);
    dev::cp_async_wait<1>();
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 5; ++j)
          if (j < nks) dev::ldmatrix_x4(qf[mt][j], dev::a_frag_ptr(sQ, kPitch, mt * 16, (ks0 + j) * 16, lane));
      __syncthreads();  // the staging area becomes the partial-score area
    }
    const bf16* kv = sKV + buf * kBJ * kPitch;

    // Phase A: this warp's partial scores for all heads x 64 rows.
    float sp[MT][8][4] = {};
#pragma unroll
    for (int j = 0; j < 5; ++j) {
      if (j >= nks) break;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        dev::ldmatrix_x4(b, dev::b_frag_ptr(kv, kPitch, np * 16, (ks0 + j) * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          dev::mma_bf16(sp[mt][2 * np], qf[mt][j], b[0], b[1]);
          dev::mma_bf16(sp[mt][2 * np + 1], qf[mt][j], b[2], b[3]);
        }
      }
    }
    float* part = sPart + warp * HR * kPartPitch;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int row = mt * 16 + (lane >> 2), col = nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<float2*>(part + row * kPartPitch + col) = make_float2(sp[mt][nt][0], sp[mt][nt][1]);
        *reinterpret_cast<float2*>(part + (row + 8) * kPartPitch + col) = make_float2(sp[mt][nt][2], sp[mt][nt][3]);
      }
    __syncthreads();

    // Phase B: sum the 8 partials, mask, online softmax (the TPR threads of a row are adjacent lanes).
    float v[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) v[c] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* src = sPart + (w * HR + brow) * kPartPitch + bpart * CPT;
#pragma unroll
      for (int c4 = 0; c4 < CPT / 4; ++c4) {
        const float4 f = *reinterpret_cast<const float4*>(src + 4 * c4);
        v[4 * c4] += f.x;
        v[4 * c4 + 1] += f.y;
        v[4 * c4 + 2] += f.z;
        v[4 * c4 + 3] += f.w;
      }
    }
    const int j0 = tiles.j_begin + it * kBJ;
    float tmax = -INFINITY;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      v[c] = j0 + bpart * CPT + c < tiles.j_end ? v[c] * a.scale_log2 : -INFINITY;
      tmax = fmaxf(tmax, v[c]);
    }
#pragma unroll
    for (int off = 1; off < TPR; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m_run, tmax);
    const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_run - m_new);
    float psum = 0.0f;
    uint32_t packed[CPT / 2];
#pragma unroll
    for (int c = 0; c < CPT; c += 2) {
      const float p0 = m_new == -INFINITY ? 0.0f : exp2f(v[c] - m_new);
      const float p1 = m_new == -INFINITY ? 0.0f : exp2f(v[c + 1] - m_new);
      psum += p0 + p1;
      packed[c / 2] = dev::pack_bf16(p0, p1);
    }
    if constexpr (CPT == 8)
      *reinterpret_cast<uint4*>(sP + brow * kPPitch + bpart * CPT) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    else
      *reinterpret_cast<uint2*>(sP + brow * kPPitch + bpart * CPT) = make_uint2(packed[0], packed[1]);
#pragma unroll
    for (int off = 1; off < TPR; off <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    l_run = l_run * alpha + psum;
    m_run = m_new;
    if (bpart == 0) sAlpha[brow] = alpha;
    __syncthreads();

    rescale_pv<MT, 8>(o, sAlpha, sP, kv, warp * 64, lane);  // phase C: latent columns 64w..64w+63
    __syncthreads();  // the tile buffer, partials and P are rewritten next iteration
  }
  dev::cp_async_wait<0>();

  if (bpart == 0) {
    sL[brow] = l_run;
    sM[brow] = m_run;
  }
  __syncthreads();
  store_split<MT, 8>(a, o, sL, sM, s, n, h0, nh, warp * 64, tid, lane);
}

template <int MT>
void launch(const SplitArgs& a, int N, cudaStream_t stream) {
  constexpr size_t smem = ksplit_smem_bytes<MT>();
  static PerDeviceOnce smem_once;  // one attribute call per instantiation and device (host-side)
  CUDA_CHECK(opt_in_dynamic_smem(smem_once, decode_ksplit_kernel<MT>, smem));
  const dim3 grid(a.S, N, (a.H + 16 * MT - 1) / (16 * MT));
  CUDA_CHECK(pdl::launch(true, decode_ksplit_kernel<MT>, grid, 256, smem, stream, a));
}

}  // namespace

void launch_split_ksplit(const SplitArgs& a, int N, cudaStream_t stream) {
  if (a.H <= 16)
    launch<1>(a, N, stream);
  else
    launch<2>(a, N, stream);
}

}  // namespace ds::mla::decode_detail
