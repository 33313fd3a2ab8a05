// `deltaserve op-moe`: one MoE block on tensors read from a safetensors file, on the CPU reference (fp32,
// moe_ref.h) or the CUDA op in any weight format, written back as safetensors (named `op-moe`, not `op moe`:
// `op` is the KDA ops' subcommand group in another file).
//
// Input tensors (any float dtype unless noted):
//   x [T, D];  experts.w1 / experts.w3 [E, I, D] (gate / up), experts.w2 [E, D, I]
//   routing: gate.weight [E, D] (+ optional gate.e_score_correction_bias [E])  -> in-op routing, or
//            topk_ids [T, K] (I32) + topk_weights [T, K] (F32)                 -> separated routing
//   optional: shared.gate_proj / shared.up_proj [I, D], shared.down_proj [D, I], residual [T, D]
// Metadata (strings): top_k (required with gate.weight), routed_scaling_factor, num_expert_group, topk_group,
//   renormalize (0/1), hf_biased_weights (0/1).
// Output: out [T, D] F32, topk_ids [T, K] I32, topk_weights [T, K] F32.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_quant_ref.h"
#include "kernels/moe/moe_ref.h"
#include "model/safetensors.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace {

using ds::DType;

struct Opts {
  std::string in, out, device = "cuda", weights = "bf16", acts = "auto", path = "auto";
};

struct F32 {
  std::vector<float> v;
  std::vector<int64_t> dims;
};

F32 read_f32(const ds::SafetensorsFile& f, const std::string& name) {
  const ds::TensorView t = f.view(name);
  F32 r{std::vector<float>(static_cast<size_t>(t.numel())), t.dims()};
  for (size_t i = 0; i < r.v.size(); ++i) r.v[i] = ds::load_as_f32(t.data, t.dtype, i);
  return r;
}

std::string meta(const ds::SafetensorsFile& f, const std::string& key, const std::string& dflt) {
  const auto it = f.metadata().find(key);
  return it == f.metadata().end() ? dflt : it->second;
}

#ifdef DELTASERVE_WITH_CUDA
ds::moe::WeightFormat parse_weights(const std::string& s) {
  using W = ds::moe::WeightFormat;
  for (W w : {W::kBF16, W::kFP8Block, W::kMXFP8, W::kMXFP4, W::kNVFP4})
    if (s == ds::moe::weight_format_name(w)) return w;
  DS_THROW("op-moe: unknown --weights '{}' (bf16, fp8-block, mxfp8, mxfp4, nvfp4)", s);
}
ds::moe::ActFormat parse_acts(const std::string& s, ds::moe::WeightFormat w) {
  using A = ds::moe::ActFormat;
  if (s == "auto")
    return w == ds::moe::WeightFormat::kFP8Block ? A::kFP8Block : w == ds::moe::WeightFormat::kMXFP8 ? A::kMXFP8 : A::kBF16;
  for (A a : {A::kBF16, A::kFP8Block, A::kMXFP8})
    if (s == ds::moe::act_format_name(a)) return a;
  DS_THROW("op-moe: unknown --acts '{}' (auto, bf16, fp8-1x128, mxfp8-1x32)", s);
}

using ds::upload;  // core/cuda_utils.h
// Stacks gate/up rows per expert ([n, 2I, D]) and quantises both matrices into `w`'s storage.
struct Uploaded {
  std::vector<ds::DeviceBuffer> bufs;
  ds::moe::ExpertWeights view;
};
Uploaded upload_experts(const std::vector<float>& w1, const std::vector<float>& w3, const std::vector<float>& w2, int n,
                        int D, int I, ds::moe::WeightFormat f) {
  std::vector<float> w13(static_cast<size_t>(n) * 2 * I * D);
  const size_t m = static_cast<size_t>(I) * D;
  for (int e = 0; e < n; ++e) {
    std::copy(w1.begin() + e * m, w1.begin() + (e + 1) * m, w13.begin() + 2 * e * m);
    std::copy(w3.begin() + e * m, w3.begin() + (e + 1) * m, w13.begin() + (2 * e + 1) * m);
  }
  const auto q13 = ds::moe::quantize_weights_ref(w13.data(), n, 2 * I, D, f);
  const auto q2 = ds::moe::quantize_weights_ref(w2.data(), n, D, I, f);
  Uploaded u;
  auto put = [&](const auto& v) -> void* {
    if (v.empty()) return nullptr;
    u.bufs.push_back(upload(v));
    return u.bufs.back().get();
  };
  u.view.w13 = put(q13.data);
  u.view.w13_scale = put(q13.scale);
  u.view.w13_global = static_cast<const float*>(put(q13.global));
  u.view.w2 = put(q2.data);
  u.view.w2_scale = put(q2.scale);
  u.view.w2_global = static_cast<const float*>(put(q2.global));
  return u;
}
#endif

void run(const Opts& o) {
  const auto f = ds::SafetensorsFile::open(o.in);
  const F32 x = read_f32(*f, "x"), w1 = read_f32(*f, "experts.w1"), w3 = read_f32(*f, "experts.w3"),
            w2 = read_f32(*f, "experts.w2");
  CHECK(x.dims.size() == 2 && w1.dims.size() == 3, "op-moe: x must be [T, D] and experts.w1 [E, I, D]");
  const int T = static_cast<int>(x.dims[0]), D = static_cast<int>(x.dims[1]);
  const int E = static_cast<int>(w1.dims[0]), I = static_cast<int>(w1.dims[1]);
  CHECK(w1.dims[2] == D && w3.dims == w1.dims && w2.dims == (std::vector<int64_t>{E, D, I}),
        "op-moe: expert shapes do not match x [T, {}]", D);
  const bool separated = f->has("topk_ids");
  ds::moe::RouterParams r;
  r.E = E;
  r.topk = separated ? static_cast<int>(f->info("topk_ids").shape.at(1)) : std::stoi(meta(*f, "top_k", "0"));
  r.routed_scaling_factor = std::stof(meta(*f, "routed_scaling_factor", "1"));
  r.num_expert_group = std::stoi(meta(*f, "num_expert_group", "1"));
  r.topk_group = std::stoi(meta(*f, "topk_group", "1"));
  r.renormalize = meta(*f, "renormalize", "1") != "0";
  r.hf_biased_weights = meta(*f, "hf_biased_weights", "0") != "0";
  std::vector<int32_t> ids(static_cast<size_t>(T) * r.topk);
  std::vector<float> tw(ids.size()), out(static_cast<size_t>(T) * D);
  F32 gate, bias, res, sg, su, sd;
  if (separated) {
    const F32 fi = read_f32(*f, "topk_ids");
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(fi.v.at(i));
    tw = read_f32(*f, "topk_weights").v;
  } else {
    gate = read_f32(*f, "gate.weight");
    if (f->has("gate.e_score_correction_bias")) bias = read_f32(*f, "gate.e_score_correction_bias");
  }
  const bool shared = f->has("shared.gate_proj");
  if (shared) {
    sg = read_f32(*f, "shared.gate_proj");
    su = read_f32(*f, "shared.up_proj");
    sd = read_f32(*f, "shared.down_proj");
    CHECK(sg.dims == (std::vector<int64_t>{I, D}), "op-moe: the shared expert must have the routed experts' I");
  }
  if (f->has("residual")) res = read_f32(*f, "residual");

  if (o.device == "cpu") {
    ds::moe::MoeArgs a;
    a.x = x.v.data();
    a.T = T;
    a.D = D;
    a.I = I;
    a.router = r;
    a.gate_w = separated ? nullptr : gate.v.data();
    a.bias = bias.v.empty() ? nullptr : bias.v.data();
    a.topk_ids = ids.data();
    a.topk_weights = tw.data();
    a.w1 = w1.v.data();
    a.w3 = w3.v.data();
    a.w2 = w2.v.data();
    a.shared_I = shared ? I : 0;
    a.shared_gate = shared ? sg.v.data() : nullptr;
    a.shared_up = shared ? su.v.data() : nullptr;
    a.shared_down = shared ? sd.v.data() : nullptr;
    a.residual = res.v.empty() ? nullptr : res.v.data();
    a.out = out.data();
    ds::moe::moe_ref(a);
  } else if (o.device == "cuda") {
#ifdef DELTASERVE_WITH_CUDA
    using namespace ds::moe;
    MoeParams p;
    p.D = D;
    p.I = I;
    p.router = r;
    p.max_tokens = std::max(T, 1);
    p.weight_format = parse_weights(o.weights);
    p.act_format = parse_acts(o.acts, p.weight_format);
    p.routing = separated ? RoutingMode::kSeparated : RoutingMode::kInKernel;
    p.has_shared = shared;
    p.arch = ds::cuda_device_arch();
    // A few tokens (4 with bf16 experts, 8 with FP8) on the default path take the gemv decode, which reads FP8
    // experts against bf16 activations: an activation format asked for by name is honoured instead (the stream
    // path quantises as asked).
    p.gemv_decode = o.acts == "auto" || p.act_format == ActFormat::kBF16;
    if (o.path == "stream") p.force_path = GemmPath::kStream;
    if (o.path == "wgmma") p.force_path = GemmPath::kWgmma;
    if (o.path == "gemv") p.force_path = GemmPath::kGemv;
    if (auto why = moe_unsupported(p)) DS_THROW("op-moe: {}", *why);
    if (p.force_path == GemmPath::kGemv && (T < 1 || T > ds::moe::kGemvTokenLimit))  // and the slots (moe_forward)
      DS_THROW("op-moe: --path gemv runs 1 to {} tokens, the input has {}", ds::moe::kGemvTokenLimit, T);
    const Uploaded ex = upload_experts(w1.v, w3.v, w2.v, E, D, I, p.weight_format);
    const Uploaded sh = shared ? upload_experts(sg.v, su.v, sd.v, 1, D, I, p.weight_format) : Uploaded{};
    ds::DeviceBuffer dx = upload(ds::f32_to_bf16(x.v)), dres = upload(ds::f32_to_bf16(res.v)), dgate = upload(ds::f32_to_bf16(gate.v)),
                     dbias = upload(bias.v), dids = upload(ids), dtw = upload(tw),
                     dout(static_cast<size_t>(T) * D * 2 + 16), ws(moe_workspace_bytes(p));
    p.T = T;
    p.x = dx.get<ds::bf16_t>();
    p.gate_w = separated ? nullptr : dgate.get<ds::bf16_t>();
    p.gate_bias = bias.v.empty() ? nullptr : dbias.get<float>();
    p.topk_ids_in = separated ? dids.get<int32_t>() : nullptr;
    p.topk_weights_in = separated ? dtw.get<float>() : nullptr;
    p.topk_ids_out = separated ? nullptr : dids.get<int32_t>();
    p.topk_weights_out = separated ? nullptr : dtw.get<float>();
    p.experts = ex.view;
    p.shared = sh.view;
    p.residual = res.v.empty() ? nullptr : dres.get<ds::bf16_t>();
    p.out = dout.get<ds::bf16_t>();
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    moe_forward(p);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> ob(out.size());
    CUDA_CHECK(cudaMemcpy(ob.data(), dout.get(), ob.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < ob.size(); ++i) out[i] = ds::bf16_to_f32(ob[i]);
    CUDA_CHECK(cudaMemcpy(ids.data(), dids.get(), ids.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(tw.data(), dtw.get(), tw.size() * 4, cudaMemcpyDeviceToHost));
#else
    DS_THROW("op-moe: --device cuda, but deltaserve was built without CUDA");
#endif
  } else {
    DS_THROW("op-moe: --device must be cpu or cuda, got '{}'", o.device);
  }
  const int64_t K = r.topk;
  ds::write_safetensors(o.out, {{"out", ds::TensorView(out.data(), DType::kF32, {T, D})},
                                {"topk_ids", ds::TensorView(ids.data(), DType::kI32, {T, K})},
                                {"topk_weights", ds::TensorView(tw.data(), DType::kF32, {T, K})}});
  std::printf("op-moe: T=%d D=%d I=%d E=%d top-k=%d (%s routing%s) on %s -> %s\n", T, D, I, E, r.topk,
              separated ? "separated" : "in-op", shared ? ", shared expert" : "", o.device.c_str(), o.out.c_str());
}

void setup(CLI::App& app) {
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("op-moe", "Run one MoE block (router, experts, finalize) on safetensors inputs");
  cmd->add_option("--in", opts->in, "input safetensors (see src/app/cmd_op_moe.cpp for the tensor names)")->required();
  cmd->add_option("--out", opts->out, "output safetensors: out, topk_ids, topk_weights")->required();
  cmd->add_option("--device", opts->device, "cpu (fp32 reference) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--weights", opts->weights, "cuda expert weight format: bf16, fp8-block, mxfp8, mxfp4, nvfp4");
  cmd->add_option("--acts", opts->acts,
                  "cuda activation format: auto, bf16, fp8-1x128, mxfp8-1x32 (auto: the weights' pair; at up to 4 "
                  "tokens (bf16) or 8 (fp8-block) the experts then run the gemv decode with bf16 activations)");
  cmd->add_option("--path", opts->path,
                  "cuda expert GEMM path: auto (the op's heuristic), stream, wgmma, gemv (T = 1 to 32)")
      ->check(CLI::IsMember({"auto", "stream", "wgmma", "gemv"}));
  cmd->callback([opts] { run(*opts); });
}

}  // namespace

DS_REGISTER_COMMAND(60, setup);
