// Internal to the MLA decode: the split-kernel arguments and tile constants shared by its two split-K kernels
// (column-split: 4 warps, mla_decode.cu; K-split: 8 warps, mla_decode_ksplit.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mla/mla.h"

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

}  // namespace ds::mla::decode_detail
