// MLA weight-absorbed decode: q absorption (q~ = Wuk^T q_nope), split-K latent attention on tensor cores, and the
// log-sum-exp merge of the splits fused with the value up-projection (out = Wuv lat).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/common/math_constants.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/smem_opt_in.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_cache_write.cuh"
#include "kernels/mla/mla_decode.cuh"
#include "kernels/mla/mla_mma.cuh"

namespace ds::mla {

using namespace decode_detail;

namespace {

constexpr int kTokPerBlock = 8;  // tokens sharing one read of a head's Wuk / Wuv (128 KB each)

// ---- 1. q_abs[n, h] = [Wuk_h^T q_nope (512, fp32 sum, bf16 out) ; q_pe (64)]. Grid (H, 512/64, ceil(N/8)),
// 256 threads = 16 column quads x 16 groups of 8 rows of Wuk_h. Each thread issues its 8 row loads at once (one
// memory round trip; the first version walked the 128 rows with 32 dependent round trips, ~20 us at batch 1),
// and the 16 row groups are summed through shared memory.
// With a cache write (DecodeParams::write) the grid has one more x column: its y == 0 blocks write the cache rows
// of their kTokPerBlock tokens, a warp each (mla_cache_write.cuh: cache_write_kernel's code).
__global__ void __launch_bounds__(256) absorb_q_kernel(const bf16* __restrict__ q, int64_t q_stride,
                                                       const bf16* __restrict__ wkv_b, bf16* __restrict__ q_abs,
                                                       int N, int H, const dev::CacheWriteArgs cw) {
  const int h = blockIdx.x, c0 = blockIdx.y * 64, n0 = blockIdx.z * kTokPerBlock, nt = min(kTokPerBlock, N - n0);
  const int tid = threadIdx.x, c4 = tid % 16, g = tid / 16;
  if (h == H) {  // the cache-write column
    pdl::wait();
    pdl::launch_dependents();
    if (blockIdx.y == 0 && tid / 32 < nt) dev::cache_write_token(cw, n0 + tid / 32, tid % 32);
    return;
  }
  __shared__ float sq[kTokPerBlock][kNope];
  __shared__ float red[16][kTokPerBlock][64];
  const bf16* w = wkv_b + (static_cast<int64_t>(h) * (kNope + kValue) + g * 8) * kLatent + c0 + c4 * 4;
  uint2 raw[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) raw[j] = __ldg(reinterpret_cast<const uint2*>(w + j * kLatent));  // weights
  pdl::wait();  // programmatic dependent launch: everything above is independent of the predecessor
  pdl::launch_dependents();
  for (int i = tid; i < kTokPerBlock * kNope; i += 256) {
    const int t = i / kNope, d = i % kNope;
    sq[t][d] = t < nt ? __bfloat162float(pdl::load_prior(q + (n0 + t) * q_stride + h * kQk + d)) : 0.0f;
  }
  __syncthreads();
  float acc[kTokPerBlock][4] = {};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[j].x));
    const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[j].y));
#pragma unroll
    for (int t = 0; t < kTokPerBlock; ++t) {
      const float qv = sq[t][g * 8 + j];
      acc[t][0] += qv * w01.x;
      acc[t][1] += qv * w01.y;
      acc[t][2] += qv * w23.x;
      acc[t][3] += qv * w23.y;
    }
  }
#pragma unroll
  for (int t = 0; t < kTokPerBlock; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[g][t][c4 * 4 + i] = acc[t][i];
  __syncthreads();
  for (int o = tid; o < nt * 64; o += 256) {
    const int t = o / 64, c = o % 64;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) sum += red[k][t][c];
    q_abs[(static_cast<int64_t>(n0 + t) * H + h) * kRow + c0 + c] = __float2bfloat16(sum);
  }
  if (blockIdx.y == 0)
    for (int i = tid; i < nt * kRope; i += 256) {
      const int t = i / kRope, r = i % kRope;
      q_abs[(static_cast<int64_t>(n0 + t) * H + h) * kRow + kLatent + r] =
          pdl::load_prior(q + (n0 + t) * q_stride + h * kQk + kNope + r);
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
template <int MT>
constexpr size_t split_smem_bytes() {
  return static_cast<size_t>(16 * MT) * kPitch * 2 + 2ull * kBJ * kPitch * 2 + 16 * MT * kSPitch * 4 +
         16 * MT * kPPitch * 2 + 3 * 16 * MT * 4;
}

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
  pdl::wait();  // programmatic dependent launch: everything above is independent of the predecessor
  pdl::launch_dependents();
  const SplitTiles<128, 4> tiles(a, s, n, tid);  // a row in two threads: 16 rows x 32 B per warp instruction
  const int ntiles = tiles.ntiles;
  stage_q<128, HR>(a, sQ, n, h0, nh, tid);
  if (ntiles > 0) tiles.load(tiles.row_src(0), sKV, 0);
  dev::cp_async_commit();
  const bf16* next_src = tiles.row_src(1);

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
    if (it + 1 < ntiles) tiles.load(next_src, sKV, buf ^ 1);
    dev::cp_async_commit();
    next_src = tiles.row_src(it + 2);
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
    const int j0 = tiles.j_begin + it * kBJ;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mt * 16 + (lane >> 2) + 8 * (i >> 1), col = warp * 16 + nt * 8 + 2 * (lane & 3) + (i & 1);
          sS[row * kSPitch + col] = j0 + col < tiles.j_end ? sacc[mt][nt][i] * a.scale_log2 : -INFINITY;
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

    rescale_pv<MT, 16>(o, sAlpha, sP, kv, warp * 128, lane);  // phase C: this warp's 128 latent columns
    __syncthreads();  // the tile buffer and S/P are rewritten next iteration
  }
  dev::cp_async_wait<0>();

  if (bpart == 0) {
    sL[brow] = l_run;
    sM[brow] = m_run;
  }
  __syncthreads();
  store_split<MT, 16>(a, o, sL, sM, s, n, h0, nh, warp * 128, tid, lane);
}

// ---- 3. merge the splits (weights 2^(lse_s - max)) and apply Wuv: out[n, h] = Wuv_h . lat. One block per
// (head, sequence), 512 threads: four groups of 128 threads each sum a quarter of the splits with float4 loads,
// eight in flight per thread (the (n, h) block of o_part is contiguous: S x 2 KB); then each of the 16 warps
// computes 8 outputs with all 16 of its Wuv row loads issued at once.
__global__ void __launch_bounds__(512) combine_upproj_kernel(const float* __restrict__ o_part,
                                                             const float* __restrict__ lse,
                                                             const bf16* __restrict__ wkv_b, bf16* __restrict__ out,
                                                             int H, int S) {
  const int h = blockIdx.x, n = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ float sw[256];
  __shared__ float4 red[4][128];
  __shared__ float slat[kLatent];
  __shared__ float sred[16];
  {  // Wuv_h (128 rows of 1 KB) into L2 while the split kernel drains
    const bf16* wuv = wkv_b + (static_cast<int64_t>(h) * (kNope + kValue) + kNope) * kLatent;
    for (int l = tid; l < kValue * kLatent * 2 / 128; l += 512)
      pdl::prefetch_l2(reinterpret_cast<const char*>(wuv) + l * 128);
  }
  pdl::wait();  // programmatic dependent launch: everything above is independent of the predecessor
  pdl::launch_dependents();
  const int64_t base = (static_cast<int64_t>(n) * H + h) * S;
  const float my = tid < S ? pdl::load_prior(lse + base + tid) : -INFINITY;  // S <= 256 < 512
  float mx = my;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) sred[warp] = mx;
  __syncthreads();
  mx = sred[0];
#pragma unroll
  for (int w = 1; w < 16; ++w) mx = fmaxf(mx, sred[w]);
  const float wt = (tid < S && mx != -INFINITY) ? exp2f(my - mx) : 0.0f;  // ctx = 0 (padding row): all zero
  if (tid < S) sw[tid] = wt;
  float sum = wt;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __syncthreads();  // sred reads above are done; sw is complete
  if (lane == 0) sred[warp] = sum;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < 16; ++w) total += sred[w];
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;

  const int g = tid >> 7, l4 = tid & 127;
  const float4* src = reinterpret_cast<const float4*>(o_part + base * kLatent) + l4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int s = g; s < S; s += 4) {
    const float4 v = pdl::load_prior(src + static_cast<int64_t>(s) * (kLatent / 4));
    const float ws = sw[s];
    acc.x += ws * v.x;
    acc.y += ws * v.y;
    acc.z += ws * v.z;
    acc.w += ws * v.w;
  }
  red[g][l4] = acc;
  __syncthreads();
  if (tid < 128) {
    float4 r = red[0][tid];
#pragma unroll
    for (int k = 1; k < 4; ++k) {
      r.x += red[k][tid].x;
      r.y += red[k][tid].y;
      r.z += red[k][tid].z;
      r.w += red[k][tid].w;
    }
    slat[4 * tid] = r.x * inv;
    slat[4 * tid + 1] = r.y * inv;
    slat[4 * tid + 2] = r.z * inv;
    slat[4 * tid + 3] = r.w * inv;
  }
  __syncthreads();
  const bf16* wuv = wkv_b + (static_cast<int64_t>(h) * (kNope + kValue) + kNope + warp * 8) * kLatent + lane * 8;
  uint4 raw[8][2];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) raw[j][c] = *reinterpret_cast<const uint4*>(wuv + j * kLatent + c * 256);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float a = 0.0f;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[j][c]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(p2[i]);
        a += f.x * slat[c * 256 + lane * 8 + 2 * i] + f.y * slat[c * 256 + lane * 8 + 2 * i + 1];
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0) out[(static_cast<int64_t>(n) * H + h) * kValue + warp * 8 + j] = __float2bfloat16(a);
  }
}

template <int MT>
void launch_split_t(const SplitArgs& a, int N, cudaStream_t stream) {
  constexpr size_t smem = split_smem_bytes<MT>();
  static PerDeviceOnce smem_once;  // one attribute call per instantiation and device (host-side)
  CUDA_CHECK(opt_in_dynamic_smem(smem_once, decode_split_kernel<MT>, smem));
  const dim3 grid(a.S, N, (a.H + 16 * MT - 1) / (16 * MT));
  CUDA_CHECK(pdl::launch(true, decode_split_kernel<MT>, grid, 128, smem, stream, a));
}

}  // namespace

void decode_detail::launch_split_colwarp(const SplitArgs& a, int N, cudaStream_t stream) {
  if (a.H <= 16)
    launch_split_t<1>(a, N, stream);
  else
    launch_split_t<2>(a, N, stream);
}

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
  static_assert(kTokPerBlock * 32 <= 256, "the cache-write blocks give each token a warp");
  const dev::CacheWriteArgs cw = p.write ? dev::cache_write_args(*p.write) : dev::CacheWriteArgs{};
  const dim3 absorb_grid(p.H + (p.write ? 1 : 0), kLatent / 64, (p.N + kTokPerBlock - 1) / kTokPerBlock);
  CUDA_CHECK(pdl::launch(true, absorb_q_kernel, absorb_grid, 256, 0, stream, reinterpret_cast<const bf16*>(p.q),
                         p.q_stride, wkv_b, q_abs, p.N, p.H, cw));
  const SplitArgs a{q_abs, reinterpret_cast<const bf16*>(p.cache.data), p.cache.block_table, p.ctx_lens, o_part, lse,
                    p.H, p.num_splits, p.cache.page_size, p.cache.max_pages_per_seq, p.scale * kLog2e};
  // The single dispatch point: kernel variant (decode_variant() unless forced), then head rows per block (16 for
  // H <= 16, else 32 with H / 32 head groups) inside each launcher.
  static PerDeviceValue<int> arch_cache;
  int arch = 0;
  CUDA_CHECK(arch_cache.get(arch, [](int, int& v) {
    v = cuda_device_arch();
    return cudaSuccess;
  }));
  if ((p.variant ? p.variant : decode_variant(arch)) == 1)
    launch_split_colwarp(a, p.N, stream);
  else
    launch_split_ksplit(a, p.N, stream);
  CUDA_CHECK(pdl::launch(true, combine_upproj_kernel, dim3(p.H, p.N), 512, 0, stream, o_part, lse, wkv_b,
                         reinterpret_cast<bf16*>(p.out), p.H, p.num_splits));
}

}  // namespace ds::mla
