// Host-side operand checks of the cuBLASLt GEMM wrapper (no CUDA call: they run in CI without a GPU).
#include <fmt/format.h>

#include <cstdint>

#include "core/align.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_detail.h"

namespace ds::gemm {

namespace {

std::string strides_str(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
  return s + "]";
}

std::optional<std::string> expect_dtype(const char* op, const char* name, const TensorView& t, DType want) {
  if (t.dtype == want) return std::nullopt;
  return fmt::format("{}: operand '{}' has dtype {}, expected {}", op, name, dtype_name(t.dtype), dtype_name(want));
}

std::optional<std::string> expect_shape(const char* op, const char* name, const TensorView& t, int64_t d0,
                                        int64_t d1) {
  if (t.ndim == 2 && t.shape[0] == d0 && t.shape[1] == d1) return std::nullopt;
  return fmt::format("{}: operand '{}' has shape {}, expected [{}, {}]", op, name, t.shape_str(), d0, d1);
}

}  // namespace

std::optional<std::string> dense_operand_problem(const char* op, const char* name, const TensorView& t) {
  if (t.data == nullptr) return fmt::format("{}: operand '{}' is null", op, name);
  if (t.device != Device::kCUDA) return fmt::format("{}: operand '{}' is not on the CUDA device", op, name);
  if (t.ndim != 2) return fmt::format("{}: operand '{}' must be 2-D, got shape {}", op, name, t.shape_str());
  if (t.shape[0] < 0 || t.shape[1] <= 0)
    return fmt::format("{}: operand '{}' has an empty or negative shape {}", op, name, t.shape_str());
  if (!t.is_contiguous())
    return fmt::format("{}: operand '{}' is a strided view (shape {}, strides {}); the GEMM reads operands as dense "
                       "row-major and refuses strided views",
                       op, name, t.shape_str(), strides_str(t));
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % 16 != 0)
    return fmt::format("{}: operand '{}' is not 16-byte aligned (address {:#x}, offset {} mod 16)", op, name, addr,
                       addr % 16);
  const size_t row_bytes = dtype_bytes_for(t.dtype, static_cast<size_t>(t.shape[1]));
  if (row_bytes % 16 != 0)
    return fmt::format("{}: operand '{}' rows are {} bytes ({} x {}), not a multiple of 16: row starts would be "
                       "misaligned",
                       op, name, row_bytes, t.shape[1], dtype_name(t.dtype));
  return std::nullopt;
}

std::optional<std::string> gemm_unsupported(const GemmParams& p) {
  const char* op = p.op ? p.op : "gemm";
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"x", &p.x}, {"w", &p.w}, {"out", &p.out}})
    if (auto e = dense_operand_problem(op, name, *t)) return e;
  const int64_t M = p.x.shape[0], K = p.x.shape[1], N = p.w.shape[0];
  if (auto e = expect_shape(op, "w", p.w, N, K)) return e;
  if (auto e = expect_shape(op, "out", p.out, M, N)) return e;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    return fmt::format("{}: shape M={} N={} K={} exceeds the 32-bit cuBLASLt dims", op, M, N, K);
  if (p.norm_w) {  // the fused input norm: the decode GEMV's prologue only
    if (p.x.dtype != DType::kBF16 || M > detail::kGemvMaxRows)
      return fmt::format("{}: operand 'norm_w' (fused input norm) needs bf16 x with M <= {} (the decode GEMV), "
                         "got {} x with M = {}",
                         op, detail::kGemvMaxRows, dtype_name(p.x.dtype), M);
    if (K > kNormMaxK || K % 8 != 0)
      return fmt::format("{}: operand 'norm_w' (fused input norm) needs K % 8 == 0 and K <= {} (K = {})", op,
                         kNormMaxK, K);
    if (!aligned16(p.norm_w))
      return fmt::format("{}: operand 'norm_w' must be 16-byte aligned", op);
  }
  if (p.post_norm_w) {  // the layer boundary after the projection: the decode GEMV's last block only
    if (p.x.dtype != DType::kBF16 || M > detail::kGemvMaxRows || p.out.dtype != DType::kBF16)
      return fmt::format("{}: operand 'post_norm_w' (fused residual add + norm) needs bf16 x with M <= {} and bf16 "
                         "out (the decode GEMV), got {} x with M = {} and {} out",
                         op, detail::kGemvMaxRows, dtype_name(p.x.dtype), M, dtype_name(p.out.dtype));
    if (p.norm_w) return fmt::format("{}: operands 'norm_w' and 'post_norm_w' are not fused together", op);
    if (N % 8 != 0 || N > 8192)
      return fmt::format("{}: operand 'post_norm_w' (fused residual add + norm) needs N % 8 == 0 and N <= 8192 "
                         "(N = {})",
                         op, N);
    if (!p.post_residual || !p.post_out || !p.post_counter)
      return fmt::format("{}: operand 'post_norm_w' needs post_residual, post_out and post_counter", op);
    if (!aligned16(p.post_norm_w) || !aligned16(p.post_residual) || !aligned16(p.post_out))
      return fmt::format("{}: operands 'post_norm_w', 'post_residual' and 'post_out' must be 16-byte aligned", op);
    if (p.post_residual == p.post_out || static_cast<const void*>(p.post_residual) == p.out.data ||
        static_cast<const void*>(p.post_out) == p.out.data)
      return fmt::format("{}: operands 'post_residual', 'post_out' and 'out' must not alias", op);
  }

  if (p.x.dtype == DType::kBF16 && p.w.dtype == DType::kF8E4M3) {
    // W8A16 decode path (gemv.cu): bf16 token rows against FP8 block-scaled weights, no activation scales.
    if (M > detail::kGemvMaxRows)
      return fmt::format("{}: bf16 x with FP8 weights (W8A16) runs only for M <= {} (operand 'x' has M = {}): "
                         "quantise x for the FP8 GEMM instead",
                         op, detail::kGemvMaxRows, M);
    if (K % kFp8Block != 0)
      return fmt::format("{}: W8A16 GEMM needs K % 128 == 0 (operand 'x' has K = {})", op, K);
    if (p.out.dtype != DType::kBF16 && p.out.dtype != DType::kF32)
      return fmt::format("{}: operand 'out' has dtype {}, expected bf16 or f32", op, dtype_name(p.out.dtype));
    if (p.x_scale.data) return fmt::format("{}: operand 'x_scale' given for a W8A16 GEMM (x is bf16)", op);
    if (p.w_scale.data == nullptr) return fmt::format("{}: operand 'w_scale' is missing for an FP8 weight", op);
    if (auto e = expect_dtype(op, "w_scale", p.w_scale, DType::kF32)) return e;
    if (auto e = expect_shape(op, "w_scale", p.w_scale, (N + kFp8Block - 1) / kFp8Block, w_scale_cols(K))) return e;
    if (p.w_scale.device != Device::kCUDA || !p.w_scale.is_contiguous())
      return fmt::format("{}: operand 'w_scale' must be a dense CUDA tensor", op);
    return std::nullopt;
  }
  if (p.x.dtype == DType::kBF16) {
    if (auto e = expect_dtype(op, "w", p.w, DType::kBF16)) return e;
    if (p.out.dtype != DType::kBF16 && p.out.dtype != DType::kF32)
      return fmt::format("{}: operand 'out' has dtype {}, expected bf16 or f32", op, dtype_name(p.out.dtype));
    if (p.x_scale.data || p.w_scale.data)
      return fmt::format("{}: scales given for a bf16 GEMM (operands 'x_scale'/'w_scale' must be empty)", op);
    return std::nullopt;
  }
  if (p.x.dtype != DType::kF8E4M3)
    return fmt::format("{}: operand 'x' has dtype {}, expected bf16 or f8e4m3", op, dtype_name(p.x.dtype));
  // FP8 block-scaled path: only the verified scale layouts (see gemm.h) are accepted.
  if (auto e = expect_dtype(op, "w", p.w, DType::kF8E4M3)) return e;
  if (auto e = expect_dtype(op, "out", p.out, DType::kBF16)) return e;
  if (K % kFp8Block != 0)
    return fmt::format("{}: FP8 block-scaled GEMM needs K % 128 == 0 (operand 'x' has K = {})", op, K);
  // H200, cuBLASLt 13.1 (docs/perf-mla.md, run 2): no algorithm at M = 1 or 17 in any operand order, and silently
  // wrong results at M = 1 in the x-as-A order; correct at M = 16, 64, 200 (and timed at 128, 1024, 8192).
  if (M % kFp8RowMultiple != 0)
    return fmt::format("{}: FP8 block-scaled GEMM needs M % {} == 0 (operand 'x' has M = {}): pad the token rows "
                       "(zero rows quantise to zero codes)",
                       op, kFp8RowMultiple, M);
  const int64_t kb = K / kFp8Block, nb = (N + kFp8Block - 1) / kFp8Block;
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"x_scale", &p.x_scale}, {"w_scale", &p.w_scale}}) {
    if (t->data == nullptr) return fmt::format("{}: operand '{}' is missing for an FP8 GEMM", op, name);
    if (auto e = expect_dtype(op, name, *t, DType::kF32)) return e;
  }
  constexpr detail::Fp8Layout cfg = detail::kVerifiedFp8Layout;
  if (auto e = cfg.x_scale_k_major ? expect_shape(op, "x_scale", p.x_scale, M, kb)
                                   : expect_shape(op, "x_scale", p.x_scale, kb, M))
    return e;
  if (auto e = cfg.w_scale_n_major ? expect_shape(op, "w_scale", p.w_scale, kb, nb)
                                   : expect_shape(op, "w_scale", p.w_scale, nb, w_scale_cols(K)))
    return e;
  // Scales are read whole by cuBLASLt: dense and 16-byte aligned base (rows of M floats need not be).
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"x_scale", &p.x_scale}, {"w_scale", &p.w_scale}}) {
    if (t->device != Device::kCUDA) return fmt::format("{}: operand '{}' is not on the CUDA device", op, name);
    if (!t->is_contiguous())
      return fmt::format("{}: operand '{}' is a strided view (shape {}, strides {}); refused", op, name,
                         t->shape_str(), strides_str(*t));
    if (!aligned16(t->data))
      return fmt::format("{}: operand '{}' is not 16-byte aligned", op, name);
  }
  return std::nullopt;
}

void check_gemm(const GemmParams& p) {
  if (auto e = gemm_unsupported(p)) throw Error(*e);
}

}  // namespace ds::gemm
