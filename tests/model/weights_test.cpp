// Tensor inventory (spec sections 2 and 8), random init, validation, FP8 block scales and checkpoint I/O.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "tests/test_util.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(msg, fragment) EXPECT_NE((msg).find(fragment), std::string::npos) << "expected '" << (fragment) << "' in: " << (msg)

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(Weights, RealPresetInventoryMatchesTheSpec) {
  const ModelConfig c = preset_config("kimi-linear-48b-a3b");
  const std::vector<TensorSpec> specs = checkpoint_tensor_specs(c);
  EXPECT_EQ(specs.size(), 20493u);
  std::set<std::string> names;
  int64_t total = 0, experts = 0, kda0 = 0, mla3 = 0, dense = 0, router1 = 0;
  for (const auto& s : specs) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
    const int64_t n = numel(s.shape);
    total += n;
    if (s.name.find(".experts.") != std::string::npos) experts += n;
    if (s.name.rfind("model.layers.0.self_attn.", 0) == 0) kda0 += n;
    if (s.name.rfind("model.layers.3.self_attn.", 0) == 0) mla3 += n;
    if (s.name.rfind("model.layers.0.mlp.", 0) == 0) dense += n;
    if (s.name.rfind("model.layers.1.block_sparse_moe.gate.", 0) == 0) router1 += n;
  }
  // Spec section 8.
  EXPECT_EQ(total, 49'122'681'728);
  EXPECT_EQ(experts, 47'110'422'528);
  EXPECT_EQ(total - experts, 2'012'259'200);
  EXPECT_EQ(kda0, 39'514'272);
  EXPECT_EQ(mla3, 29'114'880);
  EXPECT_EQ(dense, 63'700'992);
  EXPECT_EQ(router1, 590'080);
  std::map<std::string, TensorSpec> by;
  for (const auto& s : specs) by[s.name] = s;
  auto expect = [&](const std::string& name, std::vector<int64_t> shape, DType t) {
    ASSERT_TRUE(by.count(name)) << name;
    EXPECT_EQ(by[name].shape, shape) << name;
    EXPECT_EQ(by[name].dtype, t) << name;
  };
  const DType bf = DType::kBF16, f32 = DType::kF32;
  expect("model.embed_tokens.weight", {163840, 2304}, bf);
  expect("model.norm.weight", {2304}, bf);
  expect("lm_head.weight", {163840, 2304}, bf);
  expect("model.layers.0.self_attn.q_conv1d.weight", {4096, 1, 4}, bf);
  expect("model.layers.0.self_attn.dt_bias", {4096}, f32);
  expect("model.layers.0.self_attn.A_log", {1, 1, 32, 1}, f32);
  expect("model.layers.0.self_attn.f_a_proj.weight", {128, 2304}, bf);
  expect("model.layers.0.self_attn.g_b_proj.weight", {4096, 128}, bf);
  expect("model.layers.0.self_attn.b_proj.weight", {32, 2304}, bf);
  expect("model.layers.0.self_attn.o_norm.weight", {128}, bf);
  expect("model.layers.0.mlp.down_proj.weight", {2304, 9216}, bf);
  expect("model.layers.26.self_attn.q_proj.weight", {6144, 2304}, bf);
  expect("model.layers.26.self_attn.kv_a_proj_with_mqa.weight", {576, 2304}, bf);
  expect("model.layers.26.self_attn.kv_a_layernorm.weight", {512}, bf);
  expect("model.layers.26.self_attn.kv_b_proj.weight", {8192, 512}, bf);
  expect("model.layers.26.self_attn.o_proj.weight", {2304, 4096}, bf);
  expect("model.layers.26.block_sparse_moe.gate.weight", {256, 2304}, bf);
  expect("model.layers.26.block_sparse_moe.gate.e_score_correction_bias", {256}, f32);
  expect("model.layers.26.block_sparse_moe.experts.255.w1.weight", {1024, 2304}, bf);
  expect("model.layers.26.block_sparse_moe.experts.255.w2.weight", {2304, 1024}, bf);
  expect("model.layers.26.block_sparse_moe.shared_experts.down_proj.weight", {2304, 1024}, bf);
  EXPECT_EQ(by.count("model.layers.0.block_sparse_moe.gate.weight"), 0u);  // layer 0 is dense
  EXPECT_EQ(by.count("model.layers.1.mlp.gate_proj.weight"), 0u);
}

TEST(Weights, SharedExpertWidthScalesWithTheirCount) {
  ModelConfig c = preset_config("tiny");
  c.num_shared_experts = 2;
  int found = 0;
  for (const auto& s : checkpoint_tensor_specs(c)) {
    if (s.name.find("shared_experts.up_proj.weight") == std::string::npos) continue;
    EXPECT_EQ(s.shape, (std::vector<int64_t>{256, 256})) << s.name;  // 2 x moe_intermediate 128
    ++found;
  }
  EXPECT_EQ(found, 3);  // MoE layers 1..3 of the tiny model
  c.num_shared_experts = 0;
  for (const auto& s : checkpoint_tensor_specs(c)) EXPECT_EQ(s.name.find("shared_experts"), std::string::npos);
}

// random_weights generates tensors on several threads: every tensor must still equal the one random_tensor makes
// alone on this thread (the serial definition), with more tensors than threads so work interleaves.
TEST(Weights, RandomWeightsParallelEqualsSerial) {
  ModelConfig c = preset_config("tiny");
  c.num_experts = 64;
  const WeightSet par = random_weights(c, 42);
  size_t n = 0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    const HostTensor serial = random_tensor(c, s, 42);
    const TensorView& v = par.get(s.name);
    ASSERT_EQ(v.nbytes(), serial.nbytes()) << s.name;
    ASSERT_EQ(std::memcmp(v.data, serial.bytes(), v.nbytes()), 0) << s.name;
    ++n;
  }
  EXPECT_EQ(par.names().size(), n);
  std::printf("random_weights: %zu tensors equal to their serial generation\n", n);
}

TEST(Weights, RandomWeightsAreDeterministicFastAndInRange) {
  const ModelConfig c = preset_config("tiny");
  const auto t0 = std::chrono::steady_clock::now();
  const WeightSet a = random_weights(c, 7);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("random_weights(tiny): %.3f s\n", secs);
#ifdef NDEBUG  // the budget is for optimised builds; sanitizer/debug builds are several times slower
  EXPECT_LT(secs, 1.0);
#endif
  validate_weights(c, a);
  const WeightSet b = random_weights(c, 7), other = random_weights(c, 8);
  for (const auto& s : checkpoint_tensor_specs(c)) {
    const TensorView va = a.get(s.name), vb = b.get(s.name);
    EXPECT_EQ(va.dtype, s.dtype);
    ASSERT_EQ(std::memcmp(va.data, vb.data, va.nbytes()), 0) << s.name;
    // Per-tensor streams: a tensor made alone equals the one in the full set.
    const HostTensor alone = random_tensor(c, s, 7);
    ASSERT_EQ(std::memcmp(alone.bytes(), va.data, va.nbytes()), 0) << s.name;
  }
  const std::string emb = "model.embed_tokens.weight";
  EXPECT_NE(std::memcmp(a.get(emb).data, other.get(emb).data, a.get(emb).nbytes()), 0);

  auto stats = [&](const std::string& n) {
    const std::vector<float> v = a.get_f32(n);
    double s = 0, s2 = 0, lo = 1e30, hi = -1e30;
    for (float x : v) { s += x; s2 += double(x) * x; lo = std::min(lo, double(x)); hi = std::max(hi, double(x)); }
    const double mean = s / v.size();
    return std::array<double, 4>{mean, std::sqrt(s2 / v.size() - mean * mean), lo, hi};
  };
  for (const char* n : {"model.norm.weight", "model.layers.0.self_attn.o_norm.weight",
                        "model.layers.3.self_attn.kv_a_layernorm.weight", "model.layers.2.input_layernorm.weight"}) {
    const auto st = stats(n);
    EXPECT_EQ(st[2], 1.0) << n;
    EXPECT_EQ(st[3], 1.0) << n;
  }
  const auto alog = stats("model.layers.0.self_attn.A_log");
  EXPECT_GE(alog[2], 0.0);
  EXPECT_LT(alog[3], std::log(16.0));
  for (float x : a.get_f32("model.layers.1.self_attn.dt_bias")) {
    const double sp = std::log1p(std::exp(double(x)));  // softplus
    EXPECT_GE(sp, 0.001 * 0.999);
    EXPECT_LE(sp, 0.1 * 1.001);
  }
  EXPECT_NEAR(stats(emb)[1], 1.0, 0.02);
  const auto bias = stats("model.layers.1.block_sparse_moe.gate.e_score_correction_bias");  // 8 draws of N(0, 0.01)
  EXPECT_GT(bias[3] - bias[2], 0.0);
  EXPECT_LT(std::max(-bias[2], bias[3]), 0.05);
  EXPECT_NEAR(stats("model.layers.0.self_attn.q_conv1d.weight")[1], 0.5, 0.03);
  EXPECT_NEAR(stats("model.layers.0.self_attn.q_proj.weight")[1], 1 / 16.0, 0.002);  // 1/sqrt(256)
  EXPECT_NEAR(stats("model.layers.0.self_attn.f_b_proj.weight")[1], 1 / std::sqrt(128.0), 0.003);
  // Output projections: 0.5 / sqrt(2 * 4 layers) / sqrt(fan_in).
  EXPECT_NEAR(stats("model.layers.0.self_attn.o_proj.weight")[1], 0.5 / std::sqrt(8.0) / 16.0, 0.0005);
  EXPECT_NEAR(stats("model.layers.1.block_sparse_moe.experts.0.w2.weight")[1], 0.5 / std::sqrt(8.0) / std::sqrt(128.0), 0.001);
}

// A cheap stand-in for the forward pass: the residual stream through 27 layers of RMSNorm + SwiGLU (the dense
// MLP or shared expert of each layer) stays finite and neither vanishes nor explodes.
TEST(Weights, RandomInitKeepsAResidualStackStable) {
  const ModelConfig c = preset_config("tiny", 27);
  const WeightSet w = random_weights(c, 1);
  const int64_t D = c.hidden_size;
  const std::vector<float> emb = w.get_f32("model.embed_tokens.weight");
  std::vector<float> h(emb.begin() + 42 * D, emb.begin() + 43 * D);
  auto norm = [&](const std::vector<float>& x) {
    double s = 0;
    for (float v : x) s += double(v) * v;
    return std::sqrt(s / x.size());
  };
  const double n0 = norm(h);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = c.is_moe_layer(l) ? fmt::format("model.layers.{}.block_sparse_moe.shared_experts.", l)
                                            : fmt::format("model.layers.{}.mlp.", l);
    const auto g = w.get_f32(p + "gate_proj.weight"), u = w.get_f32(p + "up_proj.weight"),
               dn = w.get_f32(p + "down_proj.weight");
    const int64_t I = static_cast<int64_t>(g.size()) / D;
    const double r = norm(h);
    std::vector<float> m(D), a(I);
    for (int64_t i = 0; i < D; ++i) m[i] = static_cast<float>(h[i] / std::sqrt(r * r + 1e-5));
    for (int64_t j = 0; j < I; ++j) {
      double gs = 0, us = 0;
      for (int64_t i = 0; i < D; ++i) { gs += g[j * D + i] * m[i]; us += u[j * D + i] * m[i]; }
      a[j] = static_cast<float>(gs / (1 + std::exp(-gs)) * us);
    }
    for (int64_t i = 0; i < D; ++i) {
      double s = 0;
      for (int64_t j = 0; j < I; ++j) s += dn[i * I + j] * a[j];
      h[i] += static_cast<float>(s);
    }
  }
  const double ratio = norm(h) / n0;
  std::printf("residual RMS after 27 layers / embedding RMS: %.3f\n", ratio);
  EXPECT_TRUE(std::isfinite(ratio));
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 4.0);
  EXPECT_GT(std::fabs(ratio - 1.0), 1e-4);  // the branches contribute something
}

TEST(Weights, WeightSetOwnsOrViewsAndSurvivesMoves) {
  WeightSet w;
  HostTensor t(DType::kBF16, {2, 3});
  for (int i = 0; i < 6; ++i) t.set_f32(i, i * 0.5f);
  w.put("a", std::move(t));
  float ext[2] = {1.5f, -2.0f};
  w.put_view("b", TensorView(ext, DType::kF32, {2}));
  WeightSet moved = std::move(w);
  EXPECT_EQ(moved.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(moved.get_f32("a"), (std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f}));
  EXPECT_EQ(moved.get_f32("b"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_HAS(error_of([&] { moved.get("zz"); }), "tensor 'zz' not found");
  HostTensor i32(DType::kI32, {2});
  moved.put("i", std::move(i32));
  EXPECT_HAS(error_of([&] { moved.get_f32("i"); }), "tensor 'i': dtype i32 cannot be read");
  HostTensor q(DType::kF8E4M3, {2, 2});
  moved.put("q.weight", std::move(q));
  EXPECT_HAS(error_of([&] { moved.get_f32("q.weight"); }), "'q.weight_scale_inv' is missing");
}

TEST(Weights, Fp8BlockQuantisationErrorIsBounded) {
  // 300 x 200: edge blocks of 44 rows and 72 columns; one block x1000, one block all zero.
  const int64_t N = 300, K = 200;
  std::vector<float> w(N * K);
  uint64_t s = 12345;
  for (auto& x : w) {  // a small LCG + Box-Muller keeps the test independent of <random>
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u1 = ((s >> 11) + 1) * 0x1p-53;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u2 = (s >> 11) * 0x1p-53;
    x = static_cast<float>(std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t k = 128; k < 200; ++k) w[r * K + k] *= 1000.0f;
  for (int64_t r = 256; r < 300; ++r)
    for (int64_t k = 0; k < 128; ++k) w[r * K + k] = 0.0f;
  HostTensor q, si;
  quant_fp8_block(w.data(), N, K, &q, &si);
  ASSERT_EQ(si.dims(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(si.ptr<float>()[2 * 2 + 0], 1.0f);  // the zero block
  const std::vector<float> d = dequant_fp8_block(q.view(), si.view());
  double max_abs = 0, max_rel_normal = 0, err2 = 0, ref2 = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const double x = w[n * K + k], e = std::fabs(d[n * K + k] - x);
      const double scale = si.ptr<float>()[(n / 128) * 2 + k / 128];
      // e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 relative for normals (|x| >= 2^-6 scale) and
      // 2^-10 scale absolute for subnormals.
      ASSERT_LE(e, std::max(std::fabs(x) * 0x1p-4, scale * 0x1p-10) * (1 + 1e-6) + 1e-30) << n << "," << k;
      max_abs = std::max(max_abs, e);
      if (std::fabs(x) >= scale * 0x1p-6) max_rel_normal = std::max(max_rel_normal, e / std::fabs(x));
      err2 += e * e;
      ref2 += x * x;
    }
  }
  std::printf("fp8 block quant: max abs err %.4g, max rel err (normals) %.4g, rms ratio %.4g\n", max_abs,
              max_rel_normal, std::sqrt(err2 / ref2));
  EXPECT_LE(max_rel_normal, 0x1p-4 * (1 + 1e-6));
  EXPECT_LT(std::sqrt(err2 / ref2), 0.03);
  for (int64_t r = 256; r < 300; ++r) EXPECT_EQ(d[r * K + 5], 0.0f);
  // Shape checks name what was expected.
  HostTensor bad_scale(DType::kF32, {2, 2});
  EXPECT_HAS(error_of([&] { dequant_fp8_block(q.view(), bad_scale.view()); }), "must be contiguous f32 [3, 2], got f32 [2, 2]");
  EXPECT_THROW(dequant_fp8_block(si.view(), si.view()), Error);
}

TEST(Weights, ValidateNamesTheProblemTensor) {
  const ModelConfig c = preset_config("tiny");
  const std::string qp = "model.layers.0.self_attn.q_proj.weight";
  {
    WeightSet w = random_weights(c, 1);
    WeightSet missing;
    for (const auto& n : w.names())
      if (n != "model.layers.2.self_attn.A_log") missing.put_view(n, w.get(n));
    EXPECT_HAS(error_of([&] { validate_weights(c, missing); }),
               "missing tensor 'model.layers.2.self_attn.A_log' (expected f32 [1, 1, 2, 1])");
    w.put(qp, HostTensor(DType::kBF16, {256, 255}));
    EXPECT_HAS(error_of([&] { validate_weights(c, w); }), "tensor '" + qp + "': shape [256, 255] but the config needs [256, 256]");
    w.put(qp, HostTensor(DType::kI32, {256, 256}));
    EXPECT_HAS(error_of([&] { validate_weights(c, w); }),
               "tensor '" + qp + "': dtype i32 is not supported (expected bf16, f16 or f32, or f8e4m3 with weight_scale_inv)");
    w.put("model.embed_tokens.weight", HostTensor(DType::kF8E4M3, {320, 256}));
    w.put(qp, HostTensor(DType::kF32, {256, 256}));
    EXPECT_HAS(error_of([&] { validate_weights(c, w); }), "tensor 'model.embed_tokens.weight': dtype f8e4m3 is not supported (expected bf16, f16 or f32)");
  }
  // FP8 projections need their block scales, of the right shape.
  WeightSet w = random_weights(c, 1);
  const std::vector<float> ref = w.get_f32(qp);
  HostTensor q, si;
  quant_fp8_block(ref.data(), 256, 256, &q, &si);
  w.put(qp, std::move(q));
  EXPECT_HAS(error_of([&] { validate_weights(c, w); }), "'" + qp + "_scale_inv' is missing");
  w.put(qp + "_scale_inv", HostTensor(DType::kF32, {2, 3}));
  EXPECT_HAS(error_of([&] { validate_weights(c, w); }), "f32 [2, 3] but f32 [2, 2] is needed");
  w.put(qp + "_scale_inv", std::move(si));
  validate_weights(c, w);
  const std::vector<float> back = w.get_f32(qp);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(back[i], ref[i], std::fabs(ref[i]) / 16 + 1e-3);
}

// Writes a checkpoint folder from a config JSON and a tensor list, bypassing save_checkpoint's validation.
void write_raw_checkpoint(const std::string& dir, const nlohmann::json& cfg,
                          const std::vector<std::pair<std::string, TensorView>>& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  write_safetensors(dir + "/model.safetensors", tensors);
}

std::vector<std::pair<std::string, TensorView>> all_tensors(const WeightSet& w) {
  std::vector<std::pair<std::string, TensorView>> r;
  for (const auto& n : w.names()) r.emplace_back(n, w.get(n));
  return r;
}

TEST(Checkpoint, SaveLoadRoundTripIsBitExact) {
  test::TempDir dir;
  const ModelConfig c = preset_config("tiny");
  const WeightSet w = random_weights(c, 3);
  save_checkpoint(dir.file("a"), c, w);
  const Checkpoint ck = load_checkpoint(dir.file("a"));
  EXPECT_EQ(ck.config, c);
  EXPECT_EQ(ck.weights.names(), w.names());
  for (const auto& n : w.names()) {
    const TensorView x = w.get(n), y = ck.weights.get(n);
    ASSERT_EQ(x.dtype, y.dtype) << n;
    ASSERT_EQ(x.dims(), y.dims()) << n;
    ASSERT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << n;
  }
  // config.json is pretty-printed; the streaming random writer produces the same bytes as save_checkpoint.
  const auto cfg = read_bytes(dir.file("a/config.json"));
  EXPECT_NE(std::string(cfg.begin(), cfg.end()).find("\n  \"hidden_size\": 256"), std::string::npos);
  save_random_checkpoint(dir.file("b"), c, 3);
  EXPECT_EQ(read_bytes(dir.file("a/model.safetensors")), read_bytes(dir.file("b/model.safetensors")));
  EXPECT_EQ(cfg, read_bytes(dir.file("b/config.json")));
}

TEST(Checkpoint, LoadsShardedCheckpoints) {
  test::TempDir dir;
  const ModelConfig c = preset_config("tiny");
  const WeightSet w = random_weights(c, 4);
  const std::string d = dir.file("s");
  fs::create_directories(d);
  std::ofstream(d + "/config.json") << config_to_json(c).dump(2);
  std::vector<std::pair<std::string, TensorView>> s1, s2;
  nlohmann::json map;
  for (const auto& [n, v] : all_tensors(w)) {
    const bool first = n.find("layers.3") == std::string::npos;
    (first ? s1 : s2).emplace_back(n, v);
    map[n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(d + "/model-00001-of-00002.safetensors", s1);
  write_safetensors(d + "/model-00002-of-00002.safetensors", s2);
  std::ofstream(d + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  const Checkpoint ck = load_checkpoint(d);
  for (const auto& n : w.names())
    ASSERT_EQ(std::memcmp(w.get(n).data, ck.weights.get(n).data, w.get(n).nbytes()), 0) << n;
  // A shard that lacks a tensor the model needs: the message names the index's default file.
  map.erase("lm_head.weight");
  std::ofstream(d + "/model.safetensors.index.json", std::ios::trunc) << nlohmann::json{{"weight_map", map}}.dump();
  EXPECT_HAS(error_of([&] { load_checkpoint(d); }), "model.safetensors.index.json: missing tensor 'lm_head.weight'");
}

TEST(Checkpoint, LoadRejectsBrokenCheckpoints) {
  test::TempDir dir;
  const ModelConfig c = preset_config("tiny");
  const WeightSet w = random_weights(c, 5);
  const nlohmann::json cfg = config_to_json(c);
  const std::string conv = "model.layers.1.self_attn.k_conv1d.weight";

  // Truncated model.safetensors: names the file and the first tensor whose bytes are cut off.
  const std::string t = dir.file("trunc");
  save_checkpoint(t, c, w);
  fs::resize_file(t + "/model.safetensors", fs::file_size(t + "/model.safetensors") - 100);
  std::string m = error_of([&] { load_checkpoint(t); });
  EXPECT_HAS(m, t + "/model.safetensors: tensor '");
  EXPECT_HAS(m, "run past the end of the data section");

  auto variant = [&](const std::string& name, const std::function<void(std::vector<std::pair<std::string, TensorView>>&)>& edit) {
    auto ts = all_tensors(w);
    edit(ts);
    write_raw_checkpoint(dir.file(name), cfg, ts);
    return error_of([&] { load_checkpoint(dir.file(name)); });
  };
  HostTensor i32(DType::kI32, {256, 256}), wrong(DType::kBF16, {256, 1, 3});
  m = variant("dtype", [&](auto& ts) {
    for (auto& [n, v] : ts) if (n == "model.layers.0.self_attn.v_proj.weight") v = i32.view();
  });
  EXPECT_HAS(m, dir.file("dtype") + "/model.safetensors: tensor 'model.layers.0.self_attn.v_proj.weight': dtype i32 is not supported");
  m = variant("missing", [&](auto& ts) {
    std::erase_if(ts, [](const auto& p) { return p.first == "model.layers.3.self_attn.kv_b_proj.weight"; });
  });
  EXPECT_HAS(m, dir.file("missing") + "/model.safetensors: missing tensor 'model.layers.3.self_attn.kv_b_proj.weight' (expected bf16 [512, 512])");
  m = variant("shape", [&](auto& ts) {
    for (auto& [n, v] : ts) if (n == conv) v = wrong.view();
  });
  EXPECT_HAS(m, "tensor '" + conv + "': shape [256, 1, 3] but the config needs [256, 1, 4]");

  nlohmann::json bad = cfg;
  bad["linear_attn_config"]["kda_layers"] = {1, 2};
  write_raw_checkpoint(dir.file("config"), bad, all_tensors(w));
  EXPECT_HAS(error_of([&] { load_checkpoint(dir.file("config")); }),
             dir.file("config") + "/config.json: field 'linear_attn_config': layer 3 (1-based) is in neither");
  EXPECT_HAS(error_of([&] { load_checkpoint(dir.file("nowhere")); }), "cannot open config file");
  fs::remove(dir.file("config") + "/model.safetensors");
  std::ofstream(dir.file("config") + "/config.json", std::ios::trunc) << cfg.dump();
  EXPECT_HAS(error_of([&] { load_checkpoint(dir.file("config")); }), "neither model.safetensors nor model.safetensors.index.json");
}

TEST(Checkpoint, SaveRefusesInvalidWeights) {
  test::TempDir dir;
  const ModelConfig c = preset_config("tiny");
  WeightSet w;
  EXPECT_HAS(error_of([&] { save_checkpoint(dir.file("x"), c, w); }), "weights: missing tensor 'model.embed_tokens.weight'");
  EXPECT_FALSE(fs::exists(dir.file("x/model.safetensors")));
}

}  // namespace
}  // namespace ds
