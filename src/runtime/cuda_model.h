// DeviceModel: the whole model's weights in GPU memory, laid out for the CUDA forward (runtime/cuda_forward.h).
//
// Load-time packing (done once here, so the forward runs one GEMM where HF runs several):
//   KDA  proj   = [q_proj ; k_proj ; v_proj ; f_a_proj ; g_a_proj ; b_proj ; zero rows]   [proj_rows, D]
//               one GEMM gives every per-token projection; the KDA kernels read q/k/v/beta as strided column
//               slices of its output, f_a and g_a feed the low-rank f_b / g_b GEMMs.
//        conv_w = [q_conv1d ; k_conv1d ; v_conv1d]  [3P, W] (the layout kda.h expects)
//   MLA  fused_a = [q_proj ; kv_a_proj_with_mqa]   [H*192 + 576, D] (mla::pack_fused_a_weight)
//   FFN  dense gate_up = [gate_proj ; up_proj]     [2I, D]
//        MoE experts w13[e] = [w1 ; w3]            [E, 2I, D], w2 [E, D, I]; the shared expert likewise (n = 1)
//
// Precision: bf16 weights stay bf16 unless options.fp8 (`--quantize fp8`): then every dense GEMM weight except
// lm_head and the KDA low-rank f_b / g_b becomes FP8 block-scaled (e4m3 + fp32 per 128x128 block) and the experts
// use moe::WeightFormat::kFP8Block; the packed KDA projection only with options.fp8_kda_proj
// (DELTASERVE_FP8_KDA_PROJ; with options.kda_gates_bf16 only its q/k/v rows, the gate rows in a bf16 proj_gates). FP8 checkpoints (weight e4m3 + weight_scale_inv) load as they are: a packed weight
// with any e4m3 piece is FP8 (its bf16 pieces are quantised on the GPU), per-piece scales are stacked like the
// rows. A packed weight whose pieces do not start on 128-row block edges (e.g. MLA q_proj with an odd head count)
// stays bf16, e4m3 pieces dequantised. MLA kv_b_proj, norms, conv weights, router and embedding stay bf16
// (A_log, dt_bias, e_score_correction_bias, o_norm fp32); f16/f32 checkpoint tensors are converted.
//
// Memory: one arena (256-byte aligned tensors) plus load-time scratch (the bf16 of the largest tensor piece
// that is quantised on the GPU); the free-memory check counts both.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/tensor.h"
#include "kernels/moe/moe.h"
#include "kernels/util/util.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/perf_model.h"

namespace ds {

struct DeviceModelOptions {
  bool fp8 = false;           // --quantize fp8: quantise bf16 GEMM weights and experts at load time
  bool fp8_kda_proj = false;  // DELTASERVE_FP8_KDA_PROJ: the packed KDA projection in FP8 too (only with fp8)
  bool kda_gates_bf16 = false;  // DELTASERVE_FP8_KDA_PROJ=2: with fp8_kda_proj, its gate rows stay bf16 (proj_gates)
  bool fp8_lm_head = false;   // DELTASERVE_FP8_LM_HEAD: an FP8 copy of lm_head for decode steps (only with fp8)
  // This rank's position (docs/parallel.md). TEP: tp_size > 1 and ep_size == tp_size (the same ranks): KDA and
  // MLA heads and the dense FFN split over the tp ranks, experts over the ep ranks. DEP: tp_size == 1,
  // ep_size > 1: attention whole on every rank, experts split. 1 / 1: the whole model (one GPU).
  int tp_rank = 0, tp_size = 1;
  int ep_rank = 0, ep_size = 1;
};

// The precision options of `--quantize` (fp8 or not) and DELTASERVE_FP8_KDA_PROJ: what serve, generate and
// bench-engine load with.
inline DeviceModelOptions quantize_options(bool fp8) {
  DeviceModelOptions o;
  o.fp8 = fp8;
  const int64_t kda = get_knob(knobs::kFp8KdaProj);
  o.fp8_kda_proj = fp8 && kda != 0;
  o.kda_gates_bf16 = fp8 && kda == 2;
  o.fp8_lm_head = fp8 && get_knob(knobs::kFp8LmHead) != 0;
  return o;
}

// The perf model's precision fields (the bound's bytes, the weights line of serve and bench-engine) from the
// options the weights were built with.
inline void set_weights_precision(DecodeBytesOptions& b, const DeviceModelOptions& m) {
  b.fp8 = m.fp8;
  b.fp8_kda_proj = m.fp8_kda_proj;
  b.kda_gates_bf16 = m.kda_gates_bf16;
  b.fp8_lm_head = m.fp8_lm_head;
}

// What one rank holds (from DeviceModelOptions and the config; the forward sizes itself from this).
struct DeviceShard {
  int tp_rank = 0, tp_size = 1, ep_rank = 0, ep_size = 1;
  int kda_heads = 0;         // KDA heads of this rank: heads [tp_rank * kda_heads, +kda_heads)
  int mla_heads = 0;         // MLA heads of this rank, likewise
  int dense_I = 0;           // dense FFN intermediate rows of this rank: [tp_rank * dense_I, +dense_I)
  int expert_begin = 0;      // routed experts [expert_begin, expert_end) of the E
  int expert_end = 0;
  // The shared expert: TEP keeps it whole on rank 0 only (the MoE op runs it with the routed experts' I, so it
  // cannot be split by intermediate rows while the routed experts stay whole); rank 0 passes its output to the
  // MoE layer boundary's sum and the others pass none (allreduce.h's contract). DEP keeps it whole on every rank
  // as a dense gate_up / down pair (MoeLayerWeights::shared_dense), run on the rank's own tokens.
  bool shared_in_moe = true;
  bool shared_dense = false;
  bool tensor_parallel() const { return tp_size > 1; }
  bool data_parallel() const { return tp_size == 1 && ep_size > 1; }
};

// One nn.Linear weight [N, K] on the device: bf16, or e4m3 with fp32 scales [ceil(N/128), K/128] (gemm.h layout).
struct DeviceLinear {
  TensorView w;      // [N, K] bf16 or e4m3, dense, CUDA
  TensorView scale;  // FP8 only: f32 [ceil(N/128), K/128]; empty (data == nullptr) for bf16
  bool fp8() const { return w.dtype == DType::kF8E4M3; }
  int64_t N() const { return w.shape[0]; }
  int64_t K() const { return w.shape[1]; }
};

struct KdaLayerWeights {
  DeviceLinear proj;   // packed [q; k; v; f_a; g_a; b; zero pad] -> columns below; rows padded to a multiple of 16
  // DeviceModelOptions::kda_gates_bf16: proj holds [q; k; v] (FP8) and proj_gates [f_a; g_a; b; zero pad] (bf16);
  // the forward writes both into the one packed output row. Empty otherwise.
  DeviceLinear proj_gates;
  int col_q = 0, col_k = 0, col_v = 0, col_fa = 0, col_ga = 0, col_b = 0;
  int proj_cols = 0;   // = proj.N() + proj_gates.N(): the row stride (elements) of the projection output
  bool split() const { return proj_gates.w.data != nullptr; }
  DeviceLinear f_b;    // [P, 128] bf16
  DeviceLinear g_b;    // [P, 128] bf16
  DeviceLinear o_proj; // [D, P]
  const bf16_t* conv_w = nullptr;   // [3P, W]
  const float* A_log = nullptr;     // [H]
  const float* dt_bias = nullptr;   // [P]
  const float* o_norm = nullptr;    // [V] fp32 (kda.h's o_norm_w)
};

struct MlaLayerWeights {
  DeviceLinear fused_a;              // [H*192 + 576, D]
  const bf16_t* kv_a_norm = nullptr; // [512]
  const bf16_t* kv_b = nullptr;      // [H*256, 512] bf16
  DeviceLinear o_proj;               // [D, H*128]
};

struct DenseFfnWeights {
  DeviceLinear gate_up;  // [2I, D]: rows [0, I) gate_proj, [I, 2I) up_proj
  DeviceLinear down;     // [D, I]
};

struct MoeLayerWeights {
  const bf16_t* gate_w = nullptr;    // [E, D] router
  const float* gate_bias = nullptr;  // [E] e_score_correction_bias (fp32), or nullptr
  moe::WeightFormat format = moe::WeightFormat::kBF16;
  moe::ExpertWeights experts;        // E experts (all local on one GPU)
  bool has_shared = false;           // the MoE op runs the shared expert (DeviceShard::shared_in_moe)
  moe::ExpertWeights shared;         // n = 1
  DenseFfnWeights shared_dense;      // DEP: the shared expert as dense GEMMs (DeviceShard::shared_dense)
};

struct DeviceLayer {
  bool kda = true;   // else MLA
  bool moe = false;  // else dense FFN
  const bf16_t* input_norm = nullptr;  // [D]
  const bf16_t* post_norm = nullptr;   // [D]
  KdaLayerWeights k;
  MlaLayerWeights m;
  DenseFfnWeights dense;
  MoeLayerWeights e;
};

struct DeviceModel {
  ModelConfig config;
  DeviceModelOptions options;
  const bf16_t* embed = nullptr;       // [V, D]
  const bf16_t* final_norm = nullptr;  // [D]
  DeviceLinear lm_head;                // [V, D] bf16 (fp32 logits from bf16 weights)
  // options.fp8_lm_head: the same weight FP8 block-scaled, read by decode steps of <= 4 sampled rows (W8A16 GEMV,
  // fp32 logits; half the bytes of the largest single GEMV of a step). Empty otherwise.
  DeviceLinear lm_head_fp8;
  std::vector<DeviceLayer> layers;
  DeviceShard shard;                   // the slice this rank holds (the whole model on one GPU)
  size_t bytes = 0;                    // device memory held by the weights

  DeviceModel();
  ~DeviceModel();  // frees every allocation
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  struct Storage;  // owning device allocations (cuda_model.cpp)
  std::unique_ptr<Storage> storage;
};

// Why this rank position cannot split this config (options.tp_* / ep_*), or nullopt: ranks in range, TEP needs
// ep_size == tp_size and KDA heads, MLA heads and the dense FFN rows divisible by tp_size; experts divisible by
// ep_size. No CUDA call.
std::optional<std::string> device_shard_unsupported(const ModelConfig& c, const DeviceModelOptions& o);

// Device bytes upload_model / random_device_model will allocate for this config (to check free memory first);
// per rank when the options name a slice;
// equals DeviceModel::bytes for random_device_model and for upload_model of a bf16 checkpoint (an FP8 checkpoint
// takes the FP8 bytes of the tensors it stores in e4m3). Scratch used only while loading is not included.
size_t device_model_bytes(const ModelConfig& c, const DeviceModelOptions& o);

// Why the CUDA kernels cannot run this (valid) config, or nullopt: num_shared_experts <= 1, conv width 4,
// hidden size <= 8192 (RMSNorm), router limits (moe_route_unsupported), MLA heads <= 128. No CUDA call.
std::optional<std::string> device_model_unsupported(const ModelConfig& c, const DeviceModelOptions& o);

// Validates the weights against the config (validate_weights), checks the config is one the kernels run
// (head dims, D % 128, I % 128, num_shared_experts <= 1...) and that the device has room (clear error with the
// numbers otherwise), then copies, packs and (options.fp8) quantises on the current device.
std::unique_ptr<DeviceModel> upload_model(const ModelConfig& c, const WeightSet& w, const DeviceModelOptions& o);

// Random weights generated directly in GPU memory (no host copy; the full 48B preset loads in seconds), with
// the init rules of random_weights() (same distributions per tensor name; the values differ: a counter-based
// generator on the GPU, deterministic in seed). A rank's slice holds exactly the values of the whole model's
// tensors (a sliced tensor is generated whole into load-time scratch and its block copied), so TP = N and
// TP = 1 runs of one seed compute the same model. upload_model slices checkpoint tensors on the host.
std::unique_ptr<DeviceModel> random_device_model(const ModelConfig& c, uint64_t seed, const DeviceModelOptions& o);

// The fill random_device_model uses for one checkpoint tensor (distribution, parameters and the per-tensor seed
// derived from seed and the name; out/dtype/n left for the caller): lets tests regenerate any tensor on the CPU
// with util::fill_random_ref and find it in the packed device layout.
util::FillParams random_fill_params(const ModelConfig& c, const TensorSpec& spec, uint64_t seed);

}  // namespace ds
