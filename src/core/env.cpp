// Knob parsing and the registry of DELTASERVE_* knobs.
#include "core/env.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"

namespace ds {

int64_t parse_int_knob(const IntKnob& knob, const char* value) {
  if (value == nullptr) return knob.default_value;
  const std::string v(value);
  bool ok = !v.empty() && v.size() <= 19;
  size_t i = 0;
  if (ok && (v[0] == '-' || v[0] == '+')) i = 1;
  ok = ok && i < v.size();
  for (size_t j = i; ok && j < v.size(); ++j) ok = v[j] >= '0' && v[j] <= '9';
  if (!ok)
    DS_THROW("environment knob {}='{}' is not an integer; accepted range is [{}, {}] (default {})", knob.name, v,
             knob.min, knob.max, knob.default_value);
  errno = 0;
  const long long parsed = std::strtoll(v.c_str(), nullptr, 10);
  if (errno == ERANGE)
    DS_THROW("environment knob {}='{}' is out of the integer range; accepted range is [{}, {}]", knob.name, v,
             knob.min, knob.max);
  int64_t x = parsed;
  if (x < knob.min || x > knob.max) {
    const int64_t c = x < knob.min ? knob.min : knob.max;
    log_once(LogLevel::kWarn, std::string("clamp:") + knob.name + "=" + v,
             fmt::format("environment knob {}={} is outside [{}, {}]; clamped to {}", knob.name, x, knob.min,
                         knob.max, c));
    x = c;
  }
  return x;
}

std::string parse_choice_knob(const ChoiceKnob& knob, const char* value) {
  if (value == nullptr) return knob.default_value;
  for (const auto& c : knob.choices)
    if (c == value) return c;
  std::string all;
  for (const auto& c : knob.choices) all += (all.empty() ? "" : "|") + c;
  DS_THROW("environment knob {}='{}' is not one of {} (default {})", knob.name, value, all, knob.default_value);
}

int64_t get_knob(const IntKnob& knob) { return parse_int_knob(knob, std::getenv(knob.name)); }
std::string get_knob(const ChoiceKnob& knob) { return parse_choice_knob(knob, std::getenv(knob.name)); }

namespace knobs {

const IntKnob kFp8KdaProj{"DELTASERVE_FP8_KDA_PROJ", 0, 0, 2,
                          "1: FP8 block-scaled weights for the packed KDA input projection; 2: its q/k/v rows in FP8, "
                          "the gate rows (f_a, g_a, b) bf16"};
const IntKnob kForceSeparatedRouting{"DELTASERVE_FORCE_SEPARATED_ROUTING", 0, 0, 1,
                                     "1: route in a separate kernel and pass topk ids/weights into the MoE op"};
const IntKnob kFusedFinalizeArNormMaxTokens{
    "DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS", 2, 0, 16,
    "largest decode batch (tokens) that uses the fused MoE finalize + all-reduce + RMSNorm; 0 disables"};
const IntKnob kHfBiasedRouting{"DELTASERVE_HF_BIASED_ROUTING", 0, 0, 1,
                               "1: MoE routing weights from the bias-corrected scores (HF modeling_kimi.py "
                               "behaviour) instead of the unbiased sigmoid scores"};
const IntKnob kFp8DecodeGemv{"DELTASERVE_FP8_DECODE_GEMV", 1, 0, 1,
                             "1: decode-sized FP8 GEMMs (<= 4 token rows) stream the e4m3 weights against bf16 "
                             "activations (W8A16); 0: quantise the activations for cuBLASLt (W8A8, rows padded to 8)"};
const IntKnob kMoeGemvDecode{"DELTASERVE_MOE_GEMV_DECODE", 1, 0, 1,
                             "1: a MoE step of a few tokens (bf16 or FP8-block experts; DELTASERVE_MOE_GEMV_TOKENS) "
                             "runs as TOPK + 1 matrix-vector products per token with the finalize fused (FP8 weights "
                             "as W8A16); 0: the stream GEMM path"};
const IntKnob kMoeGemvTokens{"DELTASERVE_MOE_GEMV_TOKENS", 0, 0, 32,
                             "the most tokens a MoE step may have to run the gemv decode (with "
                             "DELTASERVE_MOE_GEMV_DECODE=1; blocks of two tokens); 0: the measured rule (8 with "
                             "FP8-block experts, 4 with bf16)"};
const IntKnob kMoeClusterRoute{"DELTASERVE_MOE_CLUSTER_ROUTE", 0, 0, 1,
                               "1: decode MoE routing (<= 16 tokens, <= 256 experts) as one cluster kernel, router "
                               "GEMM and top-k together (same routes); 0: two kernels"};
const IntKnob kMoeFusedNorm{"DELTASERVE_MOE_FUSED_NORM", 0, 0, 1,
                            "1: a MoE step on the gemv decode also applies the next layer's input RMSNorm (the "
                            "last block of its down kernel, per two tokens; same bits); 0: a separate norm kernel"};
const IntKnob kFusedInputNorm{"DELTASERVE_FUSED_INPUT_NORM", 1, 0, 1,
                              "1: decode steps apply each layer's input RMSNorm inside its first projection (the "
                              "decode GEMV, same bits); 0: a separate norm kernel"};
const IntKnob kFusedPostNorm{"DELTASERVE_FUSED_POST_NORM", 0, 0, 1,
                             "1: decode steps add the attention output into the residual and apply the "
                             "post-attention RMSNorm inside o_proj (the decode GEMV's last block, same bits; slower "
                             "on the H200: 6.7 us against 4.0 + 2.3); 0: a separate norm kernel"};
const IntKnob kMoeFusedRoute{"DELTASERVE_MOE_FUSED_ROUTE", 0, 0, 1,
                             "1: decode MoE routing (<= 16 tokens, <= 256 experts, ungrouped) in one kernel: the "
                             "router GEMM's last block runs the top-k (same routes; slower on the H200: 7.3 us "
                             "against 3.1 + 3.2); 0: two kernels"};
const IntKnob kFp8LmHead{"DELTASERVE_FP8_LM_HEAD", 0, 0, 1,
                          "1 (with --quantize fp8): decode steps of <= 4 sampled rows read an FP8 block-scaled copy "
                          "of lm_head (W8A16, fp32 logits; V x D more bytes of memory), larger steps the bf16 "
                          "weight; 0: bf16 only"};
const IntKnob kMoeGemvUpCols{"DELTASERVE_MOE_GEMV_UP_COLS", 0, 0, 4,
                             "few-token MoE (gemv path): h columns per gate/up block, 2 or 4; 0: the measured "
                             "default (bf16 2, FP8 4)"};
const IntKnob kMoeGemvDownRows{"DELTASERVE_MOE_GEMV_DOWN_ROWS", 0, 0, 8,
                               "few-token MoE (gemv path): rows of the hidden size per down block, 2, 4 or 8; 0: "
                               "the measured default (bf16 2, FP8 4)"};
const IntKnob kMoeDownPersistent{"DELTASERVE_MOE_DOWN_PERSISTENT", 0, 0, 1,
                                 "1: the one-token MoE's down projection as one wave of persistent blocks, each "
                                 "loading its next row pair's weights before summing the current one (same bits); "
                                 "0: one short block per row pair"};
const IntKnob kMoeDownPreload{"DELTASERVE_MOE_DOWN_PRELOAD", 1, 0, 1,
                              "1: the one-token MoE's down blocks load their W_down rows into registers before "
                              "waiting for the gate/up kernel (same bits); 0: they stream them after the wait"};
const IntKnob kMoeFp8PrefillTile{"DELTASERVE_MOE_FP8_PREFILL_TILE", 0, 0, 128,
                                 "FP8 MoE prefill GEMMs: 64 (every thread loads) or 128 rows per tile (warp-"
                                 "specialised, TMA weight tiles; same bits); 0: the measured rule "
                                 "(moe_fp8_prefill_tile_m: 128 from 64 routed rows per expert)"};
const IntKnob kMoeFp8DecodeWgmma{"DELTASERVE_MOE_FP8_DECODE_WGMMA", 1, 0, 1,
                                 "1: FP8-block MoE steps past the gemv decode run the wgmma (TMA ring) kernels at "
                                 "every token count (sm_90; the engine 10-13 % faster at concurrency 16-64 on an "
                                 "H100); 0: the stream kernel up to 16 routes per expert, as bf16"};
const IntKnob kMoeStreamTiles{"DELTASERVE_MOE_STREAM_TILES", 0, 0, 8,
                              "MoE decode of 2+ tokens (streaming expert GEMM): token tiles of 8 held per pass, 1, 2, "
                              "4 or 8 (a larger group takes several passes; same bits); 0: the measured rule "
                              "(moe_stream_token_tiles)"};
const IntKnob kMlaFusedCacheWrite{"DELTASERVE_MLA_FUSED_CACHE_WRITE", 1, 0, 1,
                                  "1: decode-only steps write the MLA latent cache inside the decode's q-absorption "
                                  "kernel (same bits, one launch less per MLA layer); 0: a separate cache-write "
                                  "kernel"};
const IntKnob kMoePreNorm{"DELTASERVE_MOE_PRE_NORM", 1, 0, 1,
                          "1: a one-token MoE layer applies the post-attention residual add + RMSNorm in its router "
                          "kernel (every CTA normalises the row itself, same bits; H200: -40 us a step); 0: a "
                          "separate norm kernel"};
const IntKnob kPdl{"DELTASERVE_PDL", 1, 0, 1,
                   "1: kernels overlap their predecessor's tail (programmatic dependent launch); 0: full "
                   "serialisation, slower (the reference when a read race is suspected)"};
const ChoiceKnob kKdaLayout{"DELTASERVE_KDA_LAYOUT", "auto", {"auto", "compact", "many", "stream"},
                            "KDA decode layout: auto (measured selector), compact, many or stream (A/B runs)"};

const std::vector<const IntKnob*>& int_knobs() {
  static const std::vector<const IntKnob*> v = {&kFp8KdaProj, &kForceSeparatedRouting,
                                                &kFusedFinalizeArNormMaxTokens, &kHfBiasedRouting,
                                                &kFp8DecodeGemv, &kMoeGemvDecode, &kMoeGemvTokens,
                                                &kMoeClusterRoute,
                                                &kMoeFusedNorm, &kFusedInputNorm, &kFusedPostNorm,
                                                &kMoeFusedRoute, &kFp8LmHead, &kMoeGemvUpCols,
                                                &kMoeGemvDownRows, &kMoeDownPersistent, &kMoeDownPreload,
                                                &kMoeFp8PrefillTile, &kMoeFp8DecodeWgmma, &kMoeStreamTiles,
                                                &kMlaFusedCacheWrite,
                                                &kMoePreNorm,
                                                &kPdl};
  return v;
}
const std::vector<const ChoiceKnob*>& choice_knobs() {
  static const std::vector<const ChoiceKnob*> v = {&kKdaLayout};
  return v;
}

void validate_all() {
  for (const auto* k : int_knobs()) (void)get_knob(*k);
  for (const auto* k : choice_knobs()) (void)get_knob(*k);
}

std::string help_text() {
  std::string s = "Environment knobs:\n";
  for (const auto* k : int_knobs())
    s += fmt::format("  {}  integer in [{}, {}], default {}: {}\n", k->name, k->min, k->max, k->default_value,
                     k->help);
  for (const auto* k : choice_knobs()) {
    std::string all;
    for (const auto& c : k->choices) all += (all.empty() ? "" : "|") + c;
    s += fmt::format("  {}  {}, default {}: {}\n", k->name, all, k->default_value, k->help);
  }
  s += "  DELTASERVE_LOG_LEVEL  debug|info|warn|error|off, default info\n";
  return s;
}

}  // namespace knobs
}  // namespace ds
