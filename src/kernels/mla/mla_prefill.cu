// MLA prefill (expanded form): gather the latent rows of every sequence's context from the pages, expand them with
// one kv_b_proj GEMM, then causal varlen FlashAttention-2 (mma.sync bf16, online softmax in registers).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "kernels/common/math_constants.h"
#include "kernels/common/smem_opt_in.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_mma.cuh"

namespace ds::mla {

namespace {

using bf16 = __nv_bfloat16;

// ---- 1. gather: row r of the batch context (sequence n, position r - cu_ctx[n]) -> c_n[r] (512), k_pe[r] (64).
// One warp per row: 64 latent chunks of 16 bytes (2 per lane) + 8 k_pe chunks.
__global__ void __launch_bounds__(256) gather_kernel(const bf16* __restrict__ cache,
                                                     const int32_t* __restrict__ block_table, int page_size,
                                                     int max_pages, const int32_t* __restrict__ cu_ctx, int N,
                                                     int total_ctx, bf16* __restrict__ cn, bf16* __restrict__ kpe) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= total_ctx) return;
  int lo = 0, hi = N;  // largest n with cu_ctx[n] <= r (empty sequences are skipped by the search)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_ctx[mid] <= r) lo = mid; else hi = mid;
  }
  const int pos = r - cu_ctx[lo];
  const int64_t page = block_table[static_cast<int64_t>(lo) * max_pages + pos / page_size];
  const bf16* src = cache + (page * page_size + pos % page_size) * kRow;
#pragma unroll
  for (int c = 0; c < 2; ++c)
    *reinterpret_cast<uint4*>(cn + static_cast<int64_t>(r) * kLatent + (lane + 32 * c) * 8) =
        *reinterpret_cast<const uint4*>(src + (lane + 32 * c) * 8);
  if (lane < kRope / 8)
    *reinterpret_cast<uint4*>(kpe + static_cast<int64_t>(r) * kRope + lane * 8) =
        *reinterpret_cast<const uint4*>(src + kLatent + lane * 8);
}

// ---- 2. attention. Block = (64-query tile, sequence, head), 4 warps x 16 query rows. Q fragments stay in
// registers (12 k-steps x 4 regs); K tiles [64][192] = [k_nope ; k_pe] and V tiles [64][128] go through two
// cp.async stages. Padded pitches (200 and 136 values: 25 and 17 16-byte units, odd) keep ldmatrix conflict-free.
constexpr int kBQ = 64, kBK = 64, kQPitch = kQk + 8, kVPitch = kValue + 8;
constexpr size_t kAttnSmem = (kBQ * kQPitch + 2 * kBK * kQPitch + 2 * kBK * kVPitch) * 2;  // 109 KB

struct AttnArgs {
  const bf16* q;         // [T, H, 192] rows of stride q_stride
  int64_t q_stride;
  const bf16* kv;        // [total_ctx, H, 256]: [k_nope (128) ; v (128)] per head
  const bf16* kpe;       // [total_ctx, 64]
  const int32_t* cu_seqlens;
  const int32_t* ctx_lens;
  const int32_t* cu_ctx;
  bf16* out;             // [T, H, 128]
  int H;
  float scale_log2;
};

__global__ void __launch_bounds__(128) prefill_attn_kernel(const AttnArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kBQ * kQPitch;
  bf16* sV = sK + 2 * kBK * kQPitch;
  const int qt = blockIdx.x, n = blockIdx.y, h = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = a.cu_seqlens[n], tn = a.cu_seqlens[n + 1] - t0;
  if (qt * kBQ >= tn) return;  // this sequence has fewer query tiles (or no new tokens)
  const int ctx = a.ctx_lens[n], past = ctx - tn, c0 = a.cu_ctx[n];
  const int q_rows = min(kBQ, tn - qt * kBQ);
  const int kv_end = min(ctx, past + qt * kBQ + q_rows);  // causal: the last query sees keys [0, kv_end)
  const int ntiles = (kv_end + kBK - 1) / kBK;
  const int64_t kv_pitch = static_cast<int64_t>(a.H) * (kNope + kValue);

  for (int c = tid; c < kBQ * (kQk / 8); c += 128) {
    const int r = c / (kQk / 8), ch = c % (kQk / 8);
    const bool valid = r < q_rows;
    const bf16* src = valid ? a.q + (t0 + qt * kBQ + r) * a.q_stride + h * kQk + ch * 8 : a.q;
    dev::cp_async16(sQ + r * kQPitch + ch * 8, src, valid);
  }
  // Per key row: 16 k_nope, 8 k_pe and 16 v chunks of 16 B. Each thread keeps a fixed chunk column and steps rows
  // by a constant (no per-chunk division; the first H200 run spent a large share of its issue slots on a c / 40
  // mapping): k_nope and v rows t/16 + 8i (i < 8), k_pe rows t/8 + 16i (i < 4).
  const int cn16 = tid & 15, rn16 = tid >> 4, cn8 = tid & 7, rn8 = tid >> 3;
  const bf16* kv_head = a.kv + h * (kNope + kValue);
  auto load_tile = [&](int it, int buf) {
    const int key0 = it * kBK;
    bf16* sk = sK + buf * kBK * kQPitch;
    bf16* sv = sV + buf * kBK * kVPitch;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = rn16 + 8 * i, key = key0 + r;
      const bool valid = key < kv_end;
      const bf16* row = valid ? kv_head + (c0 + key) * kv_pitch : a.kv;
      dev::cp_async16(sk + r * kQPitch + cn16 * 8, valid ? row + cn16 * 8 : row, valid);
      dev::cp_async16(sv + r * kVPitch + cn16 * 8, valid ? row + kNope + cn16 * 8 : row, valid);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = rn8 + 16 * i, key = key0 + r;
      const bool valid = key < kv_end;
      const bf16* src = valid ? a.kpe + static_cast<int64_t>(c0 + key) * kRope + cn8 * 8 : a.kpe;
      dev::cp_async16(sk + r * kQPitch + kNope + cn8 * 8, src, valid);
    }
  };
  load_tile(0, 0);
  dev::cp_async_commit();

  uint32_t qf[kQk / 16][4];
  float o[kValue / 8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};  // rows lane/4 and lane/4 + 8
  const int qpos0 = past + qt * kBQ + warp * 16 + (lane >> 2);           // query position of row lane/4

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) load_tile(it + 1, buf ^ 1);
    dev::cp_async_commit();
    dev::cp_async_wait<1>();
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int ks = 0; ks < kQk / 16; ++ks)
        dev::ldmatrix_x4(qf[ks], dev::a_frag_ptr(sQ, kQPitch, warp * 16, ks * 16, lane));
    }
    const bf16* k = sK + buf * kBK * kQPitch;
    const bf16* v = sV + buf * kBK * kVPitch;
    float s[kBK / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kQk / 16; ++ks)
#pragma unroll
      for (int np = 0; np < kBK / 16; ++np) {
        uint32_t b[4];
        dev::ldmatrix_x4(b, dev::b_frag_ptr(k, kQPitch, np * 16, ks * 16, lane));
        dev::mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
        dev::mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    float tmax[2] = {-INFINITY, -INFINITY};
    // Only tiles that reach past this warp's first query position (or the context end) need the causal mask.
    const bool full = it * kBK + kBK - 1 <= past + qt * kBQ + warp * 16 && it * kBK + kBK <= kv_end;
#pragma unroll
    for (int nt = 0; nt < kBK / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = it * kBK + nt * 8 + 2 * (lane & 3) + (i & 1), hr = i >> 1;
        const bool ok = full || (key <= qpos0 + 8 * hr && key < kv_end);
        s[nt][i] = ok ? s[nt][i] * a.scale_log2 : -INFINITY;
        tmax[hr] = fmaxf(tmax[hr], s[nt][i]);
      }
    float alpha[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 1));
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 2));
      const float m_new = fmaxf(m_run[hr], tmax[hr]);
      alpha[hr] = m_new == -INFINITY ? 1.0f : exp2f(m_run[hr] - m_new);
      m_run[hr] = m_new;
      l_part[hr] *= alpha[hr];
    }
#pragma unroll
    for (int nt = 0; nt < kBK / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hr = i >> 1;
        const float p = m_run[hr] == -INFINITY ? 0.0f : exp2f(s[nt][i] - m_run[hr]);
        s[nt][i] = p;
        l_part[hr] += p;
      }
#pragma unroll
    for (int nt = 0; nt < kValue / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    // P stays in registers: the accumulators of n-tiles 2j, 2j+1 are the A fragment of k-step j.
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j) {
      const uint32_t pa[4] = {dev::pack_bf16(s[2 * j][0], s[2 * j][1]), dev::pack_bf16(s[2 * j][2], s[2 * j][3]),
                              dev::pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]),
                              dev::pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int np = 0; np < kValue / 16; ++np) {
        uint32_t b[4];
        dev::ldmatrix_x4_trans(b, dev::bt_frag_ptr(v, kVPitch, j * 16, np * 16, lane));
        dev::mma_bf16(o[2 * np], pa, b[0], b[1]);
        dev::mma_bf16(o[2 * np + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  dev::cp_async_wait<0>();

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l_part[hr] += __shfl_xor_sync(0xffffffffu, l_part[hr], 1);
    l_part[hr] += __shfl_xor_sync(0xffffffffu, l_part[hr], 2);
    const int r = warp * 16 + (lane >> 2) + 8 * hr;
    if (r >= q_rows) continue;
    const float inv = l_part[hr] > 0.0f ? 1.0f / l_part[hr] : 0.0f;
    bf16* dst = a.out + (static_cast<int64_t>(t0 + qt * kBQ + r) * a.H + h) * kValue + 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < kValue / 8; ++nt)
      *reinterpret_cast<uint32_t*>(dst + nt * 8) = dev::pack_bf16(o[nt][2 * hr] * inv, o[nt][2 * hr + 1] * inv);
  }
}

}  // namespace

void prefill(gemm::GemmRunner& runner, const PrefillParams& p, CUstream_st* stream) {
  if (auto e = prefill_unsupported(p)) throw Error(*e);
  if (p.T == 0 || p.N == 0) return;
  char* ws = static_cast<char*>(p.workspace);
  auto carve = [&](size_t bytes) {
    char* r = ws;
    ws += (bytes + 255) & ~size_t{255};
    return r;
  };
  const int64_t C = p.total_ctx, kvw = static_cast<int64_t>(p.H) * (kNope + kValue);
  bf16* cn = reinterpret_cast<bf16*>(carve(C * kLatent * 2));
  bf16* kpe = reinterpret_cast<bf16*>(carve(C * kRope * 2));
  bf16* kv = reinterpret_cast<bf16*>(carve(C * kvw * 2));
  if (C > 0) {
    gather_kernel<<<static_cast<unsigned>((C + 7) / 8), 256, 0, stream>>>(
        reinterpret_cast<const bf16*>(p.cache.data), p.cache.block_table, p.cache.page_size,
        p.cache.max_pages_per_seq, p.cu_ctx, p.N, p.total_ctx, cn, kpe);
    CUDA_CHECK_LAUNCH();
    // kv[C, H*256] = c_n[C, 512] @ Wkv_b[H*256, 512]^T: dense operands for the GEMM wrapper.
    runner.run({TensorView(cn, DType::kBF16, {C, kLatent}, Device::kCUDA),
                TensorView(const_cast<bf16_t*>(p.wkv_b), DType::kBF16, {kvw, kLatent}, Device::kCUDA),
                {}, {}, TensorView(kv, DType::kBF16, {C, kvw}, Device::kCUDA), "mla prefill kv expansion"},
               stream);
  }
  static PerDeviceOnce smem_once;  // one attribute call per device (host-side)
  CUDA_CHECK(opt_in_dynamic_smem(smem_once, prefill_attn_kernel, kAttnSmem));
  const AttnArgs a{reinterpret_cast<const bf16*>(p.q), p.q_stride, kv, kpe, p.cu_seqlens, p.ctx_lens, p.cu_ctx,
                   reinterpret_cast<bf16*>(p.out), p.H, p.scale * kLog2e};
  const dim3 grid((p.max_new_tokens + kBQ - 1) / kBQ, p.N, p.H);
  if (grid.x == 0) return;
  prefill_attn_kernel<<<grid, 128, kAttnSmem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ds::mla
