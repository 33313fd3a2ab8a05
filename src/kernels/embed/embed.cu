// Embedding lookup (16-byte row copies) and the lm_head GEMM.
#include <cuda_runtime.h>

#include "core/align.h"
#include "core/cuda_utils.h"
#include "kernels/embed/embed.h"

namespace ds::embed {

namespace {

// One block per token, one 16-byte vector per thread step.
__global__ void __launch_bounds__(256) embed_kernel(const int32_t* __restrict__ ids, const uint4* __restrict__ table,
                                                    uint4* __restrict__ out, int V, int nvec) {
  const int64_t t = blockIdx.x;
  const int id = ids[t];
  const bool valid = id >= 0 && id < V;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x)
    out[t * nvec + i] = valid ? table[static_cast<int64_t>(id) * nvec + i] : make_uint4(0, 0, 0, 0);
}

}  // namespace

void embed_lookup(const EmbedParams& p, CUstream_st* stream) {
  CHECK(p.T >= 0 && p.V > 0 && p.D > 0 && p.D % 8 == 0, "embed_lookup: T={} V={} D={} (D % 8 == 0)", p.T, p.V, p.D);
  if (p.T == 0) return;
  CHECK(p.ids && p.table && p.out, "embed_lookup: null pointer argument");
  CHECK(aligned16(p.table) && aligned16(p.out),
        "embed_lookup: table and out must be 16-byte aligned");
  const int nvec = p.D / 8;
  embed_kernel<<<p.T, std::min(256, (nvec + 31) / 32 * 32), 0, stream>>>(
      p.ids, reinterpret_cast<const uint4*>(p.table), reinterpret_cast<uint4*>(p.out), p.V, nvec);
  CUDA_CHECK_LAUNCH();
}

void lm_head(gemm::GemmRunner& runner, const LmHeadParams& p, CUstream_st* stream) {
  CHECK(p.x.dtype == DType::kBF16 && (p.w.dtype == DType::kBF16 || p.w.dtype == DType::kF8E4M3) &&
            p.logits.dtype == DType::kF32,
        "lm_head: expects bf16 x, bf16 or e4m3 weight and f32 logits, got {} / {} / {}", dtype_name(p.x.dtype),
        dtype_name(p.w.dtype), dtype_name(p.logits.dtype));
  // An e4m3 weight runs on the W8A16 decode GEMV (fp32 logits; check_gemm refuses T > 4 with a reason).
  runner.run({p.x, p.w, {}, p.w_scale, p.logits, "lm_head", p.norm_w, p.norm_eps}, stream);
}

}  // namespace ds::embed
