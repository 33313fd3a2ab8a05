// MLA weight-absorbed decode: q absorption (q~ = Wuk^T q_nope), split-K latent attention on tensor cores, and the
// log-sum-exp merge of the splits fused with the value up-projection (out = Wuv lat).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_mma.cuh"

namespace ds::mla {

namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kTokPerBlock = 8;  // tokens sharing one read of a head's Wuk / Wuv (128 KB each)

// ---- 1. q_abs[n, h] = [Wuk_h^T q_nope (512, fp32 sum, bf16 out) ; q_pe (64)]. Grid (H, ceil(N/8)), 128 threads,
// each 4 latent columns: every Wuk row (1 KB) is read by the block with 8-byte coalesced loads.
__global__ void __launch_bounds__(128) absorb_q_kernel(const bf16* __restrict__ q, int64_t q_stride,
                                                       const bf16* __restrict__ wkv_b, bf16* __restrict__ q_abs,
                                                       int N, int H) {
  const int h = blockIdx.x, n0 = blockIdx.y * kTokPerBlock, nt = min(kTokPerBlock, N - n0), tid = threadIdx.x;
  __shared__ float sq[kTokPerBlock][kNope];
  for (int i = tid; i < kTokPerBlock * kNope; i += 128) {
    const int t = i / kNope, d = i % kNope;
    sq[t][d] = t < nt ? __bfloat162float(q[(n0 + t) * q_stride + h * kQk + d]) : 0.0f;
  }
  __syncthreads();
  const bf16* w = wkv_b + static_cast<int64_t>(h) * (kNope + kValue) * kLatent + tid * 4;
  float acc[kTokPerBlock][4] = {};
#pragma unroll 4
  for (int d = 0; d < kNope; ++d) {
    const uint2 raw = *reinterpret_cast<const uint2*>(w + d * kLatent);
    const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
#pragma unroll
    for (int t = 0; t < kTokPerBlock; ++t) {
      const float qv = sq[t][d];
      acc[t][0] += qv * w01.x;
      acc[t][1] += qv * w01.y;
      acc[t][2] += qv * w23.x;
      acc[t][3] += qv * w23.y;
    }
  }
  for (int t = 0; t < nt; ++t) {
    bf16* dst = q_abs + (static_cast<int64_t>(n0 + t) * H + h) * kRow;
    uint2 o;
    o.x = dev::pack_bf16(acc[t][0], acc[t][1]);
    o.y = dev::pack_bf16(acc[t][2], acc[t][3]);
    *reinterpret_cast<uint2*>(dst + tid * 4) = o;
    if (tid < kRope) dst[kLatent + tid] = q[(n0 + t) * q_stride + h * kQk + kNope + tid];
  }
}

// ---- 2. split-K latent attention. Block = (split, sequence, head group of 16*MT heads), 4 warps, 64 cache rows
// per tile, two cp.async stages. Heads are the M dimension of both products, so each cache row is read once for
// all heads of the group (MQA over the latent):
//   A: S[heads, 64] = Q[heads, 576] . K[64, 576]^T   warp w: columns 16w..16w+15, all heads (36 k-steps)
//   B: online softmax per head row (exp2 domain), P in bf16, rescale factors in smem
//   C: O[heads, 512] += P[heads, 64] . V[64, 512]     warp w: latent columns 128w..128w+127
// Shared memory (MT = 2): Q 37 KB + 2 x 73 KB tiles + S/P 13 KB = 196 KB, one block per SM; rows are padded to
// 584 values (1168 B = 73 x 16 B, odd) so the 8 rows of every ldmatrix hit distinct banks.
constexpr int kBJ = 64, kPitch = kRow + 8, kSPitch = kBJ + 4, kPPitch = kBJ + 8, kChunks = kRow / 8;

template <int MT>
constexpr size_t split_smem_bytes() {
  return static_cast<size_t>(16 * MT) * kPitch * 2 + 2ull * kBJ * kPitch * 2 + 16 * MT * kSPitch * 4 +
         16 * MT * kPPitch * 2 + 3 * 16 * MT * 4;
}

struct SplitArgs {
  const bf16* q_abs;        // [N, H, 576]
  const bf16* cache;        // [pages * page_size, 576]
  const int32_t* block_table;
  const int32_t* ctx_lens;
  float* o_part;            // [N, S, H, 512]
  float* lse;               // [N, S, H]
  int H, S, page_size, max_pages;
  float scale_log2;
};

template <int MT>
__global__ void __launch_bounds__(128, 1) decode_split_kernel(const SplitArgs a) {
  constexpr int HR = 16 * MT, TPR = 128 / HR, CPT = kBJ / TPR;  // head rows; phase-B threads per row, cols each
  extern __shared__ __align__(16) uint8_t smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sKV = sQ + HR * kPitch;
  float* sS = reinterpret_cast<float*>(sKV + 2 * kBJ * kPitch);
  bf16* sP = reinterpret_cast<bf16*>(sS + HR * kSPitch);
  float* sAlpha = reinterpret_cast<float*>(sP + HR * kPPitch);
  float* sL = sAlpha + HR;
  float* sM = sL + HR;

  const int s = blockIdx.x, n = blockIdx.y, h0 = blockIdx.z * HR, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nh = min(HR, a.H - h0);
  const int ctx = a.ctx_lens[n];
  const int per = (ctx + a.S - 1) / a.S;
  const int rows_per_split = (per + kBJ - 1) / kBJ * kBJ;
  const int j_begin = s * rows_per_split, j_end = min(ctx, j_begin + rows_per_split);
  const int ntiles = j_end > j_begin ? (j_end - j_begin + kBJ - 1) / kBJ : 0;

  for (int c = tid; c < HR * kChunks; c += 128) {
    const int r = c / kChunks, ch = c % kChunks;
    const bf16* src = r < nh ? a.q_abs + (static_cast<int64_t>(n) * a.H + h0 + r) * kRow + ch * 8 : a.q_abs;
    dev::cp_async16(sQ + r * kPitch + ch * 8, src, r < nh);
  }
  // Tile loader: thread t copies row t/2, chunks t%2, t%2 + 2, ... (16 rows x 32 B per warp instruction).
  const int lr = tid >> 1, lc = tid & 1;
  auto load_tile = [&](int it, int buf) {
    const int pos = j_begin + it * kBJ + lr;
    const bool valid = pos < j_end;
    const bf16* src = a.cache;
    if (valid) {
      const int64_t page = a.block_table[static_cast<int64_t>(n) * a.max_pages + pos / a.page_size];
      src = a.cache + (page * a.page_size + pos % a.page_size) * kRow;
    }
    bf16* dst = sKV + (buf * kBJ + lr) * kPitch;
#pragma unroll 4
    for (int ch = lc; ch < kChunks; ch += 2) dev::cp_async16(dst + ch * 8, valid ? src + ch * 8 : src, valid);
  };
  if (ntiles > 0) load_tile(0, 0);
  dev::cp_async_commit();

  float o[MT][16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][nt][i] = 0.0f;
  const int brow = tid / TPR, bpart = tid % TPR;  // phase-B row ownership (kept across tiles)
  float m_run = -INFINITY, l_run = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) load_tile(it + 1, buf ^ 1);
    dev::cp_async_commit();
    dev::cp_async_wait<1>();
    __syncthreads();
    const bf16* kv = sKV + buf * kBJ * kPitch;

    // Phase A: scores.
    float sacc[MT][2][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < kRow / 16; ++ks) {
      uint32_t b[4];
      dev::ldmatrix_x4(b, dev::b_frag_ptr(kv, kPitch, warp * 16, ks * 16, lane));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t af[4];
        dev::ldmatrix_x4(af, dev::a_frag_ptr(sQ, kPitch, mt * 16, ks * 16, lane));
        dev::mma_bf16(sacc[mt][0], af, b[0], b[1]);
        dev::mma_bf16(sacc[mt][1], af, b[2], b[3]);
      }
    }
    const int j0 = j_begin + it * kBJ;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mt * 16 + (lane >> 2) + 8 * (i >> 1), col = warp * 16 + nt * 8 + 2 * (lane & 3) + (i & 1);
          sS[row * kSPitch + col] = j0 + col < j_end ? sacc[mt][nt][i] * a.scale_log2 : -INFINITY;
        }
    __syncthreads();

    // Phase B: online softmax; the TPR threads of a row are adjacent lanes of one warp.
    float v[CPT], tmax = -INFINITY;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      v[c] = sS[brow * kSPitch + bpart * CPT + c];
      tmax = fmaxf(tmax, v[c]);
    }
#pragma unroll
    for (int off = 1; off < TPR; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m_run, tmax);
    const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_run - m_new);
    float psum = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const float p = m_new == -INFINITY ? 0.0f : exp2f(v[c] - m_new);
      psum += p;
      sP[brow * kPPitch + bpart * CPT + c] = __float2bfloat16(p);
    }
#pragma unroll
    for (int off = 1; off < TPR; off <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    l_run = l_run * alpha + psum;
    m_run = m_new;
    if (bpart == 0) sAlpha[brow] = alpha;
    __syncthreads();

    // Phase C: O = O * alpha + P . V over this warp's 128 latent columns.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float al0 = sAlpha[mt * 16 + (lane >> 2)], al1 = sAlpha[mt * 16 + (lane >> 2) + 8];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        o[mt][nt][0] *= al0;
        o[mt][nt][1] *= al0;
        o[mt][nt][2] *= al1;
        o[mt][nt][3] *= al1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kBJ / 16; ++ks) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) dev::ldmatrix_x4(af[mt], dev::a_frag_ptr(sP, kPPitch, mt * 16, ks * 16, lane));
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t b[4];
        dev::ldmatrix_x4_trans(b, dev::bt_frag_ptr(kv, kPitch, ks * 16, warp * 128 + np * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          dev::mma_bf16(o[mt][2 * np], af[mt], b[0], b[1]);
          dev::mma_bf16(o[mt][2 * np + 1], af[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the tile buffer and S/P are rewritten next iteration
  }
  dev::cp_async_wait<0>();

  if (bpart == 0) {
    sL[brow] = l_run;
    sM[brow] = m_run;
  }
  __syncthreads();
  const int64_t part = static_cast<int64_t>(n) * a.S + s;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + (lane >> 2) + 8 * half;
      if (row >= nh) continue;
      const float l = sL[row], inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* dst = a.o_part + (part * a.H + h0 + row) * kLatent + warp * 128 + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
        *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[mt][nt][2 * half] * inv, o[mt][nt][2 * half + 1] * inv);
    }
  if (tid < nh) {
    const float l = sL[tid];
    a.lse[part * a.H + h0 + tid] = l > 0.0f ? sM[tid] + log2f(l) : -INFINITY;
  }
}

// ---- 3. merge the splits (weights 2^(lse_s - max)) and apply Wuv: out[n, h] = Wuv_h . lat. Grid (H, ceil(N/8)),
// 256 threads; warp t merges token t's weights, then each warp computes 16 of the 128 outputs for all tokens.
__global__ void __launch_bounds__(256) combine_upproj_kernel(const float* __restrict__ o_part,
                                                             const float* __restrict__ lse,
                                                             const bf16* __restrict__ wkv_b, bf16* __restrict__ out,
                                                             int N, int H, int S) {
  const int h = blockIdx.x, n0 = blockIdx.y * kTokPerBlock, nt = min(kTokPerBlock, N - n0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ float sw[kTokPerBlock][256];
  __shared__ float slat[kTokPerBlock][kLatent];
  if (warp < nt) {
    const int64_t base = static_cast<int64_t>(n0 + warp) * S;
    float mx = -INFINITY;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[(base + s) * H + h]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int s = lane; s < S; s += 32) {
      const float w = mx == -INFINITY ? 0.0f : exp2f(lse[(base + s) * H + h] - mx);
      sw[warp][s] = w;
      sum += w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // ctx = 0 (padding row): lat = 0, out = 0
    for (int s = lane; s < S; s += 32) sw[warp][s] *= inv;
  }
  __syncthreads();
  for (int i = tid; i < nt * kLatent; i += 256) {
    const int t = i / kLatent, l = i % kLatent;
    const float* src = o_part + (static_cast<int64_t>(n0 + t) * S * H + h) * kLatent + l;
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc += sw[t][s] * src[static_cast<int64_t>(s) * H * kLatent];
    slat[t][l] = acc;
  }
  __syncthreads();
  const bf16* wuv = wkv_b + (static_cast<int64_t>(h) * (kNope + kValue) + kNope) * kLatent;
  for (int d = warp * 16; d < warp * 16 + 16; ++d) {
    float wv[16];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 raw = *reinterpret_cast<const uint4*>(wuv + static_cast<int64_t>(d) * kLatent + c * 256 + lane * 8);
      const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(p2[i]);
        wv[c * 8 + 2 * i] = f.x;
        wv[c * 8 + 2 * i + 1] = f.y;
      }
    }
    for (int t = 0; t < nt; ++t) {
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += wv[c * 8 + i] * slat[t][c * 256 + lane * 8 + i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0) out[(static_cast<int64_t>(n0 + t) * H + h) * kValue + d] = __float2bfloat16(acc);
    }
  }
}

template <int MT>
void launch_split(const SplitArgs& a, int N, cudaStream_t stream) {
  constexpr size_t smem = split_smem_bytes<MT>();
  static bool configured = false;  // one attribute call per instantiation (host-side, before any capture)
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(decode_split_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    configured = true;
  }
  const dim3 grid(a.S, N, (a.H + 16 * MT - 1) / (16 * MT));
  decode_split_kernel<MT><<<grid, 128, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void decode(const DecodeParams& p, CUstream_st* stream) {
  if (auto e = decode_unsupported(p)) throw Error(*e);
  if (p.N == 0) return;
  char* ws = static_cast<char*>(p.workspace);
  auto carve = [&](size_t bytes) {
    char* r = ws;
    ws += (bytes + 255) & ~size_t{255};
    return r;
  };
  const size_t nh = static_cast<size_t>(p.N) * p.H;
  bf16* q_abs = reinterpret_cast<bf16*>(carve(nh * kRow * 2));
  float* o_part = reinterpret_cast<float*>(carve(nh * p.num_splits * kLatent * 4));
  float* lse = reinterpret_cast<float*>(carve(nh * p.num_splits * 4));
  const auto* wkv_b = reinterpret_cast<const bf16*>(p.wkv_b);
  const dim3 tok_grid(p.H, (p.N + kTokPerBlock - 1) / kTokPerBlock);

  absorb_q_kernel<<<tok_grid, 128, 0, stream>>>(reinterpret_cast<const bf16*>(p.q), p.q_stride, wkv_b, q_abs, p.N,
                                                p.H);
  CUDA_CHECK_LAUNCH();
  const SplitArgs a{q_abs, reinterpret_cast<const bf16*>(p.cache.data), p.cache.block_table, p.ctx_lens, o_part, lse,
                    p.H, p.num_splits, p.cache.page_size, p.cache.max_pages_per_seq, p.scale * kLog2e};
  // The single dispatch point: head rows per block (16 for H <= 16, else 32 with H / 32 head groups).
  if (p.H <= 16)
    launch_split<1>(a, p.N, stream);
  else
    launch_split<2>(a, p.N, stream);
  combine_upproj_kernel<<<tok_grid, 256, 0, stream>>>(o_part, lse, wkv_b, reinterpret_cast<bf16*>(p.out), p.N, p.H,
                                                      p.num_splits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ds::mla
