// CPU reference of the fused finalize + all-reduce + RMSNorm: moe's finalize_ref per rank, a rank-ordered fp32
// sum, and norm's rmsnorm_ref, with the contract's roundings in between.
#include "kernels/allreduce/allreduce_ref.h"

#include "core/error.h"
#include "kernels/moe/moe_ref.h"
#include "kernels/norm/norm_ref.h"

namespace ds::allreduce {

float round_act(DType dtype, float x) {
  if (dtype == DType::kBF16) return round_bf16(x);
  CHECK(dtype == DType::kF16, "round_act: dtype {}", dtype_name(dtype));
  return f16_to_f32(f32_to_f16(x));
}

void fused_ar_norm_ref(const FusedArNormRefArgs& a) {
  const size_t R = a.expert_out.size();
  CHECK(R >= 1 && a.expanded_to_permuted.size() == R && a.topk_weights.size() == R && a.shared_out.size() == R,
        "fused_ar_norm_ref: per-rank inputs for {} ranks", R);
  const size_t n = static_cast<size_t>(a.T) * a.D;
  std::vector<float> sum(n), partial(n);
  for (size_t r = 0; r < R; ++r) {
    // finalize_ref skips routes whose id is negative: the index map's sign carries the same meaning.
    moe::finalize_ref({a.expert_out[r], a.expanded_to_permuted[r], a.topk_weights[r], a.shared_out[r], nullptr, a.T,
                       a.D, a.TOPK, partial.data()});
    for (size_t i = 0; i < n; ++i) {
      const float p = round_act(a.dtype, partial[i]);
      sum[i] = r == 0 ? p : sum[i] + p;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    sum[i] = round_act(a.dtype, sum[i]);
    a.residual_out[i] = round_act(a.dtype, a.residual[i] + sum[i]);
  }
  if (a.sum) std::copy(sum.begin(), sum.end(), a.sum);
  norm::rmsnorm_ref(a.residual_out, a.norm_w, a.T, a.D, a.eps, a.y);
  for (size_t i = 0; i < n; ++i) a.y[i] = round_act(a.dtype, a.y[i]);
}

}  // namespace ds::allreduce
