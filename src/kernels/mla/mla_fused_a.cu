// MLA fused A-GEMM (q_proj + kv_a_proj_with_mqa as one GEMM), its load-time weight packing, and the latent-cache
// write kernel (kv_a_layernorm RMSNorm of the 512 latent values + copy of k_pe into the page slots).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <tuple>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_cache_write.cuh"

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

__global__ void __launch_bounds__(128) cache_write_kernel(const dev::CacheWriteArgs a, int T) {
  const int t = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl::wait();  // programmatic dependent launch
  pdl::launch_dependents();
  if (t < T) dev::cache_write_token(a, t, lane);
}

}  // namespace

void cache_write(const CacheWriteParams& p, CUstream_st* stream) {
  if (auto e = cache_write_unsupported(p)) throw Error(*e);
  if (p.T == 0) return;
  CUDA_CHECK(pdl::launch(true, cache_write_kernel, (p.T + 3) / 4, 128, 0, stream, dev::cache_write_args(p), p.T));
}

}  // namespace ds::mla
