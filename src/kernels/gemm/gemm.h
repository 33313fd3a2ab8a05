// Dense GEMMs through cuBLASLt: out[M, N] = x[M, K] @ W[N, K]^T (HF weight layout, everything row-major), bf16 or
// FP8 block-scaled operands, fp32 accumulation; plus the FP8 quantisers (activations 1x128, weights 128x128).
//
// Operand contract (checked on the host before any CUDA call; gemm_unsupported() names the failing operand):
//   - every operand is a dense row-major view (TensorView::is_contiguous) on the CUDA device: a strided slice is
//     refused, never read as if dense;
//   - every data pointer is 16-byte aligned and every row is a multiple of 16 bytes, so each row stays aligned
//     (cuBLASLt's tensor-core kernels load 16-byte vectors);
//   - bf16 path : x bf16, w bf16, out bf16 or f32 (f32 = lm_head logits);
//   - FP8 path  : x e4m3 + x_scale, w e4m3 + w_scale, out bf16; K % 128 == 0, M % 8 == 0 (cuBLASLt 13.1 has no
//                 algorithm for M = 1 or 17 on the H200; callers pad the token rows).
//   - W8A16 path: x bf16 (no x_scale), w e4m3 + w_scale, out bf16 or f32; M <= kDecodeMaxRows, K % 128 == 0: a
//                 weight-streaming kernel (gemv.cu) for decode steps, no activation quantiser.
//
// FP8 scale layouts (verified on the H200 with cuBLASLt 13.1 by GemmCublasLt.Fp8LayoutProbe; the K-major
// activation-scale layout gives wrong numbers silently, so the checks pin the shapes; docs/perf-mla.md run 2):
//   x_scale f32 [K/128, M]          1x128 per-token-group scales, M contiguous: sa[kb * M + m]; x ~= q * sa
//   w_scale f32 [ceil(N/128), w_scale_cols(K)] 128x128 block scales (checkpoint weight_scale_inv), K-blocks
//                                   contiguous, rows padded to a multiple of 4 floats (16 bytes):
//                                   sb[nb * w_scale_cols(K) + kb]; w ~= q * sb. H200 run of 2026-12-02: with
//                                   unpadded rows (K/128 = 2 or 18) cuBLASLt read the wrong scales (RMS ratio
//                                   0.1-0.8, NaN past the end) while K/128 = 4 was right; pad columns are zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/tensor.h"

struct CUstream_st;  // cudaStream_t without the CUDA headers (host code includes this file)

namespace ds::gemm {

inline constexpr int kFp8Block = 128;       // scale block edge (1x128 activations, 128x128 weights)
inline constexpr int kFp8RowMultiple = 8;  // FP8 GEMMs need M % 8 == 0 (verified set: gemm_check.cpp)
inline constexpr int kDecodeMaxRows = 4;   // M up to which bf16 GEMMs and the W8A16 path run on gemv.cu
// Columns of a weight-scale tensor (see the layout above): K/128 rounded up to a multiple of 4.
inline constexpr int64_t w_scale_cols(int64_t K) { return (K / kFp8Block + 3) / 4 * 4; }

struct GemmParams {
  TensorView x;        // [M, K] bf16 or e4m3
  TensorView w;        // [N, K] bf16 or e4m3 (HF nn.Linear weight)
  TensorView x_scale;  // FP8 only: f32 [K/128, M]
  TensorView w_scale;  // FP8 only: f32 [ceil(N/128), w_scale_cols(K)]
  TensorView out;      // [M, N] bf16 (f32 allowed on the bf16 path)
  const char* op = "gemm";  // caller's op name, used in error messages
  // Decode GEMV path only (bf16 x, M <= kDecodeMaxRows, bf16 or W8A16 weights): x holds un-normalised rows and
  // the op multiplies RMSNorm(x) * norm_w instead, with norm::rmsnorm's bits: a layer's input norm fused into
  // its first projection, one kernel boundary less per decode layer. K <= kNormMaxK.
  const bf16_t* norm_w = nullptr;  // [K] bf16, 16-byte aligned
  float norm_eps = 0.0f;
  // Decode GEMV path only (bf16 out, no fused input norm): the layer boundary after the projection (o_proj, then
  // the post-attention norm) in the same kernel. Its last block adds out into post_residual [M, N] and writes
  // post_out = RMSNorm(post_residual) * post_norm_w [M, N]: norm::add_rmsnorm's bits, one launch less per decode
  // layer. post_counter: one int32 of device memory, zero before the first call; every call leaves it zero
  // (one counter may serve every call on a stream). N % 8 == 0, N <= 8192, all 16-byte aligned; eps: norm_eps.
  const bf16_t* post_norm_w = nullptr;  // null: no boundary
  bf16_t* post_residual = nullptr;
  bf16_t* post_out = nullptr;
  int32_t* post_counter = nullptr;
};
// The fused norm keeps the normalised rows in shared memory: M x K bf16, 32 KB at M = kDecodeMaxRows, which with
// the kernel's static arrays stays under the 48 KB a launch gets without opting in (H200 run: K = 6144 at M = 4,
// 48 KB + static, was refused by the launch).
inline constexpr int kNormMaxK = 4096;

// nullopt when the operands satisfy the contract above; otherwise the reason, naming the operand. No CUDA call.
std::optional<std::string> gemm_unsupported(const GemmParams& p);
// Throws ds::Error carrying gemm_unsupported()'s reason.
void check_gemm(const GemmParams& p);

// Checks of one operand, shared with ops that wrap the GEMM (the MLA fused A-GEMM): dense, on the GPU, 16-byte
// aligned data pointer and row pitch. nullopt or the reason ("<op>: operand '<name>' ...").
std::optional<std::string> dense_operand_problem(const char* op, const char* name, const TensorView& t);

// One cuBLASLt handle, a plan per (path, M, N, K, out dtype) — the heuristic is asked once per shape — and a
// workspace allocated once up front, so run() never allocates and can be captured in a CUDA graph once init()
// and prepare() have run for the shapes the graph uses. Not thread-safe: one runner per stream.
class GemmRunner {
 public:
  static constexpr size_t kDefaultWorkspace = size_t{32} << 20;  // cuBLASLt's Hopper recommendation: 32 MiB

  explicit GemmRunner(size_t workspace_bytes = kDefaultWorkspace);  // no CUDA call
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  void init();                        // creates the handle and the workspace (idempotent)
  void prepare(const GemmParams& p);  // check + plan the shape now (before graph capture)
  void run(const GemmParams& p, CUstream_st* stream);  // check, plan if new, launch
  size_t num_plans() const;
  // bf16 GEMMs with M <= 4 rows use a weight-streaming kernel (gemv.cu) unless this is off (tests, benchmarks;
  // a fused input norm then is refused).
  void set_use_gemv(bool on) { use_gemv_ = on; }
  bool uses_gemv() const { return use_gemv_; }

 private:
  bool use_gemv_ = true;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Two decode-size bf16 GEMMs in one launch, each x read through a row stride (a column slice of a wider
// activation, e.g. the KDA f_a / g_a columns of the packed projection output): out_i[M, N_i] = x_i[M, K_i] @
// w_i[N_i, K_i]^T, bf16 out. M <= kDecodeMaxRows; pointers 16-byte aligned, K_i and x strides multiples of 8
// (checked: ds::Error otherwise).
struct StridedGemv {
  const bf16_t* x = nullptr;
  int64_t x_stride = 0;  // elements between token rows
  const bf16_t* w = nullptr;
  bf16_t* out = nullptr;  // [M, N] dense
  int N = 0, K = 0;
};
void gemv_pair_bf16(const StridedGemv& a, const StridedGemv& b, int M, CUstream_st* stream);

// ---- FP8 quantisers (bf16 -> e4m3 with fp32 scales = amax / 448; a zero block gets scale amax_floor / 448)

struct QuantActParams {
  const bf16_t* x = nullptr;  // [M, K] bf16, row stride x_stride (elements; a strided row slice is fine here)
  int64_t x_stride = 0;
  uint8_t* q = nullptr;       // [M, K] e4m3 dense
  float* scale = nullptr;     // [K/128, M] (the x_scale layout above)
  int M = 0, K = 0;           // K % 128 == 0
};
void quantize_act_fp8(const QuantActParams& p, CUstream_st* stream);

struct QuantWeightParams {
  const bf16_t* w = nullptr;  // [N, K] bf16 dense
  uint8_t* q = nullptr;       // [N, K] e4m3 dense
  float* scale = nullptr;     // [ceil(N/128), w_scale_cols(K)] (the w_scale layout above; pad columns zeroed)
  int N = 0, K = 0;           // K % 128 == 0; N arbitrary (the last row block may be partial)
  int64_t scale_pitch = 0;    // floats per scale row: 0 = w_scale_cols(K) (cuBLASLt); K/128 for the MoE kernels
};
void quantize_weight_fp8(const QuantWeightParams& p, CUstream_st* stream);  // load time

// The smallest amax a scale is computed from: a block of zeros gets a finite, non-zero scale (its codes are 0).
inline constexpr float kAmaxFloor = 1e-12f;

}  // namespace ds::gemm
