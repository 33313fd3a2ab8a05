// DeviceModel: memory arithmetic and config refusals (CPU, run in CI), and on the GPU the documented packed
// layout of upload_model (bf16, FP8 quantised at load, FP8 checkpoints), random_device_model's values and
// statistics, the free-memory refusal and that nothing leaks when loading fails halfway.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/gemm/gemm.h"
#include "kernels/util/util_ref.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/cuda_model.h"
#include "runtime/cuda_model_plan.h"
#include "tests/test_util.h"

#if defined(DELTASERVE_WITH_CUDA)
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#endif

namespace ds {
namespace {

// ------------------------------------------------------------------------------------------ CPU: arithmetic

// Spec section 8's parameter counts of Kimi-Linear-48B-A3B.
constexpr int64_t kTotalParams = 49'122'681'728;
// fp32 on the device where the checkpoint (and the parameter count's bf16 bytes) has 2 bytes: dt_bias, A_log,
// e_score_correction_bias, o_norm.
constexpr int64_t kF32Params = 20 * 4096 + 20 * 32 + 26 * 256 + 20 * 128;
// Tensors that become FP8 with options.fp8 (not the KDA projection): routed + shared experts, dense layer-0
// FFN, KDA o_proj, MLA fused_a (q_proj + kv_a) and o_proj.
constexpr int64_t kExpertParams = 7'077'888;
constexpr int64_t kFp8Params = 26 * 256 * kExpertParams + 26 * kExpertParams + 63'700'992 + 20 * 2304 * 4096 +
                               7 * (6144 + 576) * 2304 + 7 * 2304 * 4096;
constexpr int64_t kKdaProjParams = 20 * int64_t{12576} * 2304;  // [q; k; v; f_a; g_a; b] = 12576 rows, no pad
constexpr double kGB = 1e9;

TEST(CudaModelBytes, Preset48BMatchesSpecParamCounts) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  const int64_t bf16 = static_cast<int64_t>(device_model_bytes(c, {}));
  const int64_t want_bf16 = 2 * kTotalParams + 2 * kF32Params;
  // Alignment: at most 255 bytes after each of the ~400 device tensors.
  std::printf("48B bf16: %lld bytes (%.2f GB), spec params x 2 + fp32 extras = %lld\n", static_cast<long long>(bf16),
              bf16 / kGB, static_cast<long long>(want_bf16));
  EXPECT_GE(bf16, want_bf16);
  EXPECT_LT(bf16, want_bf16 + 256 * 1000);

  // FP8: one byte instead of two per quantised weight, plus one fp32 scale per 128x128 block (~1/4096 byte each).
  DeviceModelOptions o;
  o.fp8 = true;
  const int64_t fp8 = static_cast<int64_t>(device_model_bytes(c, o));
  const int64_t want_fp8 = want_bf16 - kFp8Params + kFp8Params / 4096;
  std::printf("48B fp8: %lld bytes (%.2f GB), estimate %lld\n", static_cast<long long>(fp8), fp8 / kGB,
              static_cast<long long>(want_fp8));
  EXPECT_NEAR(static_cast<double>(fp8), static_cast<double>(want_fp8), 2e6);  // partial blocks, alignment
  EXPECT_GT(fp8 / kGB, 49.0);
  EXPECT_LT(fp8 / kGB, 52.0);

  o.fp8_kda_proj = true;
  const int64_t fp8_proj = static_cast<int64_t>(device_model_bytes(c, o));
  EXPECT_NEAR(static_cast<double>(fp8 - fp8_proj), static_cast<double>(kKdaProjParams - kKdaProjParams / 4096), 1e6);
  DeviceModelOptions gates = o;  // DELTASERVE_FP8_KDA_PROJ=2: the gate rows (2 x 128 + 32 of 12,576 + pad) stay bf16
  gates.kda_gates_bf16 = true;
  const int64_t fp8_gates = static_cast<int64_t>(device_model_bytes(c, gates));
  EXPECT_GT(fp8_gates, fp8_proj);
  EXPECT_LT(fp8_gates, fp8_proj + 20 * 2 * 304 * 2304 + 20 * 512 * 4);  // 20 KDA layers, <= 304 gate rows each
  DeviceModelOptions proj_only;  // fp8_kda_proj alone changes nothing: it refines fp8
  proj_only.fp8_kda_proj = true;
  proj_only.fp8_lm_head = true;  // neither does fp8_lm_head
  EXPECT_EQ(device_model_bytes(c, proj_only), static_cast<size_t>(bf16));
  // The FP8 lm_head is a second copy: V x D bytes + its scales on top of the bf16 weight.
  o.fp8_lm_head = true;
  const int64_t V = c.vocab_size, D = c.hidden_size;
  EXPECT_NEAR(static_cast<double>(device_model_bytes(c, o)) - static_cast<double>(fp8_proj),
              static_cast<double>(V * D + (V + 127) / 128 * ((D / 128 + 3) / 4 * 4) * 4), 512.0);
}

TEST(CudaModelBytes, TinyPresetPadsTheKdaProjection) {
  const ModelConfig c = preset_config("tiny");
  // Tiny: D 256, KDA H 2 -> proj 3*256 + 2*128 + 2 = 1026 rows, padded to 1040: 14 zero rows of 256 bf16 each.
  const size_t b = device_model_bytes(c, {});
  int64_t params = 0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
  }
  const int64_t f32 = 3 * (256 + 2 + 128) + 3 * 8;  // dt_bias, A_log, o_norm per KDA layer; bias per MoE layer
  const int64_t pad = 3 * 14 * 256 * 2;
  std::printf("tiny bf16: %zu bytes, params %lld\n", b, static_cast<long long>(params));
  EXPECT_GE(static_cast<int64_t>(b), 2 * params + 2 * f32 + pad);
  EXPECT_LT(static_cast<int64_t>(b), 2 * params + 2 * f32 + pad + 256 * 100);
}

// ------------------------------------------------------------------------------------------ CPU: the plan

// The plan's invariants: tensors 256-byte aligned and disjoint inside the arena, every checkpoint tensor placed
// exactly once, pieces disjoint inside their tensor and covering it (except the KDA projection's < 16 pad rows),
// FP8 pieces on 128-row block edges.
void expect_plan_sound(const ModelConfig& c, const DeviceModelOptions& o, const devmodel::IsFp8& is_fp8 = {}) {
  using devmodel::Kind;
  DeviceModel m;
  const devmodel::Plan plan = devmodel::plan_device_model(c, o, is_fp8, &m);
  EXPECT_EQ(m.bytes, plan.bytes);
  std::vector<std::pair<size_t, size_t>> regions;
  std::map<std::string, int> placed;
  for (const devmodel::Dest& d : plan.dests) {
    SCOPED_TRACE(d.what);
    regions.emplace_back(d.offset, d.data_bytes());
    if (d.kind == Kind::kFP8) {
      regions.emplace_back(d.scale_offset, d.scale_bytes());
      EXPECT_EQ(d.cols % 128, 0);
    }
    std::vector<std::pair<int64_t, int64_t>> rows;
    for (const devmodel::Piece& p : d.pieces) {
      ++placed[p.spec.name];
      rows.emplace_back(p.row0, p.row0 + p.rows);
      if (d.kind == Kind::kFP8) {
        EXPECT_EQ(p.row0 % 128, 0) << p.spec.name;
        EXPECT_LE(static_cast<size_t>(p.rows * d.cols) * 2, plan.quant_scratch_bytes) << p.spec.name;
      }
    }
    std::sort(rows.begin(), rows.end());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_GE(rows[i].first, i ? rows[i - 1].second : 0);
      EXPECT_LE(rows[i].second, d.rows);
    }
    const bool proj = d.what.find("KDA proj") != std::string::npos;
    if (proj) {
      EXPECT_LT(d.rows - d.covered_rows(), 16);
    } else {
      EXPECT_EQ(d.covered_rows(), d.rows);
    }
  }
  std::sort(regions.begin(), regions.end());
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].first % 256, 0u);
    if (i) {
      EXPECT_GE(regions[i].first, regions[i - 1].first + regions[i - 1].second);
    }
  }
  ASSERT_FALSE(regions.empty());
  EXPECT_LE(regions.back().first + regions.back().second, plan.bytes);
  const auto specs = checkpoint_tensor_specs(c);
  EXPECT_EQ(placed.size(), specs.size());
  for (const TensorSpec& s : specs) EXPECT_EQ(placed[s.name], 1) << s.name;

  // bind_plan points the fields into the arena.
  alignas(256) static char fake_base[256];
  devmodel::bind_plan(plan, fake_base, 0);
  EXPECT_EQ(static_cast<const void*>(m.embed), static_cast<const void*>(fake_base + plan.dests[0].offset));
  for (const DeviceLayer& L : m.layers) {
    EXPECT_NE(L.input_norm, nullptr);
    if (L.kda) {
      EXPECT_EQ(L.k.proj.N(), L.k.proj_cols);
      EXPECT_EQ(L.k.proj.w.device, Device::kCUDA);
      EXPECT_NE(L.k.o_norm, nullptr);
    }
    if (L.moe) {
      EXPECT_NE(L.e.experts.w2, nullptr);
    }
  }
}

TEST(CudaModelPlan, SoundForPresetsAndFormats) {
  const ModelConfig tiny = preset_config("tiny");
  ModelConfig big = preset_config("kimi-linear-48b-a3b", 4);
  big.num_experts = 16;
  for (const ModelConfig* c : {&tiny, static_cast<const ModelConfig*>(&big)})
    for (DeviceModelOptions o : {DeviceModelOptions{false, false}, DeviceModelOptions{true, false},
                                 DeviceModelOptions{true, true}})
      expect_plan_sound(*c, o);
  // An FP8 checkpoint where every layer GEMM weight is e4m3.
  expect_plan_sound(tiny, {}, [](const std::string& n) {
    return n.rfind("model.layers.", 0) == 0 && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 &&
           n.find("norm") == std::string::npos && n.find("conv1d") == std::string::npos &&
           n.find("gate.weight") == std::string::npos;
  });
}

TEST(CudaModelPlan, Fp8OnlyWherePiecesSitOnBlockEdges) {
  ModelConfig c = preset_config("tiny");
  c.num_attention_heads = 3;  // MLA q_proj 576 rows: kv_a would start mid-block
  c.num_key_value_heads = 3;
  DeviceModelOptions o;
  o.fp8 = true;
  DeviceModel m;
  const devmodel::Plan plan = devmodel::plan_device_model(c, o, {}, &m);
  for (const devmodel::Dest& d : plan.dests) {
    auto is = [&](const char* what) { return d.what.find(what) != std::string::npos; };
    if (is("fused_a")) {
      EXPECT_EQ(d.kind, devmodel::Kind::kBF16) << d.what;
    } else if (is("MLA o_proj")) {
      EXPECT_EQ(d.kind, devmodel::Kind::kFP8) << d.what;
    } else if (is("f_b_proj")) {
      EXPECT_EQ(d.kind, devmodel::Kind::kBF16) << d.what;
    }
  }
  // One e4m3 expert piece makes the whole layer's experts (and its shared expert) FP8, without options.
  const devmodel::Plan mixed = devmodel::plan_device_model(
      preset_config("tiny"), {}, [](const std::string& n) { return n == "model.layers.2.block_sparse_moe.experts.5.w3.weight"; },
      &m);
  int fp8 = 0;
  for (const devmodel::Dest& d : mixed.dests)
    if (d.kind == devmodel::Kind::kFP8) {
      EXPECT_NE(d.what.find("layer 2 MoE"), std::string::npos) << d.what;
      ++fp8;
    }
  EXPECT_EQ(fp8, 4);  // experts w13, w2, shared w13, w2
  EXPECT_EQ(m.layers[2].e.format, moe::WeightFormat::kFP8Block);
  EXPECT_EQ(m.layers[1].e.format, moe::WeightFormat::kBF16);
}

// ------------------------------------------------------------------------------------------ CPU: refusals

void expect_refused(const ModelConfig& c, const std::string& needle) {
  const auto why = device_model_unsupported(c, {});
  ASSERT_TRUE(why.has_value()) << "expected a refusal mentioning '" << needle << "'";
  EXPECT_NE(why->find(needle), std::string::npos) << *why;
  try {
    random_device_model(c, 1, {});
    ADD_FAILURE() << "random_device_model accepted a config the kernels cannot run";
  } catch (const Error& e) {
    std::printf("refused: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("random_device_model"), std::string::npos) << e.what();
  }
}

TEST(CudaModelConfig, RefusesWhatTheKernelsCannotRun) {
  const ModelConfig tiny = preset_config("tiny");
  EXPECT_FALSE(device_model_unsupported(tiny, {}).has_value());
  EXPECT_FALSE(device_model_unsupported(preset_config("kimi-linear-48b-a3b"), {}).has_value());
  ModelConfig c = tiny;
  c.num_shared_experts = 2;
  expect_refused(c, "num_shared_experts");
  c = tiny;
  c.linear_attn.short_conv_kernel_size = 3;
  expect_refused(c, "short_conv_kernel_size");
  c = tiny;
  c.num_attention_heads = 129;
  c.num_key_value_heads = 129;
  expect_refused(c, "heads");
  c = tiny;
  c.hidden_size = 16384;
  expect_refused(c, "rmsnorm");
  // A config that is not valid at all is refused by validate_config, naming the field, before anything else.
  c = tiny;
  c.hidden_size = 200;
  try {
    random_device_model(c, 1, {});
    ADD_FAILURE() << "hidden_size 200 accepted";
  } catch (const Error& e) {
    std::printf("refused: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
  // upload_model checks the config before the weights (the weights of a bad config are never read).
  c = tiny;
  c.num_shared_experts = 2;
  try {
    upload_model(c, random_weights(tiny, 1), {});
    ADD_FAILURE() << "upload_model accepted num_shared_experts = 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_shared_experts"), std::string::npos) << e.what();
  }
}

TEST(CudaModelConfig, RandomFillParamsFollowRandomTensorRules) {
  const ModelConfig c = preset_config("tiny");
  const double out_scale = 0.5 / std::sqrt(2.0 * c.num_hidden_layers);
  auto spec = [&](const std::string& n) {
    for (const TensorSpec& s : checkpoint_tensor_specs(c))
      if (s.name == n) return s;
    ADD_FAILURE() << n;
    return TensorSpec{};
  };
  const auto norm = random_fill_params(c, spec("model.layers.0.self_attn.o_norm.weight"), 1);
  EXPECT_EQ(norm.dist, util::FillDist::kConst);
  EXPECT_EQ(norm.a, 1.0f);
  const auto q = random_fill_params(c, spec("model.layers.0.self_attn.q_proj.weight"), 1);
  EXPECT_EQ(q.dist, util::FillDist::kNormal);
  EXPECT_FLOAT_EQ(q.b, 1.0f / 16.0f);  // 1/sqrt(D = 256)
  const auto w2 = random_fill_params(c, spec("model.layers.1.block_sparse_moe.experts.3.w2.weight"), 1);
  EXPECT_FLOAT_EQ(w2.b, static_cast<float>(out_scale / std::sqrt(128.0)));
  const auto conv = random_fill_params(c, spec("model.layers.0.self_attn.k_conv1d.weight"), 1);
  EXPECT_FLOAT_EQ(conv.b, 0.5f);
  const auto alog = random_fill_params(c, spec("model.layers.0.self_attn.A_log"), 1);
  EXPECT_EQ(alog.map, util::FillMap::kLog1p15);
  const auto dt = random_fill_params(c, spec("model.layers.0.self_attn.dt_bias"), 1);
  EXPECT_EQ(dt.map, util::FillMap::kInvSoftplus);
  EXPECT_FLOAT_EQ(dt.a, 0.001f);
  EXPECT_FLOAT_EQ(dt.b, 0.1f);
  const auto bias = random_fill_params(c, spec("model.layers.1.block_sparse_moe.gate.e_score_correction_bias"), 1);
  EXPECT_FLOAT_EQ(bias.b, 0.01f);
  // Every tensor gets its own seed, and the model seed changes all of them.
  EXPECT_NE(q.seed, random_fill_params(c, spec("model.layers.0.self_attn.k_proj.weight"), 1).seed);
  EXPECT_NE(q.seed, random_fill_params(c, spec("model.layers.0.self_attn.q_proj.weight"), 2).seed);
}

#if defined(DELTASERVE_WITH_CUDA)

// ------------------------------------------------------------------------------------------ GPU helpers

std::vector<uint8_t> download(const void* p, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  if (bytes) CUDA_CHECK(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost));
  return v;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

// One checkpoint tensor's documented place in the device model (cuda_model.h): rows [row0, ...) of a device
// matrix with `cols` columns; scale = the matrix's 128x128 block scales when it is e4m3.
struct Where {
  std::string name;
  const void* data;
  const void* scale;
  DType dtype;
  int64_t cols;
  int64_t row0;
  int64_t scale_pitch = 0;  // floats per scale row; 0 = cols/128 (the experts' layout)
};

Where at(const std::string& name, const DeviceLinear& l, int64_t row0) {
  return {name, l.w.data, l.scale.data, l.w.dtype, l.K(), row0, l.scale.data ? l.scale.shape[1] : 0};
}

std::vector<Where> documented_layout(const ModelConfig& c, const DeviceModel& m) {
  const int64_t D = c.hidden_size, P = c.kda_proj_dim(), K = c.linear_attn.head_dim, I = c.moe_intermediate_size;
  const int64_t W = c.linear_attn.short_conv_kernel_size, Id = c.intermediate_size;
  std::vector<Where> v;
  v.push_back({"model.embed_tokens.weight", m.embed, nullptr, DType::kBF16, D, 0});
  v.push_back({"model.norm.weight", m.final_norm, nullptr, DType::kBF16, D, 0});
  v.push_back(at("lm_head.weight", m.lm_head, 0));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DeviceLayer& L = m.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i), a = p + "self_attn.";
    v.push_back({p + "input_layernorm.weight", L.input_norm, nullptr, DType::kBF16, D, 0});
    v.push_back({p + "post_attention_layernorm.weight", L.post_norm, nullptr, DType::kBF16, D, 0});
    if (L.kda) {
      const KdaLayerWeights& k = L.k;
      v.push_back(at(a + "q_proj.weight", k.proj, 0));
      v.push_back(at(a + "k_proj.weight", k.proj, P));
      v.push_back(at(a + "v_proj.weight", k.proj, 2 * P));
      // A split projection keeps the gate rows in proj_gates, from its row 0 (= packed row 3P).
      const DeviceLinear& g = k.split() ? k.proj_gates : k.proj;
      const int64_t g0 = k.split() ? 0 : 3 * P;
      v.push_back(at(a + "f_a_proj.weight", g, g0));
      v.push_back(at(a + "g_a_proj.weight", g, g0 + K));
      v.push_back(at(a + "b_proj.weight", g, g0 + 2 * K));
      v.push_back(at(a + "f_b_proj.weight", k.f_b, 0));
      v.push_back(at(a + "g_b_proj.weight", k.g_b, 0));
      v.push_back(at(a + "o_proj.weight", k.o_proj, 0));
      v.push_back({a + "q_conv1d.weight", k.conv_w, nullptr, DType::kBF16, W, 0});
      v.push_back({a + "k_conv1d.weight", k.conv_w, nullptr, DType::kBF16, W, P});
      v.push_back({a + "v_conv1d.weight", k.conv_w, nullptr, DType::kBF16, W, 2 * P});
      v.push_back({a + "A_log", k.A_log, nullptr, DType::kF32, c.linear_attn.num_heads, 0});
      v.push_back({a + "dt_bias", k.dt_bias, nullptr, DType::kF32, P, 0});
      v.push_back({a + "o_norm.weight", k.o_norm, nullptr, DType::kF32, K, 0});
    } else {
      const MlaLayerWeights& ml = L.m;
      v.push_back(at(a + "q_proj.weight", ml.fused_a, 0));
      v.push_back(at(a + "kv_a_proj_with_mqa.weight", ml.fused_a, c.num_attention_heads * c.mla_qk_head_dim()));
      v.push_back({a + "kv_a_layernorm.weight", ml.kv_a_norm, nullptr, DType::kBF16, c.kv_lora_rank, 0});
      v.push_back({a + "kv_b_proj.weight", ml.kv_b, nullptr, DType::kBF16, c.kv_lora_rank, 0});
      v.push_back(at(a + "o_proj.weight", ml.o_proj, 0));
    }
    if (L.moe) {
      const MoeLayerWeights& e = L.e;
      const std::string mp = p + "block_sparse_moe.";
      const DType wt = e.format == moe::WeightFormat::kFP8Block ? DType::kF8E4M3 : DType::kBF16;
      v.push_back({mp + "gate.weight", e.gate_w, nullptr, DType::kBF16, D, 0});
      v.push_back({mp + "gate.e_score_correction_bias", e.gate_bias, nullptr, DType::kF32, c.num_experts, 0});
      for (int x = 0; x < c.num_experts; ++x) {
        const std::string ep = fmt::format("{}experts.{}.", mp, x);
        v.push_back({ep + "w1.weight", e.experts.w13, e.experts.w13_scale, wt, D, x * 2 * I});
        v.push_back({ep + "w3.weight", e.experts.w13, e.experts.w13_scale, wt, D, x * 2 * I + I});
        v.push_back({ep + "w2.weight", e.experts.w2, e.experts.w2_scale, wt, I, x * D});
      }
      if (e.has_shared) {
        v.push_back({mp + "shared_experts.gate_proj.weight", e.shared.w13, e.shared.w13_scale, wt, D, 0});
        v.push_back({mp + "shared_experts.up_proj.weight", e.shared.w13, e.shared.w13_scale, wt, D, I});
        v.push_back({mp + "shared_experts.down_proj.weight", e.shared.w2, e.shared.w2_scale, wt, I, 0});
      }
    } else {
      v.push_back(at(p + "mlp.gate_proj.weight", L.dense.gate_up, 0));
      v.push_back(at(p + "mlp.up_proj.weight", L.dense.gate_up, Id));
      v.push_back(at(p + "mlp.down_proj.weight", L.dense.down, 0));
    }
  }
  return v;
}

size_t esize(DType t) { return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1; }

// The device copy of one documented piece: `numel` elements, and for e4m3 its rows of block scales.
struct DevicePiece {
  std::vector<uint8_t> data;
  std::vector<float> scale;  // [ceil(rows/128), cols/128]
  int64_t rows = 0;
};
DevicePiece fetch(const Where& w, int64_t numel) {
  DevicePiece d;
  d.rows = numel / w.cols;
  EXPECT_EQ(d.rows * w.cols, numel) << w.name;
  d.data = download(static_cast<const char*>(w.data) + w.row0 * w.cols * esize(w.dtype), numel * esize(w.dtype));
  if (w.dtype == DType::kF8E4M3) {
    EXPECT_NE(w.scale, nullptr) << w.name;
    EXPECT_EQ(w.row0 % 128, 0) << w.name;
    const int64_t kb = w.cols / 128, nb = (d.rows + 127) / 128, pitch = w.scale_pitch > 0 ? w.scale_pitch : kb;
    EXPECT_EQ(pitch, w.scale_pitch > 0 ? gemm::w_scale_cols(w.cols) : kb) << w.name;  // cuBLASLt rows padded
    const auto raw = download(static_cast<const float*>(w.scale) + (w.row0 / 128) * pitch, nb * pitch * 4);
    d.scale.resize(nb * kb);
    for (int64_t r = 0; r < nb; ++r) std::memcpy(d.scale.data() + r * kb, raw.data() + r * pitch * 4, kb * 4);
  }
  return d;
}

std::vector<float> dequant(const DevicePiece& d, int64_t cols) {
  std::vector<float> out(d.data.size());
  const int64_t kb = cols / 128;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) / cols, k = static_cast<int64_t>(i) % cols;
    out[i] = e4m3_to_f32(d.data[i]) * d.scale[(r / 128) * kb + k / 128];
  }
  return out;
}

int64_t numel_of(const TensorView& v) { return v.numel(); }

// Checks every documented piece of m against the source weights:
//   bf16 device  = the source's bf16 bits (a bf16 source) or bf16(dequantised e4m3 / converted)
//   f32 device   = the source's values
//   e4m3 device  = the source's codes and scales (an e4m3 source), else quant_fp8_block of the source (the GPU
//                  quantiser's arithmetic is the CPU's: codes and scales bit-identical)
void expect_pieces_match(const ModelConfig& c, const WeightSet& src, const DeviceModel& m) {
  int64_t pieces = 0, fp8_pieces = 0;
  double worst_rms = 0;
  for (const Where& w : documented_layout(c, m)) {
    SCOPED_TRACE(w.name);
    const TensorView& sv = src.get(w.name);
    const int64_t n = numel_of(sv);
    const DevicePiece d = fetch(w, n);
    ++pieces;
    if (w.dtype == DType::kBF16) {
      int64_t bad = 0;
      if (sv.dtype == DType::kBF16) {
        bad = std::memcmp(d.data.data(), sv.data, n * 2) != 0;
      } else {
        const std::vector<float> f = src.get_f32(w.name);
        for (int64_t i = 0; i < n; ++i) {
          uint16_t g;
          std::memcpy(&g, d.data.data() + 2 * i, 2);
          bad += g != f32_to_bf16(f[i]);
        }
      }
      ASSERT_EQ(bad, 0) << "bf16 copy differs";
    } else if (w.dtype == DType::kF32) {
      const std::vector<float> f = src.get_f32(w.name);
      ASSERT_EQ(std::memcmp(d.data.data(), f.data(), n * 4), 0) << "f32 copy differs";
    } else {
      ++fp8_pieces;
      HostTensor q, s;  // the CPU quantisation of a bf16 source
      TensorView codes = sv, scales;
      if (sv.dtype == DType::kF8E4M3) {
        scales = src.get(w.name + "_scale_inv");
      } else {
        const std::vector<float> f = src.get_f32(w.name);
        quant_fp8_block(f.data(), d.rows, w.cols, &q, &s);
        codes = q.view();
        scales = s.view();
      }
      int64_t code_bad = 0;
      for (int64_t i = 0; i < n; ++i) code_bad += d.data[i] != static_cast<const uint8_t*>(codes.data)[i];
      ASSERT_EQ(static_cast<size_t>(scales.numel()), d.scale.size());
      const int64_t scale_bad = std::memcmp(d.scale.data(), scales.data, d.scale.size() * 4) != 0;
      EXPECT_EQ(code_bad, 0) << "e4m3 codes differ from the CPU quantiser / checkpoint";
      EXPECT_EQ(scale_bad, 0) << "block scales differ";
      // And the dequantised weight is the source within e4m3 precision (3 mantissa bits: ~2-3 % RMS).
      const auto st = test::compare("fp8 " + w.name, dequant(d, w.cols), src.get_f32(w.name));
      worst_rms = std::max(worst_rms, st.rms_ratio);
      EXPECT_LT(st.rms_ratio, 0.05);
    }
  }
  std::printf("checked %lld pieces (%lld e4m3, worst dequantised RMS ratio %.3e)\n", static_cast<long long>(pieces),
              static_cast<long long>(fp8_pieces), worst_rms);
}

// The KDA projection's pad rows (after b_proj) are zero, codes and (where a block holds only pad) scales.
void expect_kda_pad_zero(const ModelConfig& c, const DeviceModel& m) {
  const int64_t used = 3 * c.kda_proj_dim() + 2 * c.linear_attn.head_dim + c.linear_attn.num_heads;
  for (const DeviceLayer& L : m.layers) {
    if (!L.kda) continue;
    const DeviceLinear& p = L.k.split() ? L.k.proj_gates : L.k.proj;  // the pad rows end the gate part
    const int64_t first = L.k.split() ? L.k.proj.N() : 0;  // p's first row in the packed layout
    EXPECT_EQ(first + p.N(), L.k.proj_cols);
    EXPECT_EQ(L.k.proj_cols % 16, 0);
    EXPECT_GE(L.k.proj_cols, used);
    EXPECT_LT(L.k.proj_cols, used + 16);
    const size_t es = esize(p.w.dtype);
    const auto pad = download(static_cast<const char*>(p.w.data) + (used - first) * p.K() * es,
                              (first + p.N() - used) * p.K() * es);
    int64_t nonzero = 0;
    for (uint8_t b : pad) nonzero += b != 0;
    EXPECT_EQ(nonzero, 0) << "KDA projection pad rows are not zero";
  }
}

// split: DELTASERVE_FP8_KDA_PROJ=2 (q/k/v FP8 in proj, the gates bf16 in proj_gates).
void expect_formats(const DeviceModel& m, bool fp8, bool fp8_proj, bool split = false) {
  const DType q = fp8 ? DType::kF8E4M3 : DType::kBF16;
  EXPECT_EQ(m.lm_head.w.dtype, DType::kBF16);
  EXPECT_EQ(m.lm_head.scale.data, nullptr);
  for (const DeviceLayer& L : m.layers) {
    if (L.kda) {
      EXPECT_EQ(L.k.proj.w.dtype, fp8_proj ? DType::kF8E4M3 : DType::kBF16);
      EXPECT_EQ(L.k.f_b.w.dtype, DType::kBF16);
      EXPECT_EQ(L.k.g_b.w.dtype, DType::kBF16);
      EXPECT_EQ(L.k.o_proj.w.dtype, q);
      EXPECT_EQ(L.k.o_proj.scale.data != nullptr, fp8);
      EXPECT_EQ(L.k.split(), split);
      if (split) {
        EXPECT_EQ(L.k.proj.N(), L.k.col_fa);  // q, k, v
        EXPECT_EQ(L.k.proj_gates.w.dtype, DType::kBF16);
        EXPECT_EQ(L.k.proj_gates.scale.data, nullptr);
      }
      EXPECT_EQ(L.k.proj_cols, L.k.proj.N() + (split ? L.k.proj_gates.N() : 0));
    } else {
      EXPECT_EQ(L.m.fused_a.w.dtype, q);
      EXPECT_EQ(L.m.o_proj.w.dtype, q);
      if (fp8) {
        EXPECT_EQ(L.m.fused_a.scale.shape[0], (L.m.fused_a.N() + 127) / 128);
        EXPECT_EQ(L.m.fused_a.scale.shape[1], gemm::w_scale_cols(L.m.fused_a.K()));
      }
    }
    if (L.moe) {
      EXPECT_EQ(L.e.format, fp8 ? moe::WeightFormat::kFP8Block : moe::WeightFormat::kBF16);
      EXPECT_EQ(L.e.experts.w13_scale != nullptr, fp8);
      EXPECT_TRUE(L.e.has_shared);
      EXPECT_EQ(L.e.shared.w2_scale != nullptr, fp8);
    } else {
      EXPECT_EQ(L.dense.gate_up.w.dtype, q);
      EXPECT_EQ(L.dense.down.w.dtype, q);
    }
  }
}

// ------------------------------------------------------------------------------------------ GPU: upload

TEST(CudaModelUpload, Bf16LayoutMatchesSource) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("tiny");
  const WeightSet w = random_weights(c, 5);
  const auto m = upload_model(c, w, {});
  EXPECT_EQ(m->bytes, device_model_bytes(c, {}));
  EXPECT_EQ(m->layers.size(), 4u);
  EXPECT_TRUE(m->layers[0].kda && !m->layers[0].moe);
  EXPECT_TRUE(!m->layers[3].kda && m->layers[3].moe);
  expect_formats(*m, false, false);
  const KdaLayerWeights& k = m->layers[0].k;
  EXPECT_EQ(k.col_q, 0);
  EXPECT_EQ(k.col_k, 256);
  EXPECT_EQ(k.col_v, 512);
  EXPECT_EQ(k.col_fa, 768);
  EXPECT_EQ(k.col_ga, 896);
  EXPECT_EQ(k.col_b, 1024);
  EXPECT_EQ(k.proj_cols, 1040);  // 1026 rounded up to 16
  expect_pieces_match(c, w, *m);
  expect_kda_pad_zero(c, *m);
}

TEST(CudaModelUpload, Fp8QuantisedAtLoad) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("tiny");
  const WeightSet w = random_weights(c, 6);
  for (bool proj : {false, true}) {
    DeviceModelOptions o;
    o.fp8 = true;
    o.fp8_kda_proj = proj;
    o.fp8_lm_head = proj;  // the FP8 lm_head copy rides along with the second case
    const auto m = upload_model(c, w, o);
    EXPECT_EQ(m->bytes, device_model_bytes(c, o));
    expect_formats(*m, true, proj);
    if (proj) {
      // DELTASERVE_FP8_KDA_PROJ=2: q/k/v FP8, the gate rows bf16, every piece where the layout says.
      DeviceModelOptions os = o;
      os.kda_gates_bf16 = true;
      const auto ms = upload_model(c, w, os);
      EXPECT_EQ(ms->bytes, device_model_bytes(c, os));
      expect_formats(*ms, true, true, true);
      expect_pieces_match(c, w, *ms);
      expect_kda_pad_zero(c, *ms);
      EXPECT_EQ(m->lm_head_fp8.w.dtype, DType::kF8E4M3);
      EXPECT_EQ(m->lm_head_fp8.N(), c.vocab_size);
      EXPECT_EQ(m->lm_head_fp8.K(), c.hidden_size);
      EXPECT_NE(m->lm_head_fp8.scale.data, nullptr);
    } else {
      EXPECT_EQ(m->lm_head_fp8.w.data, nullptr);
    }
    expect_pieces_match(c, w, *m);
    expect_kda_pad_zero(c, *m);
    // Expert stacking: [E, 2I/128, D/128] scales, expert e's w1 block rows then w3's.
    const auto& e = m->layers[1].e.experts;
    EXPECT_NE(e.w13_scale, nullptr);
    EXPECT_NE(e.w2_scale, nullptr);
  }
}

// A checkpoint in FP8 (DeepSeek-V3 style e4m3 + weight_scale_inv for the layer GEMM weights): codes and scales
// load unchanged and stack; f_b / g_b / kv_b (bf16 on the device) are dequantised; a few pieces left in bf16
// are quantised on the GPU into the same packed tensor.
TEST(CudaModelUpload, Fp8CheckpointLoadsAsStored) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("tiny");
  const WeightSet bf = random_weights(c, 7);
  const std::vector<std::string> keep_bf16 = {"model.layers.1.block_sparse_moe.experts.0.w3.weight",
                                              "model.layers.2.block_sparse_moe.shared_experts.up_proj.weight",
                                              "model.layers.0.self_attn.b_proj.weight"};
  WeightSet ck;
  int quantised = 0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    const TensorView& v = bf.get(s.name);
    const bool fp8 = s.shape.size() == 2 && s.name.rfind("model.layers.", 0) == 0 &&
                     s.name.find("gate.weight") == std::string::npos &&
                     std::find(keep_bf16.begin(), keep_bf16.end(), s.name) == keep_bf16.end();
    if (!fp8) {
      ck.put_view(s.name, v);
      continue;
    }
    const std::vector<float> f = bf.get_f32(s.name);
    HostTensor q, sc;
    quant_fp8_block(f.data(), s.shape[0], s.shape[1], &q, &sc);
    ck.put(s.name, std::move(q));
    ck.put(s.name + "_scale_inv", std::move(sc));
    ++quantised;
  }
  ASSERT_GT(quantised, 50);
  const auto m = upload_model(c, ck, {});  // no options: the checkpoint's own format decides
  DeviceModelOptions all;
  all.fp8 = true;
  all.fp8_kda_proj = true;
  EXPECT_EQ(m->bytes, device_model_bytes(c, all));
  expect_formats(*m, true, true);
  expect_pieces_match(c, ck, *m);
  expect_kda_pad_zero(c, *m);
}

// ------------------------------------------------------------------------------------------ GPU: random

struct Stat {
  double mean = 0, sd = 0, lo = 1e30, hi = -1e30;
  int64_t n = 0;
};
Stat stat_of(const std::vector<float>& v) {
  Stat s;
  s.n = static_cast<int64_t>(v.size());
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x;
    s.lo = std::min<double>(s.lo, x);
    s.hi = std::max<double>(s.hi, x);
  }
  s.mean = sum / v.size();
  for (float x : v) sq += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(sq / v.size());
  return s;
}

std::vector<float> values(const Where& w, const DevicePiece& d) {
  if (w.dtype == DType::kF8E4M3) return dequant(d, w.cols);
  std::vector<float> v(d.data.size() / esize(w.dtype));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(d.data.data(), w.dtype, i);
  return v;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Every piece regenerated on the CPU (random_fill_params + fill_random_ref) is found at its documented place;
// statistics per tensor kind follow random_tensor()'s init rules.
void check_random_model(const ModelConfig& c, uint64_t seed, const DeviceModel& m) {
  const double out_scale = 0.5 / std::sqrt(2.0 * c.num_hidden_layers);
  std::map<std::string, TensorSpec> specs;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) specs[s.name] = s;
  int64_t pieces = 0, one_ulp = 0, elems = 0;
  for (const Where& w : documented_layout(c, m)) {
    SCOPED_TRACE(w.name);
    const TensorSpec& s = specs.at(w.name);
    int64_t n = 1;
    for (int64_t x : s.shape) n *= x;
    const DevicePiece d = fetch(w, n);
    ++pieces;
    elems += n;
    // Exact regeneration (bf16: libm differences flip a rare rounding by one ulp).
    util::FillParams f = random_fill_params(c, s, seed);
    f.n = n;
    f.dtype = w.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
    std::vector<uint8_t> ref(n * dtype_size(f.dtype));
    f.out = ref.data();
    util::fill_random_ref(f);
    if (w.dtype == DType::kBF16) {
      int64_t far = 0;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t a, b;
        std::memcpy(&a, d.data.data() + 2 * i, 2);
        std::memcpy(&b, ref.data() + 2 * i, 2);
        const int diff = std::abs(static_cast<int>(a) - static_cast<int>(b));
        one_ulp += diff >= 1;
        // Values within ~1e-5 of zero may differ in more bf16 ulps (or sign) for an fp32-ulp libm difference.
        far += diff > 1 && std::fabs(bf16_to_f32(a) - bf16_to_f32(b)) > 1e-5;
      }
      ASSERT_EQ(far, 0) << "device values are not the regenerated ones";
    } else if (w.dtype == DType::kF32) {
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        float a, b;
        std::memcpy(&a, d.data.data() + 4 * i, 4);
        std::memcpy(&b, ref.data() + 4 * i, 4);
        worst = std::max(worst, std::fabs(a - b) / (1.0 + std::fabs(b)));
      }
      ASSERT_LT(worst, 1e-5);
    } else {
      std::vector<float> rf(n);
      for (int64_t i = 0; i < n; ++i) rf[i] = load_as_f32(ref.data(), DType::kBF16, i);
      const auto st = test::compare("random fp8 " + w.name, dequant(d, w.cols), rf);
      EXPECT_LT(st.rms_ratio, 0.05);
    }
    // Statistics per kind.
    const std::vector<float> v = values(w, d);
    const Stat st = stat_of(v);
    const std::string& nm = w.name;
    if (ends_with(nm, "norm.weight")) {
      EXPECT_EQ(st.lo, 1.0);
      EXPECT_EQ(st.hi, 1.0);
    } else if (ends_with(nm, "A_log")) {
      EXPECT_GE(st.lo, 0.0);
      EXPECT_LE(st.hi, std::log(16.0) + 0.02);
    } else if (ends_with(nm, "dt_bias")) {
      for (float x : v) {
        const double sp = std::log1p(std::exp(static_cast<double>(x)));
        ASSERT_GE(sp, 0.001 * 0.9999);
        ASSERT_LE(sp, 0.1 * 1.0001);
      }
    } else {
      double sd = 0;
      if (ends_with(nm, "_conv1d.weight")) sd = 0.5;
      else if (ends_with(nm, "e_score_correction_bias")) sd = 0.01;
      else if (nm == "model.embed_tokens.weight") sd = 1.0;
      else {
        const bool out = ends_with(nm, "o_proj.weight") || ends_with(nm, "down_proj.weight") || ends_with(nm, "w2.weight");
        sd = (out ? out_scale : 1.0) / std::sqrt(static_cast<double>(s.shape[1]));
      }
      if (n >= 4096) {  // the sd estimate's own error is ~1/sqrt(2n): <= 1.1 % here, against a 5 % bound
        EXPECT_NEAR(st.sd / sd, 1.0, 0.05) << "sd " << st.sd << " want " << sd;
        EXPECT_NEAR(st.mean / sd, 0.0, 5.0 / std::sqrt(static_cast<double>(n)));
      }
    }
  }
  std::printf("random model: %lld pieces, %lld values, %lld bf16 values not bit-equal to the CPU regeneration\n",
              static_cast<long long>(pieces), static_cast<long long>(elems), static_cast<long long>(one_ulp));
  EXPECT_LE(one_ulp, elems / 1000);
}

TEST(CudaModelRandom, Bf16ValuesAndStatistics) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("tiny");
  const auto m = random_device_model(c, 11, {});
  EXPECT_EQ(m->bytes, device_model_bytes(c, {}));
  expect_formats(*m, false, false);
  check_random_model(c, 11, *m);
  expect_kda_pad_zero(c, *m);
  // Deterministic in the seed.
  const size_t emb = static_cast<size_t>(c.vocab_size) * c.hidden_size * 2;
  const auto again = random_device_model(c, 11, {}), other = random_device_model(c, 12, {});
  EXPECT_EQ(download(m->embed, emb), download(again->embed, emb));
  EXPECT_NE(download(m->embed, emb), download(other->embed, emb));
}

TEST(CudaModelRandom, Fp8ValuesAndStatistics) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("tiny");
  DeviceModelOptions o;
  o.fp8 = true;
  o.fp8_kda_proj = true;
  const auto m = random_device_model(c, 13, o);
  EXPECT_EQ(m->bytes, device_model_bytes(c, o));
  expect_formats(*m, true, true);
  check_random_model(c, 13, *m);
  expect_kda_pad_zero(c, *m);
}

// ------------------------------------------------------------------------------------------ GPU: memory

TEST(CudaModelMemory, TooLargeIsRefusedBeforeAllocating) {
  SKIP_WITHOUT_GPU();
  ModelConfig c = preset_config("tiny");
  c.vocab_size = 400'000'000;  // embed + lm_head: 2 x 400M x 256 x 2 B = 410 GB
  const size_t before = free_bytes();
  try {
    random_device_model(c, 1, {});
    ADD_FAILURE() << "a 410 GB model was accepted";
  } catch (const Error& e) {
    std::printf("refused: %s\n", e.what());
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("409."), std::string::npos) << msg;  // weights 409.6 GB named
  }
  EXPECT_GE(free_bytes() + (size_t{16} << 20), before);
}

// A mid-size model (~0.6 GB) so that a leak would show in cudaMemGetInfo despite the driver's granularity.
ModelConfig leak_config() {
  ModelConfig c = preset_config("tiny");
  c.hidden_size = 1024;
  c.num_experts = 64;
  c.moe_intermediate_size = 512;
  return c;
}

TEST(CudaModelMemory, NothingLeaksOnSuccessOrHalfwayFailure) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = leak_config();
  const size_t bytes = device_model_bytes(c, {});
  ASSERT_GT(bytes, size_t{500} << 20);
  const size_t slack = size_t{32} << 20;
  const size_t before = free_bytes();
  for (int i = 0; i < 3; ++i) {
    auto m = random_device_model(c, i, {});
    EXPECT_LE(free_bytes() + bytes, before + slack) << "the model's memory is not accounted";
  }
  EXPECT_GE(free_bytes() + slack, before) << "random_device_model leaked";

  // A non-contiguous view of the last expert's w2 in the last layer: validate_weights accepts the shape, the
  // upload fails when it reaches that tensor, after the arena is allocated and most weights copied.
  WeightSet w = random_weights(c, 3);
  const std::string last =
      fmt::format("model.layers.{}.block_sparse_moe.experts.{}.w2.weight", c.num_hidden_layers - 1, c.num_experts - 1);
  HostTensor wide(DType::kBF16, {c.hidden_size, 2 * int64_t{c.moe_intermediate_size}});
  TensorView strided = wide.view();
  strided.shape[1] = c.moe_intermediate_size;  // row stride stays 2I: a strided slice
  w.put_view(last, strided);
  for (DeviceModelOptions o : {DeviceModelOptions{false, false}, DeviceModelOptions{true, false}}) {
    try {
      upload_model(c, w, o);
      ADD_FAILURE() << "a strided tensor was uploaded";
    } catch (const Error& e) {
      std::printf("failed halfway as intended: %s\n", e.what());
      EXPECT_NE(std::string(e.what()).find(last), std::string::npos) << e.what();
    }
    EXPECT_GE(free_bytes() + slack, before) << "upload_model leaked after failing halfway (fp8 " << o.fp8 << ")";
  }
}

// ------------------------------------------------------------------------------------------ GPU: full size

// The 48B preset generated on the GPU: seconds, and exactly device_model_bytes. Runs what fits in free memory.
TEST(CudaModelRandom, Preset48BInSeconds) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  int ran = 0;
  for (bool fp8 : {true, false}) {
    DeviceModelOptions o;
    o.fp8 = fp8;
    const size_t bytes = device_model_bytes(c, o);
    if (bytes + (size_t{2} << 30) > free_bytes()) {
      std::printf("48B %s: %.1f GB does not fit in %.1f GB free, skipped\n", fp8 ? "fp8" : "bf16", bytes / kGB,
                  free_bytes() / kGB);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto m = random_device_model(c, 1, o);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("48B %s: %.2f GB generated in %.2f s (%.0f GB/s)\n", fp8 ? "fp8" : "bf16", m->bytes / kGB, secs,
                m->bytes / kGB / secs);
    EXPECT_EQ(m->bytes, bytes);
    EXPECT_LT(secs, 90.0);
    // Spot check: an expert deep in the stack has the init sd (w1 of expert 200 in layer 20).
    const DeviceLayer& L = m->layers[20];
    const int64_t I = c.moe_intermediate_size, D = c.hidden_size;
    const Where w{"w1", L.e.experts.w13, L.e.experts.w13_scale, fp8 ? DType::kF8E4M3 : DType::kBF16, D, 200 * 2 * I};
    const Stat st = stat_of(values(w, fetch(w, I * D)));
    EXPECT_NEAR(st.sd * std::sqrt(static_cast<double>(D)), 1.0, 0.05);
    ++ran;
  }
  if (!ran) GTEST_SKIP() << "not enough free GPU memory for the 48B preset";
}

#endif  // DELTASERVE_WITH_CUDA

}  // namespace
}  // namespace ds
