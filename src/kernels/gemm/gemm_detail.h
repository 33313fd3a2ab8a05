// Internal to the GEMM wrapper and its tests: the FP8 operand-order / scale-layout configurations and the probe
// that runs any of them, so one GPU run can show which configuration gives a row-major [M, N] result.
#pragma once

#include <cstdint>

#include "kernels/gemm/gemm.h"

struct CUstream_st;

namespace ds::gemm::detail {

// How the row-major problem out[M, N] = x[M, K] @ W[N, K]^T is handed to (column-major) cuBLASLt.
struct Fp8Layout {
  // true : cuBLASLt A = W (TRANSA = T, 128x128 scales), B = x (TRANSB = N, 1x128 scales); D is column-major
  //        [N, M] with ld N, which is exactly row-major [M, N]. Needs no output-order attribute.
  // false: the order deps.md verified: A = x (TRANSA = T, 1x128), B = W (TRANSB = N, 128x128); D column-major
  //        [M, N] is row-major [N, M] (the transpose) unless d_row_order asks for CUBLASLT_ORDER_ROW.
  bool weight_is_a = true;
  bool d_row_order = false;       // only with weight_is_a == false
  bool x_scale_k_major = false;   // x scales stored [M, K/128] (K-blocks contiguous) instead of [K/128, M]
  bool w_scale_n_major = false;   // w scales stored [K/128, ceil(N/128)] instead of [ceil(N/128), K/128]
};

// The configuration GemmRunner uses. H200 run 2 (docs/perf-mla.md): correct at M = 16, 64, 200 (N = 384,
// K = 512), as are the two x-as-A orders; x scales stored K-major are wrong (RMS ratio ~1); no configuration
// has an algorithm at M = 1 or 17, and the deps.md order returned wrong numbers at M = 1 without an error.
// gemm_unsupported() only admits the scale shapes of this configuration and M % 8 == 0.
inline constexpr Fp8Layout kVerifiedFp8Layout{true, false, false, false};

// Runs one FP8 block-scaled GEMM with an explicit configuration on its own handle and workspace (tests only).
// Raw device pointers; out is written in the layout the configuration implies. Returns false when cuBLASLt
// offers no algorithm for it (unsupported), throws on other errors.
bool run_fp8_probe(const Fp8Layout& cfg, const void* x, const void* w, const float* x_scale, const float* w_scale,
                   void* out, int M, int N, int K, CUstream_st* stream);

// bf16 GEMMs with at most kGemvMaxRows token rows (decode) run on a weight-streaming kernel (gemv.cu) instead of
// cuBLASLt. Raw dense operands (the caller has run check_gemm): x [M, K], w [N, K] bf16, out [M, N] bf16 or f32.
inline constexpr int kGemvMaxRows = kDecodeMaxRows;
// `splits`: warps of a block sharing one row group (split K); 0 = the kernel's own choice, else 1, 2, 4 or 8
// (benchmarks sweep it to tune that choice). `norm`: GemmParams::norm_w / norm_eps (w null: x is used as is).
struct GemvNorm {
  const void* w = nullptr;
  float eps = 0.0f;
  // GemmParams::post_*: residual += out; post_out = RMSNorm(residual) * post_w, by the last block (bf16 out only).
  const void* post_w = nullptr;
  void* post_residual = nullptr;
  void* post_out = nullptr;
  int32_t* post_counter = nullptr;
};
void gemv_bf16(const void* x, const void* w, void* out, bool out_f32, int M, int N, int K, CUstream_st* stream,
               int splits = 0, GemvNorm norm = {});
// The W8A16 path of the same kernel family: x bf16 [M, K], w e4m3 [N, K] with 128x128 block scales
// w_scale [ceil(N/128), scale_pitch] (gemm.h layout), out [M, N] bf16 or f32; K % 128 == 0.
void gemv_w8a16(const void* x, const void* w, const float* w_scale, int scale_pitch, void* out, bool out_f32, int M,
                int N, int K, CUstream_st* stream, int splits = 0, GemvNorm norm = {});
// The split count gemv_bf16 / gemv_w8a16 choose for N x K (fp8: the W8A16 kernel's row groups).
int gemv_default_splits(int N, int K, bool fp8);

}  // namespace ds::gemm::detail
