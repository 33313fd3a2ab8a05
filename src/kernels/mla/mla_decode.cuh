// Internal to the MLA decode: the split-kernel arguments, tile constants and device pieces shared by its two split-K
// kernels (column-split: 4 warps, mla_decode.cu; K-split: 8 warps, mla_decode_ksplit.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_mma.cuh"

namespace ds::mla::decode_detail {

using bf16 = __nv_bfloat16;

// 64 cache rows per tile; rows padded to 584 values (1168 B = 73 x 16 B, odd) so the 8 rows of every ldmatrix
// land in distinct banks; 72 16-byte chunks per row.
constexpr int kBJ = 64, kPitch = kRow + 8, kSPitch = kBJ + 4, kPPitch = kBJ + 8, kChunks = kRow / 8;

struct SplitArgs {
  const bf16* q_abs;          // [N, H, 576]  [q~ (512) ; q_pe (64)]
  const bf16* cache;          // [pages * page_size, 576]
  const int32_t* block_table; // [N, max_pages]
  const int32_t* ctx_lens;    // [N]
  float* o_part;              // [N, H, S, 512] normalised partial outputs: each (n, h) is one contiguous block
  float* lse;                 // [N, H, S] log2-domain log-sum-exp of each split (-inf when empty)
  int H, S, page_size, max_pages;
  float scale_log2;           // softmax scale * log2(e)
};

void launch_split_colwarp(const SplitArgs& a, int N, cudaStream_t stream);  // variant 1
void launch_split_ksplit(const SplitArgs& a, int N, cudaStream_t stream);   // variant 2

// ---- Device pieces both split kernels share (blocks of kThreads threads, kThreads / kBJ per cache row) ----

// Split s of sequence n: cache rows [j_begin, j_end) in ntiles tiles of kBJ rows, and its two-stage tile loader.
// Thread t copies row t / kLanes of a tile, 16-byte chunks t % kLanes, t % kLanes + kLanes, ...; the page-table
// read for a row is issued a tile ahead (row_src), so its latency hides behind a tile of compute.
template <int kThreads, int kUnroll>
struct SplitTiles {
  static constexpr int kLanes = kThreads / kBJ;
  const SplitArgs& a;
  int n, j_begin, j_end, ntiles, lr, lc;

  __device__ __forceinline__ SplitTiles(const SplitArgs& args, int s, int seq, int tid) : a(args), n(seq) {
    const int ctx = a.ctx_lens[n];
    const int per = (ctx + a.S - 1) / a.S;
    const int rows_per_split = (per + kBJ - 1) / kBJ * kBJ;
    j_begin = s * rows_per_split;
    j_end = min(ctx, j_begin + rows_per_split);
    ntiles = j_end > j_begin ? (j_end - j_begin + kBJ - 1) / kBJ : 0;
    lr = static_cast<unsigned>(tid) / kLanes;  // shifts: tid is not negative
    lc = static_cast<unsigned>(tid) % kLanes;
  }
  __device__ __forceinline__ const bf16* row_src(int it) const {
    const int pos = j_begin + it * kBJ + lr;
    if (it >= ntiles || pos >= j_end) return nullptr;
    const int64_t page = a.block_table[static_cast<int64_t>(n) * a.max_pages + pos / a.page_size];
    return a.cache + (page * a.page_size + pos % a.page_size) * kRow;
  }
  __device__ __forceinline__ void load(const bf16* src, bf16* sKV, int buf) const {
    const bool valid = src != nullptr;
    if (!valid) src = a.cache;
    bf16* dst = sKV + (buf * kBJ + lr) * kPitch;
#pragma unroll kUnroll
    for (int ch = lc; ch < kChunks; ch += kLanes) dev::cp_async16(dst + ch * 8, valid ? src + ch * 8 : src, valid);
  }
};

// The block's HR query rows (heads h0.., rows past nh zero-filled) into sQ.
template <int kThreads, int HR>
__device__ __forceinline__ void stage_q(const SplitArgs& a, bf16* sQ, int n, int h0, int nh, int tid) {
  for (int c = tid; c < HR * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const bf16* src = r < nh ? a.q_abs + (static_cast<int64_t>(n) * a.H + h0 + r) * kRow + ch * 8 : a.q_abs;
    dev::cp_async16(sQ + r * kPitch + ch * 8, src, r < nh);
  }
}

// Phase C of a tile: O = O * alpha + P . V over this warp's NT * 8 latent columns from col0.
template <int MT, int NT>
__device__ __forceinline__ void rescale_pv(float (&o)[MT][NT][4], const float* sAlpha, const bf16* sP,
                                           const bf16* kv, int col0, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float al0 = sAlpha[mt * 16 + (lane >> 2)], al1 = sAlpha[mt * 16 + (lane >> 2) + 8];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
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
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      dev::ldmatrix_x4_trans(b, dev::bt_frag_ptr(kv, kPitch, ks * 16, col0 + np * 16, lane));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        dev::mma_bf16(o[mt][2 * np], af[mt], b[0], b[1]);
        dev::mma_bf16(o[mt][2 * np + 1], af[mt], b[2], b[3]);
      }
    }
  }
}

// The split's normalised partial output (this warp's columns from col0) and its log2-domain log-sum-exp, from each
// head row's running sum and max in sL / sM.
template <int MT, int NT>
__device__ __forceinline__ void store_split(const SplitArgs& a, const float (&o)[MT][NT][4], const float* sL,
                                            const float* sM, int s, int n, int h0, int nh, int col0, int tid,
                                            int lane) {
  const int64_t nh0 = static_cast<int64_t>(n) * a.H + h0;  // (sequence, first head of the group)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + (lane >> 2) + 8 * half;
      if (row >= nh) continue;
      const float l = sL[row], inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* dst = a.o_part + ((nh0 + row) * a.S + s) * kLatent + col0 + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<float2*>(dst + nt * 8) =
            make_float2(o[mt][nt][2 * half] * inv, o[mt][nt][2 * half + 1] * inv);
    }
  if (tid < nh) {
    const float l = sL[tid];
    a.lse[(nh0 + tid) * a.S + s] = l > 0.0f ? sM[tid] + log2f(l) : -INFINITY;
  }
}

}  // namespace ds::mla::decode_detail
