// The decode-step byte model against the spec's size facts (kimi_linear.md section 8).
#include <gtest/gtest.h>

#include "model/config.h"
#include "runtime/perf_model.h"

namespace ds {
namespace {

TEST(PerfModel, ActiveParamsMatchTheSpec) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  EXPECT_EQ(active_params_per_token(c), 3'106'972'544);  // section 8: excl. the table, incl. lm_head
}

TEST(PerfModel, Bf16DecodeAtConcurrencyOneIsTheSpecsWeightTraffic) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  const DecodeBytes b = decode_step_bytes(c, {});
  EXPECT_DOUBLE_EQ(b.experts_touched, 8.0);
  // Section 8: 6,213,945,088 B with every parameter at 2 bytes; the fp32 A_log / dt_bias / router bias add 2 more
  // bytes per element, the embedding row 4,608 B.
  const double fp32_extra = 2.0 * (20 * (32 + 4096) + 26 * 256);
  EXPECT_NEAR(b.weights + b.experts, 6'213'945'088.0 + fp32_extra + 4608.0, 1.0);
  // KDA state: 20 layers x (2 MiB recurrent + 72 KiB conv), read and written; one MLA row per MLA layer.
  EXPECT_DOUBLE_EQ(b.state, 20 * 2.0 * (2'097'152 + 73'728) + 7 * 1152.0);
  // The bound of targets.md: 6.21 GB / 4,258 GB/s = 1.46 ms.
  EXPECT_NEAR((b.weights + b.experts) / kH200CopyBandwidth * 1e3, 1.46, 0.01);
}

TEST(PerfModel, WeightsPrecisionNamesTheKdaProjectionKnob) {
  DecodeBytesOptions o;
  EXPECT_EQ(weights_precision(o), "bf16");
  o.fp8_kda_proj = true;  // refines fp8 only
  EXPECT_EQ(weights_precision(o), "bf16");
  o.fp8 = true;
  EXPECT_NE(weights_precision(o).find("KDA projection FP8 (DELTASERVE_FP8_KDA_PROJ=1)"), std::string::npos);
  o.fp8_kda_proj = false;
  EXPECT_NE(weights_precision(o).find("KDA projection bf16 (DELTASERVE_FP8_KDA_PROJ=0)"), std::string::npos);
  EXPECT_NE(weights_precision(o).find("lm_head bf16"), std::string::npos);
  o.fp8_kda_proj = true;
  o.kda_gates_bf16 = true;
  EXPECT_NE(weights_precision(o).find("q/k/v FP8, gates f_a/g_a/b bf16 (DELTASERVE_FP8_KDA_PROJ=2)"), std::string::npos);
  o.fp8_kda_proj = false;
  o.kda_gates_bf16 = false;
  o.fp8_lm_head = true;
  EXPECT_NE(weights_precision(o).find("lm_head FP8 at <= 4 sampled rows (DELTASERVE_FP8_LM_HEAD=1)"),
            std::string::npos);
}

// The FP8 lm_head copy counts in the bound only where decode steps read it (<= 4 sampled rows): half of lm_head's
// bytes, plus its scales.
TEST(PerfModel, Fp8LmHeadHalvesItsBytesAtSmallBatches) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  DecodeBytesOptions o;
  o.fp8 = true;
  const double base = decode_step_bytes(c, o).weights;
  o.fp8_lm_head = true;
  const int64_t V = c.vocab_size, D = c.hidden_size;
  EXPECT_NEAR(base - decode_step_bytes(c, o).weights, static_cast<double>(V * D - (V / 128) * ((D / 128 + 3) / 4 * 4) * 4),
              1.0);
  o.concurrency = 5;
  const double with_copy = decode_step_bytes(c, o).weights;
  o.fp8_lm_head = false;
  EXPECT_DOUBLE_EQ(with_copy, decode_step_bytes(c, o).weights);
}

TEST(PerfModel, Fp8HalvesTheExpertBytesAndTouchedExpertsSaturate) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  const DecodeBytes bf16 = decode_step_bytes(c, {});
  DecodeBytesOptions o;
  o.fp8 = true;
  const DecodeBytes fp8 = decode_step_bytes(c, o);
  EXPECT_NEAR(fp8.experts / bf16.experts, 0.5, 0.002);  // + one fp32 scale per 128x128 block
  EXPECT_LT(fp8.weights, bf16.weights);
  o.fp8_kda_proj = true;
  const double all_fp8 = decode_step_bytes(c, o).weights;
  EXPECT_LT(all_fp8, fp8.weights);
  // 20 layers x (2 x 128 + 32) gate rows x 2304: one byte more each, less the three gate tensors' FP8 scales (one
  // 128-row block of w_scale_cols(2304) = 20 floats each).
  o.kda_gates_bf16 = true;
  EXPECT_NEAR(decode_step_bytes(c, o).weights - all_fp8, 20.0 * 288 * 2304 - 20.0 * 3 * 20 * 4, 1.0);
  o.kda_gates_bf16 = false;
  o.concurrency = 256;
  const DecodeBytes many = decode_step_bytes(c, o);
  EXPECT_GT(many.experts_touched, 255.0);  // 256 tokens x top-8 touch nearly all 256 experts
  EXPECT_LE(many.experts_touched, 256.0);
  o.context = 1000;
  EXPECT_NEAR(decode_step_bytes(c, o).state - many.state, 256.0 * 7 * 1000 * 1152, 1.0);
}

}  // namespace
}  // namespace ds
