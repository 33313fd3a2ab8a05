// MLA fused A-GEMM (q_proj + kv_a_proj_with_mqa as one GEMM), its load-time weight packing, and the latent-cache
// write kernel (kv_a_layernorm RMSNorm of the 512 latent values + copy of k_pe into the page slots).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <tuple>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla/mla.h"

namespace ds::mla {

void fused_a_gemm(gemm::GemmRunner& runner, const FusedAParams& p, CUstream_st* stream) {
  // Every check happens before the first CUDA call: a strided or misaligned view is refused, never read.
  if (auto e = fused_a_unsupported(p)) throw Error(*e);
  runner.run({p.x, p.w, p.x_scale, p.w_scale, p.out, "mla fused A-GEMM", p.norm_w, p.norm_eps}, stream);
}

void pack_fused_a_weight(const PackFusedAParams& p, CUstream_st* stream) {
  constexpr const char* op = "mla pack fused A weight";
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"q_proj", &p.q_proj}, {"kv_a", &p.kv_a},
                         {"packed", &p.packed}})
    if (auto e = gemm::dense_operand_problem(op, name, *t)) throw Error(*e);
  const int64_t D = p.q_proj.shape[1], nq = p.q_proj.shape[0];
  CHECK(p.kv_a.dtype == p.q_proj.dtype && p.packed.dtype == p.q_proj.dtype, "{}: dtypes {} / {} / {} differ", op,
        dtype_name(p.q_proj.dtype), dtype_name(p.kv_a.dtype), dtype_name(p.packed.dtype));
  CHECK(p.kv_a.shape[0] == kRow && p.kv_a.shape[1] == D, "{}: kv_a shape {}", op, p.kv_a.shape_str());
  CHECK(nq % kQk == 0 && p.packed.shape[0] == nq + kRow && p.packed.shape[1] == D, "{}: q_proj {} packed {}", op,
        p.q_proj.shape_str(), p.packed.shape_str());
  // FP8 weights carry 128x128 scales stacked the same way; the seam must sit on a block edge.
  CHECK(p.q_proj.dtype != DType::kF8E4M3 || nq % gemm::kFp8Block == 0,
        "{}: FP8 packing needs H*192 = {} to be a multiple of 128 (even head count)", op, nq);
  const bool fp8 = p.q_proj.dtype == DType::kF8E4M3;
  if (fp8) {
    const int64_t kb = gemm::w_scale_cols(D), nqb = nq / gemm::kFp8Block, nkb = (kRow + 127) / 128;
    for (auto [name, t, rows] : {std::tuple<const char*, const TensorView*, int64_t>{"q_scale", &p.q_scale, nqb},
                                 {"kv_a_scale", &p.kv_a_scale, nkb}, {"packed_scale", &p.packed_scale, nqb + nkb}})
      CHECK(t->data && t->device == Device::kCUDA && t->dtype == DType::kF32 && t->is_contiguous() && t->ndim == 2 &&
                t->shape[0] == rows && t->shape[1] == kb,
            "{}: operand '{}' must be a dense f32 CUDA tensor [{}, {}], got {} {}", op, name, rows, kb,
            dtype_name(t->dtype), t->shape_str());
  } else {
    CHECK(!p.q_scale.data && !p.kv_a_scale.data && !p.packed_scale.data, "{}: scales given for bf16 weights", op);
  }
  const size_t q_bytes = p.q_proj.nbytes(), kv_bytes = p.kv_a.nbytes();
  CUDA_CHECK(cudaMemcpyAsync(p.packed.data, p.q_proj.data, q_bytes, cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(p.packed.data) + q_bytes, p.kv_a.data, kv_bytes,
                             cudaMemcpyDeviceToDevice, stream));
  if (fp8) {
    const size_t qs = p.q_scale.nbytes();
    CUDA_CHECK(cudaMemcpyAsync(p.packed_scale.data, p.q_scale.data, qs, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(p.packed_scale.data) + qs, p.kv_a_scale.data, p.kv_a_scale.nbytes(),
                               cudaMemcpyDeviceToDevice, stream));
  }
}

namespace {

// One warp per token: the 512 latent values are 64 chunks of 8 (two 16-byte loads per lane), k_pe 8 chunks
// (lanes 0-7). Sum of squares in fp32 over the warp; y = w * (x * rsqrt(mean + eps)) rounded once to bf16.
__global__ void __launch_bounds__(128) cache_write_kernel(const __nv_bfloat16* __restrict__ ckv, int64_t ckv_stride,
                                                          const __nv_bfloat16* __restrict__ norm_w,
                                                          const int64_t* __restrict__ slot_mapping,
                                                          __nv_bfloat16* __restrict__ cache, int T, float eps) {
  const int t = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl::wait();  // programmatic dependent launch
  pdl::launch_dependents();
  if (t >= T) return;
  const int64_t slot = pdl::load_prior(slot_mapping + t);
  if (slot < 0) return;  // padding row: touches nothing
  const __nv_bfloat16* src = ckv + t * ckv_stride;
  __nv_bfloat16* dst = cache + slot * kRow;
  uint4 raw[2];
  float v[2][8];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    raw[c] = pdl::load_prior(reinterpret_cast<const uint4*>(src + (lane + 32 * c) * 8));
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[c][2 * i] = f.x;
      v[c][2 * i + 1] = f.y;
      ss += f.x * f.x + f.y * f.y;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / kLatent + eps);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = (lane + 32 * c) * 8;
    const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(norm_w + col));  // a weight
    const __nv_bfloat162* w = reinterpret_cast<const __nv_bfloat162*>(&wraw);
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 wf = __bfloat1622float2(w[i]);
      const __nv_bfloat162 y = __floats2bfloat162_rn(wf.x * (v[c][2 * i] * r), wf.y * (v[c][2 * i + 1] * r));
      o[i] = *reinterpret_cast<const uint32_t*>(&y);
    }
    *reinterpret_cast<uint4*>(dst + col) = out;
  }
  if (lane < kRope / 8)
    *reinterpret_cast<uint4*>(dst + kLatent + lane * 8) =
        pdl::load_prior(reinterpret_cast<const uint4*>(src + kLatent + lane * 8));
}

}  // namespace

void cache_write(const CacheWriteParams& p, CUstream_st* stream) {
  CHECK(p.T >= 0, "mla cache_write: T = {}", p.T);
  if (p.T == 0) return;
  CHECK(p.ckv && p.norm_w && p.slot_mapping && p.cache, "mla cache_write: null pointer argument");
  CHECK(p.ckv_stride >= kRow && p.ckv_stride % 8 == 0 && aligned16(p.ckv),
        "mla cache_write: ckv rows must hold 576 values and start 16-byte aligned (stride {})", p.ckv_stride);
  CHECK(aligned16(p.cache) && aligned16(p.norm_w),
        "mla cache_write: cache and norm_w must be 16-byte aligned");
  CUDA_CHECK(pdl::launch(true, cache_write_kernel, (p.T + 3) / 4, 128, 0, stream,
                         reinterpret_cast<const __nv_bfloat16*>(p.ckv), p.ckv_stride,
                         reinterpret_cast<const __nv_bfloat16*>(p.norm_w), p.slot_mapping,
                         reinterpret_cast<__nv_bfloat16*>(p.cache), p.T, p.eps));
}

}  // namespace ds::mla
