// cuBLASLt GEMM runner: handle, per-shape plans (one heuristic query each), fixed workspace; the FP8 probe.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "core/cuda_utils.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_detail.h"

#define LT_CHECK(expr)                                                                                   \
  do {                                                                                                   \
    cublasStatus_t ds_s_ = (expr);                                                                       \
    if (ds_s_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                     \
      ::ds::detail::throw_check(__FILE__, __LINE__, #expr,                                               \
                                ::fmt::format("cuBLASLt status {} ({})", static_cast<int>(ds_s_),        \
                                              cublasLtGetStatusString(ds_s_)));                          \
  } while (0)

namespace ds::gemm {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    default: DS_THROW("gemm: no cuBLASLt type for {}", dtype_name(t));
  }
}

// Descriptors of one problem shape; attributes that carry pointers (the FP8 scales) are set per call.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool weight_is_a = true;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// Builds the descriptors for out[M, N] = x[M, K] @ W[N, K]^T and asks the heuristic once. Returns false when
// cuBLASLt has no algorithm (the caller decides whether that is an error).
// FP8: the scale pointers must be set before the heuristic query — with a block scale mode a null scale pointer
// makes cublasLtMatmulAlgoGetHeuristic fail with CUBLAS_STATUS_INVALID_VALUE (seen on the H200, cuBLASLt 13.1).
bool build_plan(cublasLtHandle_t h, size_t ws_bytes, Plan& pl, DType in_t, DType out_t, bool fp8,
                const detail::Fp8Layout& cfg, int64_t M, int64_t N, int64_t K, const void* x_scale,
                const void* w_scale) {
  LT_CHECK(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  pl.weight_is_a = !fp8 || cfg.weight_is_a;
  if (fp8) {
    const int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t a_mode = pl.weight_is_a ? blk : vec, b_mode = pl.weight_is_a ? vec : blk;
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    const void* as = pl.weight_is_a ? w_scale : x_scale;
    const void* bs = pl.weight_is_a ? x_scale : w_scale;
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof(as)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof(bs)));
  }
  const cudaDataType_t it = cuda_type(in_t), ot = cuda_type(out_t);
  // Row-major [R, K] is column-major [K, R] with ld K; TRANSA = T turns the A side back into [R, K].
  const int64_t rows_a = pl.weight_is_a ? N : M, rows_b = pl.weight_is_a ? M : N;
  LT_CHECK(cublasLtMatrixLayoutCreate(&pl.a, it, K, rows_a, K));
  LT_CHECK(cublasLtMatrixLayoutCreate(&pl.b, it, K, rows_b, K));
  if (pl.weight_is_a) {
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl.d, ot, N, M, N));  // column-major [N, M] == row-major [M, N]
  } else if (cfg.d_row_order) {
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl.d, ot, M, N, N));
    const int32_t order = CUBLASLT_ORDER_ROW;
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(pl.d, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
  } else {
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl.d, ot, M, N, M));  // column-major [M, N] == row-major [N, M]
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_bytes;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, pl.desc, pl.a, pl.b, pl.d, pl.d, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  LT_CHECK(st);
  pl.algo = res.algo;
  return true;
}

void launch(cublasLtHandle_t h, const Plan& pl, const void* x, const void* w, const float* xs, const float* ws,
            void* out, void* workspace, size_t ws_bytes, cudaStream_t stream) {
  const void* a = pl.weight_is_a ? w : x;
  const void* b = pl.weight_is_a ? x : w;
  if (xs) {  // FP8: the scale pointers follow their operands
    const void* as = pl.weight_is_a ? static_cast<const void*>(ws) : static_cast<const void*>(xs);
    const void* bs = pl.weight_is_a ? static_cast<const void*>(xs) : static_cast<const void*>(ws);
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof(as)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof(bs)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  LT_CHECK(cublasLtMatmul(h, pl.desc, &alpha, a, pl.a, b, pl.b, &beta, out, pl.d, out, pl.d, &pl.algo, workspace,
                          ws_bytes, stream));
}

}  // namespace

struct GemmRunner::Impl {
  size_t ws_bytes;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  // key: (fp8, M, N, K, out dtype)
  std::map<std::tuple<bool, int64_t, int64_t, int64_t, int>, std::unique_ptr<Plan>> plans;

  explicit Impl(size_t b) : ws_bytes(b) {}
  ~Impl() {
    plans.clear();
    if (handle) cublasLtDestroy(handle);
  }

  const Plan& plan_for(const GemmParams& p) {
    const bool fp8 = p.x.dtype == DType::kF8E4M3;
    const int64_t M = p.x.shape[0], N = p.w.shape[0], K = p.x.shape[1];
    const auto key = std::make_tuple(fp8, M, N, K, static_cast<int>(p.out.dtype));
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto pl = std::make_unique<Plan>();
    if (!build_plan(handle, ws_bytes, *pl, p.x.dtype, p.out.dtype, fp8, detail::kVerifiedFp8Layout, M, N, K,
                    p.x_scale.data, p.w_scale.data))
      DS_THROW("{}: cuBLASLt has no algorithm for {} M={} N={} K={} -> {}", p.op, fp8 ? "FP8 block-scaled" : "bf16",
               M, N, K, dtype_name(p.out.dtype));
    return *plans.emplace(key, std::move(pl)).first->second;
  }
};

GemmRunner::GemmRunner(size_t workspace_bytes) : impl_(std::make_unique<Impl>(workspace_bytes)) {}
GemmRunner::~GemmRunner() = default;

void GemmRunner::init() {
  if (impl_->handle) return;
  LT_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace.reset(impl_->ws_bytes);
}

void GemmRunner::prepare(const GemmParams& p) {
  check_gemm(p);  // before any CUDA call
  init();
  if (p.x.dtype == DType::kBF16 && p.w.dtype == DType::kF8E4M3) return;  // W8A16: gemv only, no plan
  if (use_gemv_ && p.x.dtype == DType::kBF16 && p.x.shape[0] <= detail::kGemvMaxRows) return;  // no plan needed
  if (p.x.shape[0] > 0) impl_->plan_for(p);
}

void GemmRunner::run(const GemmParams& p, CUstream_st* stream) {
  check_gemm(p);  // before any CUDA call: a refused view is never handed to cuBLASLt
  if (p.x.shape[0] == 0) return;
  const detail::GemvNorm norm{p.norm_w, p.norm_eps, p.post_norm_w, p.post_residual, p.post_out, p.post_counter};
  if (p.x.dtype == DType::kBF16 && p.w.dtype == DType::kF8E4M3) {  // W8A16 (check_gemm admitted M <= 4)
    detail::gemv_w8a16(p.x.data, p.w.data, p.w_scale.ptr<const float>(), static_cast<int>(p.w_scale.shape[1]),
                       p.out.data, p.out.dtype == DType::kF32, static_cast<int>(p.x.shape[0]),
                       static_cast<int>(p.w.shape[0]), static_cast<int>(p.x.shape[1]), stream, 0, norm);
    return;
  }
  if (use_gemv_ && p.x.dtype == DType::kBF16 && p.x.shape[0] <= detail::kGemvMaxRows) {
    detail::gemv_bf16(p.x.data, p.w.data, p.out.data, p.out.dtype == DType::kF32, static_cast<int>(p.x.shape[0]),
                      static_cast<int>(p.w.shape[0]), static_cast<int>(p.x.shape[1]), stream, 0, norm);
    return;
  }
  CHECK(!p.norm_w && !p.post_norm_w,
        "{}: a fused input norm or layer boundary runs only on the decode GEMV (the runner's GEMV path is off)", p.op);
  init();
  const Plan& pl = impl_->plan_for(p);
  launch(impl_->handle, pl, p.x.data, p.w.data, p.x_scale.ptr<const float>(), p.w_scale.ptr<const float>(),
         p.out.data, impl_->workspace.get(), impl_->ws_bytes, stream);
}

size_t GemmRunner::num_plans() const { return impl_->plans.size(); }

bool detail::run_fp8_probe(const Fp8Layout& cfg, const void* x, const void* w, const float* x_scale,
                           const float* w_scale, void* out, int M, int N, int K, CUstream_st* stream) {
  cublasLtHandle_t h = nullptr;
  LT_CHECK(cublasLtCreate(&h));
  const size_t ws_bytes = GemmRunner::kDefaultWorkspace;
  DeviceBuffer ws(ws_bytes);
  bool ok = false;
  {
    Plan pl;
    ok = build_plan(h, ws_bytes, pl, DType::kF8E4M3, DType::kBF16, true, cfg, M, N, K, x_scale, w_scale);
    if (ok) launch(h, pl, x, w, x_scale, w_scale, out, ws.get(), ws_bytes, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  cublasLtDestroy(h);
  return ok;
}

}  // namespace ds::gemm
