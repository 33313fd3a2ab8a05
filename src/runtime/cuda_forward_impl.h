// CudaForward internals shared by cuda_forward.cpp (set-up, steps, graphs, profile) and cuda_forward_layers.cpp
// (the per-layer launches). CUDA builds only; nothing outside src/runtime/cuda_forward*.cpp includes this.
#pragma once

#if defined(DELTASERVE_WITH_CUDA)

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_utils.h"
#include "runtime/op_ablation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/kda/kda.h"
#include "kernels/moe/moe.h"
#include "runtime/cuda_forward.h"
#include "runtime/parallel/all_reduce.h"
#include "runtime/parallel/group.h"
#include "runtime/parallel/tp_finalize.h"

namespace ds {

// Page-locked host memory (the staging buffer of the per-step copies).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) { CUDA_CHECK(cudaMallocHost(&p_, bytes)); bytes_ = bytes; }
  ~PinnedBuffer() { if (p_) cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T = void> T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Profile categories of the per-step breakdown, and their names (profile tables, op ablation).
enum class OpCat : int { kKda, kMla, kMoe, kGemm, kOther, kCount };
inline constexpr const char* kOpCatNames[] = {"kda", "mla", "moe", "gemm", "other"};

// Device addresses of one step's metadata arrays (the device blob + the step's layout).
struct DevMeta {
  const int32_t* ids = nullptr;
  const int64_t* slot_mapping = nullptr;
  const int32_t* kda_slots = nullptr;
  const int32_t* ctx_lens = nullptr;
  const int32_t* page_table = nullptr;
  const int32_t* pf_cu = nullptr;
  const int32_t* pf_chunks = nullptr;
  const int32_t* grp_cu = nullptr;
  const int32_t* grp_cu_ctx = nullptr;
  const int32_t* sample_rows = nullptr;
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const uint64_t* seed = nullptr;
  const int64_t* step = nullptr;
};

struct CudaForward::Impl {
  Impl(std::shared_ptr<const DeviceModel> m, CudaForwardOptions opts);
  ~Impl();

  // ---- set-up (cuda_forward.cpp)
  void resolve_options();
  void plan_and_allocate();
  void size_latent_cache();
  void prepare_layers();

  // ---- steps (cuda_forward.cpp)
  std::vector<int32_t> step(const StepPlan& plan, const std::vector<int32_t>& tokens,
                            const std::vector<SampleSpec>& samples);
  void upload(const StepMetadata& m);
  DevMeta dev_meta(const MetaLayout& l) const;
  void capture_graph(const StepMetadata& shape, std::pair<int, int> key);
  void mark(OpCat c, const char* name);
  template <class F> bool op(OpCat c, const char* name, F&& f);  // false: ablated (benchmarks)

  // ---- the forward (cuda_forward_layers.cpp): every launch of one step, on `stream`
  void run(const StepMetadata& m);
  // in_norm: the layer's input RMSNorm weight when the first projection applies it (x then still holds h, see
  // fuses_input_norm), else null (x is normed).
  // post: o_proj also applies the layer boundary (h += attn_out; x = RMSNorm(h) * post_norm; fuses_post_norm).
  void kda_layer(const DeviceLayer& l, int kda_idx, const StepMetadata& m, const DevMeta& d, const bf16_t* in_norm,
                 bool post);
  void mla_layer(const DeviceLayer& l, int mla_idx, const StepMetadata& m, const DevMeta& d, const bf16_t* in_norm,
                 bool post);
  // Whether this layer's o_proj applies the post-attention residual add + RMSNorm (the decode GEMV's last block):
  // DELTASERVE_FUSED_POST_NORM, no all-reduce after o_proj (not TEP), and the step runs o_proj on the decode GEMV.
  bool fuses_post_norm(const DeviceLayer& l, int rows) const;
  // The packed KDA projection of `rows` rows into `proj` (x un-normalised when in_norm is set): one GEMM, or with
  // a split weight (DELTASERVE_FP8_KDA_PROJ=2) its FP8 q/k/v part and bf16 gate part, written into the packed row
  // directly for one decode row, else through proj_parts and two column copies.
  void kda_projection(const KdaLayerWeights& k, const bf16_t* in, int rows, const bf16_t* in_norm);
  // Whether this layer's first projection (KDA packed projection / MLA fused A) can fuse the input RMSNorm:
  // DELTASERVE_FUSED_INPUT_NORM, one GPU, and the step runs that projection on the decode GEMV.
  bool fuses_input_norm(const DeviceLayer& l, int rows) const;
  // Whether `rows` rows times w run on the decode GEMV (gemv.cu) rather than cuBLASLt.
  bool on_decode_gemv(const DeviceLinear& w, int rows) const;
  // Whether `rows` rows times w run on the decode GEMV with a fused RMSNorm (DELTASERVE_FUSED_INPUT_NORM).
  bool gemv_takes_norm(const DeviceLinear& w, int rows) const;
  // Returns whether the op also wrote next_norm's RMSNorm of h into x (DELTASERVE_MOE_FUSED_NORM).
  // pre: the op's router applies the post-attention boundary (h_next = h + attn_out; x = RMSNorm(h_next)), and
  // the op then writes h = h_next + its output (moe_pre_norm).
  bool moe_layer(const DeviceLayer& l, int layer, const StepMetadata& m, const bf16_t* next_norm, bool pre = false);
  // Whether this MoE layer's op applies the post-attention boundary in its router (DELTASERVE_MOE_PRE_NORM, one GPU,
  // in-kernel routing, and moe_pre_norm_unsupported() agrees for this step).
  bool moe_pre_norm(const DeviceLayer& l, int layer, int rows) const;
  // The MoE op's fields for that boundary (moe_pre_norm).
  void set_pre_norm(moe::MoeParams& p, const DeviceLayer& l) const;
  // The MoE op's per-call fields every mode shares (layer weights, x, T, workspace, stream).
  moe::MoeParams moe_call(const DeviceLayer& l, int layer, int rows) const;
  // Routes x's first `rows` rows in a separate kernel into topk_ids / topk_w.
  void route_rows(const DeviceLayer& l, int layer, int rows);
  // TEP: this rank's experts, deferred finalize, then the layer boundary (finalize + all-reduce + residual +
  // next_norm into x; TpFinalizeNorm, fused where gated in).
  void moe_layer_tep(const DeviceLayer& l, int layer, int rows, const bf16_t* next_norm);
  // DEP: route this rank's `tokens` rows, send them to the ranks of their experts, run this rank's experts on
  // what it received, send the partial outputs back and add them (+ shared expert + residual) into h. Every rank
  // calls it for every MoE layer, also with tokens = 0 (cuda_forward_dep.cpp).
  void moe_layer_dep(const DeviceLayer& l, int layer, int tokens);
  void step_idle();
  void allocate_dep(size_t& off, const std::function<void(void**, size_t)>& take);
  void dense_ffn(const DeviceLayer& l, const StepMetadata& m);
  // TEP: the partial sums of a row-split projection (attention o_proj, dense down) summed over the ranks.
  void all_reduce_rows(const char* name, bf16_t* data, int rows);
  // x_final: x already holds every row after the final norm (TEP, last layer MoE: the boundary applied it).
  void head(const StepMetadata& m, const DevMeta& d, bool pending_dense, bool x_final = false);
  // out[rows, N] = x[rows, K] @ w^T, quantising x first (rows padded to 8) when w is FP8 outside the decode GEMV;
  // with norm_w, x is un-normalised and the decode GEMV applies RMSNorm(x) * norm_w first.
  // With post_norm_w (decode GEMV only), the layer boundary follows in the same kernel: h += out; x =
  // RMSNorm(h) * post_norm_w.
  void linear(const char* name, const bf16_t* x, int rows, int K, const DeviceLinear& w, bf16_t* out,
              const bf16_t* norm_w = nullptr, const bf16_t* post_norm_w = nullptr);
  // FP8 activations for a GEMM: x [rows, K] -> xq / xs (1x128 scales) over round_up8(rows) rows (cuBLASLt needs
  // M % 8 == 0; the extra rows are stale but finite and their outputs are ignored). Returns that row count.
  int quantize_fp8_rows(const char* name, const bf16_t* x, int rows, int K);
  int mla_decode_splits(const StepMetadata& m) const;
  // FP8 GEMMs of this many token rows take bf16 x (gemm.h's W8A16 path) instead of quantised activations.
  bool w8a16(int rows) const { return *o.fp8_decode_gemv && rows <= gemm::kDecodeMaxRows; }

  std::shared_ptr<const DeviceModel> model;
  const ModelConfig& cfg;
  CudaForwardOptions o;
  parallel::Group* group = nullptr;  // o.group.get()
  bool tep = false, dep = false;

  // The unfused layer boundary's all-reduce: the group's sum.
  struct GroupSum final : parallel::AllReduce {
    parallel::Group* g = nullptr;
    void sum(void* data, size_t count, DType dtype, cudaStream_t stream) override {
      g->all_reduce_sum(data, count, dtype, stream);
    }
    std::string name() const override { return g->name(); }
  } group_sum;
  std::unique_ptr<parallel::TpFinalizeNorm> tp_final;  // TEP MoE layer boundary
  int fused_boundaries = 0;  // TEP boundaries launched fused (host launches: a graph counts at capture)

  // dims
  int D = 0, V = 0, Hk = 0, P = 0, Wc = 0, Hm = 0, a_cols = 0, num_kda = 0, num_mla = 0;
  int R = 0;             // token-row capacity of every activation buffer (multiple of 8)
  int max_width = 0;     // page-table capacity per sequence (pages)
  int64_t mla_ctx_cap = 0;
  int max_chunks = 0;
  int arch = 0, num_sms = 0, device = 0;
  int max_k = 0;         // widest K of any FP8 linear (the FP8 activation scratch)
  std::vector<std::string> layer_names;   // NVTX range names
  std::vector<int> kda_index, mla_index;  // per layer: index among the KDA / MLA layers (-1 otherwise)
  std::vector<int> bucket_list;
  kda::KdaDecodeSetup kda_setup;
  bool separated = false;
  std::vector<moe::MoeParams> moe_setup;  // per layer (set-up fields only; MoE layers)

  CudaStream stream;
  gemm::GemmRunner gemm;

  // device memory
  DeviceBuffer state_pool;   // f32 [max_seqs, num_kda, Hk, K, V]: a slot's layers are contiguous (one memset)
  DeviceBuffer conv_pool;    // bf16 [max_seqs, num_kda, W-1, 3P]
  DeviceBuffer arena;        // activations + workspaces
  DeviceBuffer meta_dev;     // the step blob
  DeviceBuffer cache;        // bf16 [num_mla, num_pages, page_size, 576]
  PinnedBuffer meta_host, tokens_host;
  size_t arena_activation_bytes = 0, arena_workspace_bytes = 0;

  // activation buffers (pointers into the arena), R rows each unless noted
  bf16_t *h = nullptr, *x = nullptr, *attn_out = nullptr, *ffn_out = nullptr;
  bf16_t *proj = nullptr, *fa = nullptr, *ga = nullptr, *f = nullptr, *gz = nullptr, *kda_out = nullptr;
  int proj_stride = 0, rank_f = 0, rank_g = 0;
  bool kda_split = false;     // some KDA projection is split (KdaLayerWeights::split)
  bf16_t* proj_parts = nullptr;  // [R, proj_stride]: a split projection's two dense outputs before packing
  bf16_t *a_out = nullptr, *mla_attn = nullptr;
  bf16_t *gu = nullptr, *act = nullptr;
  int dense_I = 0;
  uint8_t* xq = nullptr;     // FP8 activations [R, max_k]
  float* xs = nullptr;       // their scales [max_k / 128, R]
  // Arrival counters of kernels whose last block finishes the op (zero at allocation, left zero by every call):
  enum Counter : int { kPostNormCounter, kRouteCounter, kNumCounters };
  int32_t* counters = nullptr;
  bf16_t* h_next = nullptr;  // [R, D] DELTASERVE_MOE_PRE_NORM: the residual after attention, before the MoE add
  float* route_logits = nullptr;  // separated routing: [R, E]
  int32_t* topk_ids = nullptr;    // [R, TOPK] separated routing, and the MoE op's ids under TEP / DEP
  float* topk_w = nullptr;        // [R, TOPK]
  bf16_t* moe_expert_out = nullptr;  // TEP deferred finalize: [R, TOPK, D]
  bf16_t* moe_shared_out = nullptr;  // [R, D] (the rank holding the shared expert)
  int32_t* moe_e2p = nullptr;        // [R * TOPK]
  // DEP buffers (Rw = world * R rows: what one rank can receive)
  bf16_t *dep_send = nullptr, *dep_recv = nullptr, *dep_out = nullptr, *dep_back = nullptr;  // [Rw, D]
  bf16_t *dep_comb = nullptr;        // [R * world, D] the partials per (token, rank), rank order
  bf16_t *dep_shared = nullptr;      // [R, D]
  int32_t *dep_recv_ids = nullptr;   // [Rw, TOPK]
  float* dep_recv_w = nullptr;       // [Rw, TOPK]
  int32_t *dep_send_idx = nullptr, *dep_comb_idx = nullptr;  // [Rw]
  float* dep_ones = nullptr;         // [Rw]
  PinnedBuffer dep_host;             // staging of routes and indices
  int step_tokens = 0;               // real tokens of the step being run (DEP routes only those)
  bf16_t *sel = nullptr, *sel_n = nullptr;  // [max_seqs, D] sampled rows, before / after the final norm
  float* logits = nullptr;        // [max_seqs, V]
  int32_t* tokens_out = nullptr;  // [max_seqs]
  int32_t* sample_counters = nullptr;  // [max_seqs] the split sampling pass's arrival counters (zero, left zero)
  void* sample_partials = nullptr;     // its per-block results (sampling::sample_partials_bytes)
  size_t sample_partials_bytes = 0;
  void* kda_ws = nullptr;
  size_t kda_ws_bytes = 0;
  void* mla_dec_ws = nullptr;
  size_t mla_dec_ws_bytes = 0;
  void* mla_pf_ws = nullptr;
  size_t mla_pf_ws_bytes = 0;
  void* moe_ws = nullptr;
  size_t moe_ws_bytes = 0;
  size_t meta_capacity = 0;

  // CUDA graphs per (bucket, page width)
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs;

  // profile: events recorded at op boundaries of eager steps
  std::vector<cudaEvent_t> events;
  std::vector<OpCat> event_cat;
  std::vector<const char*> event_name;  // the op that ended at each event (string literals)
  int num_events = 0;
  bool timing = false;

  StepProfile last;
  int last_samples = 0;
};

// An NVTX range for the scope (Nsight Systems / Compute attribute time to it; ~free without a profiler attached).
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

template <class F> bool CudaForward::Impl::op(OpCat c, const char* name, F&& f) {
  if (!o.ablate.empty() && is_ablated(o.ablate, kOpCatNames[static_cast<int>(c)], name)) return false;  // benchmarks
  {
    NvtxRange r(name);
    f();
  }
  mark(c, name);
  return true;
}

}  // namespace ds

#endif  // DELTASERVE_WITH_CUDA
