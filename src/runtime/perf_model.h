// Bytes a decode step must move, for the "% of the weight-streaming bound" figures of bench-engine.
//
// One decode step at concurrency C reads every non-expert weight once (attention, router, shared expert, dense
// layer-0 FFN, lm_head, norms; one embedding row per sequence), the experts the batch touches, and per sequence
// its KDA state (read + write, fp32) and its MLA latent rows. The bound is those bytes / the measured copy
// bandwidth (targets.md: 4,258 GB/s on the H200); tps/user at the bound = 1 / bound time.
//
// Experts touched: with C tokens routed to TOPK of E experts uniformly, the expected distinct experts per layer
// is E * (1 - (1 - TOPK/E)^C) (the routing of random weights is close to uniform; trained routers are more
// concentrated, which only lowers the bound).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace ds {

struct DecodeBytesOptions {
  int concurrency = 1;
  int64_t context = 0;        // tokens already in each sequence's MLA cache (latent rows read per MLA layer)
  bool fp8 = false;           // experts and dense GEMM weights e4m3 + one fp32 scale per 128x128 block
  bool fp8_kda_proj = false;  // the packed KDA projection in FP8 too
  bool kda_gates_bf16 = false;  // ... but its gate rows (f_a, g_a, b) bf16 (DELTASERVE_FP8_KDA_PROJ=2)
  bool fp8_lm_head = false;   // lm_head's FP8 decode copy (read by steps of <= 4 sampled rows)
};

struct DecodeBytes {
  double weights = 0;         // non-expert weights
  double experts = 0;         // expected expert weights touched
  double state = 0;           // KDA recurrent (read + write) and conv state, MLA latent rows
  double experts_touched = 0; // expected distinct experts per MoE layer
  double total() const { return weights + experts + state; }
};

DecodeBytes decode_step_bytes(const ModelConfig& c, const DecodeBytesOptions& o);

// The weights' precision in words, for reports: which GEMMs read FP8 (the rules of runtime/cuda_model.h). Names
// the DELTASERVE_FP8_KDA_PROJ setting: under --quantize fp8 the packed KDA projection stays bf16 unless it is 1.
std::string weights_precision(const DecodeBytesOptions& o);

// Parameters per token in the spec's accounting (section 8): every non-expert parameter except the embedding
// table, plus TOPK routed experts per MoE layer. 3,106,972,544 for Kimi-Linear-48B-A3B.
int64_t active_params_per_token(const ModelConfig& c);

inline constexpr double kH200CopyBandwidth = 4258e9;  // bytes/s, targets.md (device-to-device copy, read + write)

}  // namespace ds
