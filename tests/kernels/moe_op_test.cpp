// The MoE op on the GPU against the CPU references, for every weight format, both GEMM paths, both routing
// modes and token counts 1, 3, 17, 1000; the deferred-finalize regression (deferred outputs + external
// finalize == fused, bitwise; separated routing returns the caller's weights); expert parallelism (dropped
// routes), empty experts, all tokens on one expert, partial tiles, CUDA-graph capture. Workspace and outputs
// are poisoned before every run (two different patterns where results are compared bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <tuple>

#include "../test_util.h"
#include "kernels/norm/norm.h"
#include "kernels/norm/norm_ref.h"
#include "kernels/moe/moe_kernels.h"
#include "moe_test_common.h"

#ifdef DELTASERVE_WITH_CUDA

namespace ds::moe {
namespace {

using test::download;
using test::upload;

struct Case {
  int T = 1, D = 256, I = 256, E = 32, TOPK = 4;
  int begin = 0, end = -1;
  WeightFormat wf = WeightFormat::kBF16;
  ActFormat af = ActFormat::kBF16;
  bool shared = true;
  int EL() const { return (end < 0 ? E : end) - begin; }
  std::string name() const {
    return std::string(weight_format_name(wf)) + "/" + act_format_name(af) + " T=" + std::to_string(T) + " D=" +
           std::to_string(D) + " I=" + std::to_string(I) + " E=" + std::to_string(E) + " k=" + std::to_string(TOPK) +
           (begin != 0 || end >= 0 ? " local=[" + std::to_string(begin) + "," + std::to_string(end) + ")" : "");
  }
};

// Inputs of one setup, on host (fp32 of the bf16 values) and device.
struct Data {
  Case s;
  std::vector<float> x, gate, bias, residual;
  DeviceBuffer dx, dgate, dbias, dres;
  test::GpuExperts experts, shared;
  explicit Data(const Case& st, uint64_t seed = 1) : s(st) {
    auto bf = [](std::vector<float> v) {
      for (auto& f : v) f = round_bf16(f);
      return v;
    };
    x = bf(ds::test::randn(static_cast<size_t>(s.T) * s.D, seed, 1.0f));
    gate = bf(ds::test::randn(static_cast<size_t>(s.E) * s.D, seed + 1, 1.0f / std::sqrt(static_cast<float>(s.D))));
    bias = ds::test::randn(s.E, seed + 2, 0.05f);
    residual = bf(ds::test::randn(static_cast<size_t>(s.T) * s.D, seed + 3, 1.0f));
    dx = upload(f32_to_bf16(x));
    dgate = upload(f32_to_bf16(gate));
    dbias = upload(bias);
    dres = upload(f32_to_bf16(residual));
    experts = test::make_experts(s.EL(), s.D, s.I, s.wf, seed + 10);
    if (s.shared) shared = test::make_experts(1, s.D, s.I, s.wf, seed + 20);
  }
  MoeParams params(RoutingMode mode, bool deferred, GemmPath path) const {
    MoeParams p;
    p.D = s.D;
    p.I = s.I;
    p.router = RouterParams{.E = s.E, .topk = s.TOPK, .routed_scaling_factor = 2.446f};
    p.expert_begin = s.begin;
    p.expert_end = s.end;
    p.max_tokens = s.T + 5;  // the workspace is sized for more tokens than this call has
    p.weight_format = s.wf;
    p.act_format = s.af;
    p.routing = mode;
    p.do_finalize = !deferred;
    p.has_shared = s.shared;
    p.force_path = path;
    p.fuse_decode = true;  // every check runs the fused decode; check_setup repeats the stream path with it off
    p.T = s.T;
    p.x = dx.get<bf16_t>();
    p.gate_w = dgate.get<bf16_t>();
    p.gate_bias = dbias.get<float>();
    p.experts = experts.view();
    if (s.shared) p.shared = shared.view();
    p.residual = dres.get<bf16_t>();
    return p;
  }
};

// CPU reference of y[t, k], the shared expert and the fused output, for the routes the GPU used.
struct Ref {
  std::vector<float> y, shared, out;
  std::vector<int32_t> e2p;
};
// `act`: the activation format of the quantisation points (the gemv decode reads FP8 weights with bf16 ones).
Ref reference(const Data& d, const std::vector<int32_t>& ids, const std::vector<float>& w,
              std::optional<ActFormat> act = std::nullopt) {
  const Case& s = d.s;
  Ref r;
  r.y.resize(static_cast<size_t>(s.T) * s.TOPK * s.D);
  r.shared.assign(static_cast<size_t>(s.T) * s.D, 0.0f);
  QuantExpertArgs a;
  a.x = d.x.data();
  a.topk_ids = ids.data();
  a.T = s.T;
  a.D = s.D;
  a.I = s.I;
  a.TOPK = s.TOPK;
  a.expert_begin = s.begin;
  a.EL = s.EL();
  a.w13 = d.experts.w13f.data();
  a.w2 = d.experts.w2f.data();
  if (s.shared) {
    a.shared_w13 = d.shared.w13f.data();
    a.shared_w2 = d.shared.w2f.data();
  }
  a.act = act.value_or(s.af);
  a.expert_out = r.y.data();
  a.shared_out = r.shared.data();
  experts_quant_ref(a);
  r.out.resize(static_cast<size_t>(s.T) * s.D);
  // Routes outside the local range contribute nothing (their y rows are zero): finalize_ref sees valid ids.
  finalize_ref({r.y.data(), ids.data(), w.data(), s.shared ? r.shared.data() : nullptr, d.residual.data(), s.T, s.D,
                s.TOPK, r.out.data()});
  r.e2p.resize(ids.size());
  dispatch_ref(ids.data(), s.T, s.TOPK, s.begin, s.EL(), s.shared, r.e2p.data(), nullptr);
  return r;
}

double tol_for(ActFormat a) { return a == ActFormat::kBF16 ? 5e-3 : 1e-2; }

// External finalize of deferred outputs (copied back to the device bit for bit).
std::vector<uint16_t> external_finalize(const Data& d, const test::OpOutputs& o) {
  const Case& s = d.s;
  DeviceBuffer y = upload(o.expert_out_bits), m = upload(o.e2p), w = upload(o.weights),
               sh = s.shared ? upload(o.shared_out_bits) : DeviceBuffer(), out(static_cast<size_t>(s.T) * s.D * 2);
  CUDA_CHECK(cudaMemset(out.get(), 0x7f, out.bytes()));
  FinalizeParams f;
  f.expert_out = MoeTensor(y.get(), DType::kBF16, s.T, s.TOPK, s.D);
  f.expanded_to_permuted = MoeTensor(m.get(), DType::kI32, static_cast<int64_t>(s.T) * s.TOPK);
  f.topk_weights = MoeTensor(w.get(), DType::kF32, s.T, s.TOPK);
  if (s.shared) f.shared_out = MoeTensor(sh.get(), DType::kBF16, s.T, s.D);
  f.residual = MoeTensor(d.dres.get(), DType::kBF16, s.T, s.D);
  f.out = MoeTensor(out.get(), DType::kBF16, s.T, s.D);
  moe_finalize(f);
  CUDA_CHECK(cudaDeviceSynchronize());
  return download<uint16_t>(out.get(), static_cast<size_t>(s.T) * s.D);
}

std::vector<GemmPath> paths_for(WeightFormat w) {
  if (w == WeightFormat::kBF16 || w == WeightFormat::kFP8Block) return {GemmPath::kStream, GemmPath::kWgmma};
  return {GemmPath::kStream};
}

// Everything about one setup: routing, dispatch, experts and finalize vs the references on every path, and
// the deferred / separated contracts bitwise.
void check_setup(const Case& s, const std::vector<int32_t>* forced_ids = nullptr) {
  SCOPED_TRACE(s.name());
  Data d(s);
  const size_t R = static_cast<size_t>(s.T) * s.TOPK;
  // Caller-side routing for separated mode: the router's own result (or forced ids with random weights).
  std::vector<int32_t> ids;
  std::vector<float> w;
  test::OpOutputs routed;
  if (forced_ids) {
    ids = *forced_ids;
    w = ds::test::randu(R, 3, 0.1f, 1.0f);
  } else {
    routed = test::run_op(d.params(RoutingMode::kInKernel, true, paths_for(s.wf)[0]), 0x7f);
    ids = routed.ids;
    w = routed.weights;
    std::vector<float> logits(static_cast<size_t>(s.T) * s.E);
    for (int t = 0; t < s.T; ++t)
      for (int e = 0; e < s.E; ++e) {
        double acc = 0;
        for (int k = 0; k < s.D; ++k) acc += static_cast<double>(d.x[t * s.D + k]) * d.gate[e * s.D + k];
        logits[static_cast<size_t>(t) * s.E + e] = static_cast<float>(acc);
      }
    test::expect_same_routes({ids, w}, logits, &d.bias, s.T, d.params(RoutingMode::kInKernel, true, GemmPath::kStream).router,
                             "in-kernel routing");
  }
  const Ref ref = reference(d, ids, w);
  DeviceBuffer dids = upload(ids), dw = upload(w);

  for (GemmPath path : paths_for(s.wf)) {
    SCOPED_TRACE(gemm_path_name(path));
    const std::string tag = s.name() + " " + gemm_path_name(path);
    // Separated, deferred: the caller's weights come back (same buffer), the map and y match the references.
    MoeParams ps = d.params(RoutingMode::kSeparated, true, path);
    ps.topk_ids_in = dids.get<int32_t>();
    ps.topk_weights_in = dw.get<float>();
    const test::OpOutputs sd = test::run_op(ps, 0xff);
    EXPECT_EQ(sd.res.path, path);
    EXPECT_EQ(sd.res.topk_weights.data, static_cast<void*>(dw.get())) << "separated routing must return the caller's weights";
    EXPECT_EQ(sd.res.topk_weights.dtype, DType::kF32);
    EXPECT_EQ(sd.res.topk_weights.ndim, 2);
    EXPECT_EQ(sd.res.topk_weights.shape[1], s.TOPK);
    EXPECT_EQ(sd.res.expert_out.dtype, DType::kBF16);
    EXPECT_EQ(sd.res.expert_out.ndim, 3);
    EXPECT_EQ(sd.res.expert_out.shape[0] * sd.res.expert_out.shape[1] * sd.res.expert_out.shape[2],
              static_cast<int64_t>(R) * s.D);
    EXPECT_EQ(std::memcmp(sd.weights.data(), w.data(), R * 4), 0) << "returned weights differ bitwise";
    EXPECT_EQ(sd.ids, ids);
    EXPECT_EQ(sd.e2p, ref.e2p) << "expanded_to_permuted";
    EXPECT_CLOSE("y " + tag, sd.expert_out, ref.y, tol_for(s.af));
    for (size_t r = 0; r < R; ++r) {
      if (ref.e2p[r] >= 0) continue;
      for (int c = 0; c < s.D; ++c) ASSERT_EQ(sd.expert_out_bits[r * s.D + c], 0) << "dropped route row " << r;
    }
    if (s.shared) EXPECT_CLOSE("shared " + tag, sd.shared_out, ref.shared, tol_for(s.af));

    // Separated, fused: vs the reference, and bitwise equal to deferred + external finalize.
    MoeParams pf = ps;
    pf.do_finalize = true;
    const test::OpOutputs sf = test::run_op(pf, 0x7f);
    EXPECT_CLOSE("out " + tag, sf.out, ref.out, tol_for(s.af));
    EXPECT_EQ(external_finalize(d, sd), sf.out_bits) << "deferred + external finalize != fused (separated)";
    if (path == GemmPath::kStream) {
      // The separate dispatch / finalize kernels (fuse_decode = false) give the same bits as the fused decode
      // (which the calls above take when T * TOPK <= 512).
      MoeParams pu = ps;
      pu.fuse_decode = false;
      const test::OpOutputs ud = test::run_op(pu, 0x33);
      EXPECT_EQ(ud.e2p, sd.e2p) << "expanded_to_permuted, fuse_decode off vs on";
      EXPECT_EQ(ud.expert_out_bits, sd.expert_out_bits) << "deferred y, fuse_decode off vs on";
      if (s.shared) {
        EXPECT_EQ(ud.shared_out_bits, sd.shared_out_bits) << "shared y, fuse_decode off vs on";
      }
      pu.do_finalize = true;
      EXPECT_EQ(test::run_op(pu, 0x33).out_bits, sf.out_bits) << "fused finalize, fuse_decode off vs on";
      // Every other token-tile count (MoeParams::stream_token_tiles): a group larger than one pass takes several,
      // and each token's products and sums stay the same, so the same bits.
      for (const int tiles : {1, 2, 4, 8}) {
        if (tiles == moe_stream_token_tiles(s.T, ps)) continue;
        MoeParams pt = ps;
        pt.stream_token_tiles = tiles;
        const test::OpOutputs td = test::run_op(pt, 0x44);
        EXPECT_EQ(td.expert_out_bits, sd.expert_out_bits) << "deferred y, " << tiles << " token tiles vs the default";
        if (s.shared) {
          EXPECT_EQ(td.shared_out_bits, sd.shared_out_bits) << "shared y, " << tiles << " token tiles vs the default";
        }
      }
    }
    if (path == GemmPath::kWgmma && s.wf == WeightFormat::kFP8Block) {
      // The other FP8 tile height (64 rows, every thread loading; 128 rows, warp-specialised with TMA weight
      // tiles): the same products in the same order, so the same bits.
      MoeParams pt = ps;
      pt.fp8_prefill_tile_m = moe_fp8_prefill_tile_m(s.T, ps) == 128 ? 64 : 128;
      // It also records the bench's GEMM events (MoeParams::gemm_begin / gemm_end): same bits, and the two events
      // bracket a positive time.
      cudaEvent_t ev[2];
      for (auto& e : ev) ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
      pt.gemm_begin = ev[0];
      pt.gemm_end = ev[1];
      const test::OpOutputs td = test::run_op(pt, 0x33);
      float ms = -1.0f;
      EXPECT_EQ(cudaEventElapsedTime(&ms, ev[0], ev[1]), cudaSuccess);
      EXPECT_GT(ms, 0.0f) << "the GEMM events";
      for (auto& e : ev) cudaEventDestroy(e);
      EXPECT_EQ(td.expert_out_bits, sd.expert_out_bits) << "deferred y, FP8 tiles of " << pt.fp8_prefill_tile_m
                                                        << " rows vs the default";
      if (s.shared) {
        EXPECT_EQ(td.shared_out_bits, sd.shared_out_bits) << "shared y, FP8 tiles of " << pt.fp8_prefill_tile_m
                                                          << " rows vs the default";
      }
    }
    if (forced_ids) continue;

    // In-kernel routing: fused == separated with the same routes; deferred + external finalize == fused.
    const test::OpOutputs kf = test::run_op(d.params(RoutingMode::kInKernel, false, path), 0xff);
    EXPECT_EQ(kf.ids, ids);
    EXPECT_EQ(std::memcmp(kf.weights.data(), w.data(), R * 4), 0) << "routing is not deterministic";
    EXPECT_EQ(kf.out_bits, sf.out_bits) << "in-kernel and separated routing differ";
    const test::OpOutputs kd = test::run_op(d.params(RoutingMode::kInKernel, true, path), 0x55);
    EXPECT_EQ(kd.expert_out_bits, sd.expert_out_bits);
    EXPECT_EQ(external_finalize(d, kd), kf.out_bits) << "deferred + external finalize != fused (in-kernel)";
  }
}

const std::pair<WeightFormat, ActFormat> kFormats[] = {
    {WeightFormat::kBF16, ActFormat::kBF16},   {WeightFormat::kFP8Block, ActFormat::kFP8Block},
    {WeightFormat::kMXFP8, ActFormat::kMXFP8}, {WeightFormat::kMXFP4, ActFormat::kBF16},
    {WeightFormat::kNVFP4, ActFormat::kBF16},  {WeightFormat::kNVFP4, ActFormat::kFP8Block}};

TEST(MoeOpGpu, EveryFormatPathRoutingModeAndTokenCount) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : kFormats)
    for (int T : {1, 3, 17, 1000}) {
      Case s;
      s.T = T;
      s.wf = wf;
      s.af = af;
      check_setup(s);
    }
}

// Fused decode (T * TOPK <= 512 routes) at and around its bound, top-8 as in Kimi.
TEST(MoeOpGpu, FusedDecodeRouteBound) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1]})
    for (int T : {64, 65}) {
      Case s;
      s.T = T;
      s.TOPK = 8;
      s.wf = wf;
      s.af = af;
      check_setup(s);
    }
}

TEST(MoeOpGpu, ExpertParallelDropsForeignRoutes) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1], kFormats[3]})
    for (int T : {17, 1000}) {  // T = 1000, top-8: 8000 routes take the multi-CTA dispatch
      Case s;
      s.T = T;
      s.TOPK = 8;
      s.begin = 8;
      s.end = 24;
      s.wf = wf;
      s.af = af;
      s.shared = T == 17;
      check_setup(s);
    }
}

TEST(MoeOpGpu, AllTokensOnFewExpertsOthersEmpty) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1], kFormats[5]})
    for (int T : {3, 1000}) {
      Case s;
      s.T = T;
      s.wf = wf;
      s.af = af;
      std::vector<int32_t> ids(static_cast<size_t>(T) * s.TOPK);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < s.TOPK; ++k) ids[t * s.TOPK + k] = 31 - k;  // experts 28..31, every token
      check_setup(s, &ids);
    }
}

// Expert parallelism without a shared expert: token 0 has no local route at all (its output is the residual
// alone), token 1 a mix, token 2 only local routes; T = 3 takes the fused decode.
TEST(MoeOpGpu, ExpertParallelTokenWithoutLocalRoutes) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1]}) {
    Case s;
    s.T = 3;
    s.begin = 8;
    s.end = 24;
    s.shared = false;
    s.wf = wf;
    s.af = af;
    const std::vector<int32_t> ids = {0, 1, 2, 31, 3, 9, 30, 23, 8, 9, 10, 23};
    check_setup(s, &ids);
  }
}

TEST(MoeOpGpu, PartialTilesAndLargerShape) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1], kFormats[3], kFormats[4]}) {
    Case s;  // D = 1152: GEMM2's last 256-wide N tile is half empty; I = 384: three h blocks
    s.T = 150;
    s.D = 1152;
    s.I = 384;
    s.E = 16;
    s.TOPK = 6;
    s.wf = wf;
    s.af = af;
    check_setup(s);
  }
}

// More prefill tiles than CTAs (132 on an H100/H200), so a CTA runs several: the wgmma kernels' per-tile state
// (copy sources, stage ring, the FP8 scale ring) must be rebuilt at every tile (GEMM1 with 9 K steps, GEMM2 with
// 4, as many as the FP8 kernel keeps in flight), and GEMM2's last 256-wide N tile is half empty. GEMM1 ~192
// tiles, GEMM2 ~240.
TEST(MoeOpGpu, PrefillTilesOutnumberTheCtas) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1]}) {
    Case s;
    s.T = 1000;
    s.D = 1152;
    s.I = 512;
    s.E = 8;
    s.TOPK = 2;
    s.wf = wf;
    s.af = af;
    check_setup(s);
  }
  // The FP8 kernel with 128-row tiles (the default here: 800 rows per expert) has half as many: T = 1600, top-4,
  // D = 640 (the last N tile half empty), I = 256 give it ~138 GEMM1 and ~207 GEMM2 tiles; its producer's stage
  // ring runs on across tiles.
  Case s;
  s.T = 1600;
  s.D = 640;
  s.I = 256;
  s.E = 8;
  s.TOPK = 4;
  s.wf = kFormats[1].first;
  s.af = kFormats[1].second;
  check_setup(s);
}

// The next layer's input RMSNorm fused into the one-token decode (MoeParams::norm_w, the last `down` block): out
// unchanged, norm_out bit-identical to norm::rmsnorm of that out (and close to the CPU reference), bf16 and FP8
// experts, 8 or 9 warps per block against the norm's 256 (D = 2304) or 160 (D = 1152) threads; a block too small
// for the norm's layout (4 warps at D = 2304) is not fused and leaves norm_out alone. Workspace poisoned: the
// arrival counter must be zeroed by the op itself.
TEST(MoeOpGpu, GemvDecodeFusedNorm) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af] : {kFormats[0], kFormats[1]})
    for (int D : {2304, 1152}) {
      Case base;
      base.T = 1;
      base.D = D;
      base.I = 384;
      base.wf = wf;
      base.af = af;
      base.shared = true;
      Data d(base);  // the experts once per format and width (their generation dominated this test's time)
      for (int topk : {8, 4})
        for (bool shared : {true, false}) {
          Case& s = d.s;  // params() reads the top-k and whether the generated shared expert takes part
          s.TOPK = topk;
          s.shared = shared;
          SCOPED_TRACE(s.name());
          MoeParams p = d.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
          p.force_path.reset();
          const auto nw = f32_to_bf16(ds::test::randu(D, 21, 0.5f, 1.5f));
          DeviceBuffer dnw = upload(nw), y(static_cast<size_t>(D) * 2);
          CUDA_CHECK(cudaMemset(y.get(), 0x7f, y.bytes()));
          const test::OpOutputs plain = test::run_op(p, 0x3c);
          MoeParams pn = p;
          pn.norm_w = dnw.get<bf16_t>();
          pn.norm_out = y.get<bf16_t>();
          pn.norm_eps = 1e-6f;
          const test::OpOutputs fused = test::run_op(pn, 0x3c);
          EXPECT_EQ(fused.out_bits, plain.out_bits) << "the fused norm changed out";
          const bool fits = 32 * (topk + (shared ? 1 : 0)) >= std::min(256, (D / 8 + 31) / 32 * 32);
          EXPECT_EQ(fused.res.normed, fits);
          const auto got = download<uint16_t>(y.get(), D);
          if (!fits) {
            EXPECT_EQ(got, std::vector<uint16_t>(D, 0x7f7f)) << "an unfused call wrote norm_out";
            continue;
          }
          DeviceBuffer dout = upload(plain.out_bits), ry(static_cast<size_t>(D) * 2);
          norm::rmsnorm({dout.get<bf16_t>(), D, dnw.get<bf16_t>(), ry.get<bf16_t>(), 1, D, 1e-6f}, nullptr);
          CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(got, download<uint16_t>(ry.get(), D)) << "fused norm vs norm::rmsnorm";
          std::vector<float> ref(D), wf32(D);
          for (int i = 0; i < D; ++i) wf32[i] = bf16_to_f32(nw[i]);
          norm::rmsnorm_ref(plain.out.data(), wf32.data(), 1, D, 1e-6f, ref.data());
          std::vector<float> gotf(D);
          for (int i = 0; i < D; ++i) gotf[i] = bf16_to_f32(got[i]);
          EXPECT_CLOSE("fused norm vs rmsnorm_ref " + s.name(), gotf, ref, 5e-3);
        }
    }
}

// The layer boundary in the router kernel (MoeParams::pre_norm_w): against norm::add_rmsnorm followed by the op,
// bitwise: the op's output, the routes, x (written by the router's first CTA), the new residual, and the old
// residual and the added row untouched; x and the new residual poisoned beforehand. bf16 and FP8 experts, the Kimi
// width (D 2304: 256 norm threads, some with two vectors), a narrow one (D 256: 32 threads of the CTA's 256), a
// shared expert or not. Refused with a reason off the one-token gemv path and for aliasing buffers.
TEST(MoeOpGpu, GemvDecodePreNormEqualsAddNormThenOp) {
  SKIP_WITHOUT_GPU();
  int compared = 0;
  for (auto [wf, af] : {kFormats[0], kFormats[1]})
    for (int D : {2304, 256}) {
      Case base;
      base.T = 1;
      base.D = D;
      base.I = 256;
      base.E = 64;
      base.TOPK = 8;
      base.wf = wf;
      base.af = af;
      base.shared = true;
      Data d(base);  // the experts once per format and width
      for (bool shared : {true, false}) {
        d.s.shared = shared;  // params() reads whether the generated shared expert takes part
        const Case& c = d.s;
        SCOPED_TRACE(c.name());
        const auto add = f32_to_bf16(ds::test::randn(D, 31 + D, 1.0f));
        const auto res = f32_to_bf16(ds::test::randn(D, 32 + D, 4.0f));
        const auto nw = f32_to_bf16(ds::test::randu(D, 33, 0.5f, 1.5f));
        DeviceBuffer dadd = upload(add), dres = upload(res), dnw = upload(nw);
        // Reference: the boundary kernel, then the op on its x with its residual.
        DeviceBuffer rres = upload(res), rx(static_cast<size_t>(D) * 2);
        norm::add_rmsnorm({dadd.get<bf16_t>(), rres.get<bf16_t>(), dnw.get<bf16_t>(), rx.get<bf16_t>(), 1, D, 1e-6f},
                          nullptr);
        MoeParams p = d.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
        p.force_path.reset();
        p.x = rx.get<bf16_t>();
        p.residual = rres.get<bf16_t>();
        const test::OpOutputs ref = test::run_op(p, 0x3c);
        ASSERT_EQ(ref.res.path, GemmPath::kGemv);
        // Fused: x and the new residual start poisoned.
        DeviceBuffer fx(static_cast<size_t>(D) * 2), fres(static_cast<size_t>(D) * 2);
        CUDA_CHECK(cudaMemset(fx.get(), 0xff, fx.bytes()));
        CUDA_CHECK(cudaMemset(fres.get(), 0xff, fres.bytes()));
        MoeParams pf = p;
        pf.x = fx.get<bf16_t>();
        pf.residual = fres.get<bf16_t>();
        pf.pre_norm_w = dnw.get<bf16_t>();
        pf.pre_add = dadd.get<bf16_t>();
        pf.pre_residual = dres.get<bf16_t>();
        pf.pre_residual_out = fres.get<bf16_t>();
        pf.pre_out = fx.get<bf16_t>();
        pf.pre_eps = 1e-6f;
        ASSERT_FALSE(moe_pre_norm_unsupported(pf).has_value()) << *moe_pre_norm_unsupported(pf);
        const test::OpOutputs got = test::run_op(pf, 0x5a);
        const int64_t differ = ds::test::count_differing(ref.out_bits, got.out_bits);
        const int64_t dx = ds::test::count_differing(download<uint16_t>(fx.get(), D), download<uint16_t>(rx.get(), D));
        const int64_t dr =
            ds::test::count_differing(download<uint16_t>(fres.get(), D), download<uint16_t>(rres.get(), D));
        std::printf("[err] MoE pre-norm %s: bits differing out %lld, x %lld, residual %lld of %d\n", c.name().c_str(),
                    static_cast<long long>(differ), static_cast<long long>(dx), static_cast<long long>(dr), D);
        EXPECT_EQ(differ + dx + dr, 0);
        EXPECT_EQ(got.ids, ref.ids);
        EXPECT_EQ(got.weights, ref.weights);
        EXPECT_EQ(download<uint16_t>(dres.get(), D), res) << "the old residual must stay as it was";
        EXPECT_EQ(download<uint16_t>(dadd.get(), D), add);
        ++compared;
        // Refusals, before any launch.
        MoeParams q = pf;
        q.T = 2;
        EXPECT_TRUE(moe_pre_norm_unsupported(q).has_value());
        q = pf;
        q.pre_residual_out = dres.get<bf16_t>();  // the residual every CTA reads
        q.residual = dres.get<bf16_t>();
        EXPECT_TRUE(moe_pre_norm_unsupported(q).has_value());
        q = pf;
        q.pre_out = rx.get<bf16_t>();  // not the op's x
        EXPECT_TRUE(moe_pre_norm_unsupported(q).has_value());
        q = pf;
        q.routing = RoutingMode::kSeparated;
        EXPECT_TRUE(moe_pre_norm_unsupported(q).has_value());
      }
    }
  EXPECT_EQ(compared, 8);
}

// The variants of the gemv path's `down` kernel against the blocks streaming their rows after the PDL wait,
// bitwise: out and the returned map, bf16 and FP8 weights, every chunks-per-lane instantiation (1, 2, 4), the Kimi
// shape (D 2304, I 1024, top-8 + shared), expert parallelism with dropped routes and no shared expert, top-16.
// - preload (MoeParams::gemv_down_preload, the default): the same blocks load their rows into registers before
//   the wait; also with blocks of four rows (gemv_down_rows = 4): each row's sum is the same lanes' in the same order;
// - persistent (MoeParams::gemv_down_persistent): one wave of blocks looping over row pairs, the next pair's
//   weights loaded ahead.
// Shapes a variant cannot run keep the streaming kernel. One test: each case's experts are generated once.
TEST(MoeOpGpu, GemvDecodeDownVariantsEqualStreaming) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<const char*, std::function<void(MoeParams&)>>> variants = {
      {"preloaded down", [](MoeParams& p) { p.gemv_down_preload = true; }},
      {"preloaded down, 4 rows", [](MoeParams& p) {
         p.gemv_down_preload = true;
         p.gemv_down_rows = 4;
       }},
      {"persistent down", [](MoeParams& p) { p.gemv_down_persistent = true; }}};
  int compared = 0;
  for (auto [wf, af] : {kFormats[0], kFormats[1]}) {
    const bool fp8 = wf != WeightFormat::kBF16;
    std::vector<Case> cases;
    for (auto [D, I] : {std::pair{2304, 1024}, std::pair{1152, 512}, std::pair{256, 2048}, std::pair{384, 256}}) {
      Case c;
      c.T = 1;
      c.D = D;
      c.I = I;
      c.E = 32;  // the gemv kernels touch TOPK + 1 experts; more only cost CPU time generating them (was 64)
      c.TOPK = 8;
      c.wf = wf;
      c.af = af;
      cases.push_back(c);
    }
    Case ep = cases[0];  // expert parallelism: dropped routes, no shared expert
    ep.begin = 8;
    ep.end = 20;
    ep.shared = false;
    cases.push_back(ep);
    Case wide = cases[1];  // top-16: 17 slots per block
    wide.TOPK = 16;
    cases.push_back(wide);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name());
      Data d(c);
      MoeParams p = d.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
      p.force_path.reset();
      p.gemv_down_preload = false;
      DeviceBuffer map(static_cast<size_t>(c.TOPK) * 4);
      p.expanded_to_permuted = map.get<int32_t>();
      CUDA_CHECK(cudaMemset(map.get(), 0x7f, map.bytes()));
      const test::OpOutputs plain = test::run_op(p, 0x3c);
      const auto map_plain = download<int32_t>(map.get(), c.TOPK);
      ASSERT_EQ(plain.res.path, GemmPath::kGemv);
      const bool applies = moe::detail::gemv_down_persistent_applies(fp8, c.D, c.I);  // both variants' rule
      for (const auto& [what, set] : variants) {
        MoeParams pv = p;
        set(pv);
        CUDA_CHECK(cudaMemset(map.get(), 0x7f, map.bytes()));
        const test::OpOutputs var = test::run_op(pv, 0x5a);
        const int64_t differ = ds::test::count_differing(plain.out_bits, var.out_bits);
        std::printf("[err] %s %s (%s): %lld of %zu outputs differ in their bits\n", what, c.name().c_str(),
                    applies ? "variant kernel" : "not applicable: streaming kernel", static_cast<long long>(differ),
                    plain.out_bits.size());
        EXPECT_EQ(differ, 0) << what;
        EXPECT_EQ(var.ids, plain.ids) << what;
        EXPECT_EQ(download<int32_t>(map.get(), c.TOPK), map_plain) << what << ": expanded_to_permuted";
        compared += applies;
      }
    }
  }
  // (2304, 1024), (1152, 512), EP, top-16 in both formats; (256, 2048) for FP8; times the three variants
  EXPECT_EQ(compared, 3 * 10);
}

// The gemv decode tests' cases: a Kimi-like slice (D 1152, I 384, top-8 of 32) and its expert-parallel form (experts
// [8, 24) local, no shared expert), optionally with forced routes (separated routing, random weights).
struct GemvCase {
  Case s;
  std::vector<int32_t> forced;  // [T, TOPK] ids, else the router's
};
Case gemv_case(WeightFormat wf, ActFormat af, int T) {
  Case s;
  s.T = T;
  s.D = 1152;
  s.I = 384;
  s.TOPK = 8;
  s.wf = wf;
  s.af = af;
  return s;
}
Case expert_parallel(Case s) {
  s.begin = 8;
  s.end = 24;
  s.shared = false;
  return s;
}
// Every block shape moe_bench may pick computes each row in the same lanes and order: the same bits as `bits`.
void expect_same_bits_every_block_shape(const MoeParams& ps, const std::vector<uint16_t>& bits) {
  for (int uc : {2, 4})
    for (int dr : {2, 4, 8}) {
      MoeParams pv = ps;
      pv.gemv_up_cols = uc;
      pv.gemv_down_rows = dr;
      EXPECT_EQ(test::run_op(pv, 0x3c).out_bits, bits) << "block shape " << uc << " / " << dr;
    }
}
// bf16 activations only: the stream path computes the same values in another summation order.
void expect_close_to_stream(const MoeParams& ps, const test::OpOutputs& got, const Case& s) {
  if (s.af != ActFormat::kBF16) return;
  MoeParams pt = ps;
  pt.force_path = GemmPath::kStream;
  const test::OpOutputs st = test::run_op(pt, 0x55);
  EXPECT_CLOSE("gemv vs stream " + s.name(), got.out, st.out, 5e-3);
}

// The one-token decode (GemmPath::kGemv) against the reference with bf16 activations (FP8-block weights run as
// W8A16 there): the op's default at T = 1, in-kernel == separated routing bitwise, the map it returns, dropped
// routes (expert parallelism, no shared expert: a token with no local route gets the residual alone), repeated
// experts from a separated caller, top-16 (17 slots), and the stream path's result within the tolerance.
TEST(MoeOpGpu, GemvDecodeOneToken) {
  SKIP_WITHOUT_GPU();
  std::vector<GemvCase> cases;
  for (auto [wf, af] : {kFormats[0], kFormats[1]}) {
    const Case s = gemv_case(wf, af, 1);
    cases.push_back({s, {}});
    const Case ep = expert_parallel(s);
    cases.push_back({ep, {}});
    cases.push_back({ep, {0, 1, 2, 3, 4, 5, 30, 31}});         // no local route at all
    cases.push_back({ep, {9, 30, 9, 23, 8, 0, 23, 12}});       // repeats, drops, unsorted
    Case wide = s;  // top-16 of 64 experts: 17 slots per block
    wide.E = 64;
    wide.TOPK = 16;
    wide.D = 256;
    wide.I = 128;
    cases.push_back({wide, {}});
  }
  for (const GemvCase& gc : cases) {
    const Case& s = gc.s;
    SCOPED_TRACE(s.name() + (gc.forced.empty() ? "" : " forced ids"));
    Data d(s);
    DeviceBuffer map(static_cast<size_t>(s.TOPK) * 4);
    std::vector<int32_t> ids = gc.forced;
    std::vector<float> w;
    test::OpOutputs kf;
    if (ids.empty()) {
      MoeParams pk = d.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
      pk.force_path.reset();  // the default choice at T = 1
      pk.expanded_to_permuted = map.get<int32_t>();
      kf = test::run_op(pk, 0xff);
      EXPECT_EQ(kf.res.path, GemmPath::kGemv);
      ids = kf.ids;
      w = kf.weights;
      MoeParams pc = pk;  // routing as one cluster kernel: the same routes and output, bit for bit
      pc.cluster_route = true;
      const test::OpOutputs cf = test::run_op(pc, 0x3c);
      EXPECT_EQ(cf.ids, kf.ids) << "cluster route";
      EXPECT_EQ(cf.weights, kf.weights) << "cluster route";
      EXPECT_EQ(cf.out_bits, kf.out_bits) << "cluster route";
      DeviceBuffer counter(4);  // routing as one kernel whose last CTA selects: the same again
      CUDA_CHECK(cudaMemset(counter.get(), 0, 4));
      MoeParams pf = pk;
      pf.route_counter = counter.get<int32_t>();
      const test::OpOutputs ff = test::run_op(pf, 0x5a);
      EXPECT_EQ(ff.ids, kf.ids) << "fused route";
      EXPECT_EQ(ff.weights, kf.weights) << "fused route";
      EXPECT_EQ(ff.out_bits, kf.out_bits) << "fused route";
      EXPECT_EQ(download<int32_t>(counter.get(), 1)[0], 0) << "fused route: the counter must be re-armed";
    } else {
      w = ds::test::randu(ids.size(), 5, 0.1f, 1.0f);
    }
    const Ref ref = reference(d, ids, w, ActFormat::kBF16);
    DeviceBuffer dids = upload(ids), dw = upload(w);
    MoeParams ps = d.params(RoutingMode::kSeparated, false, GemmPath::kGemv);
    ps.topk_ids_in = dids.get<int32_t>();
    ps.topk_weights_in = dw.get<float>();
    CUDA_CHECK(cudaMemset(map.get(), 0x7f, map.bytes()));
    ps.expanded_to_permuted = map.get<int32_t>();
    const test::OpOutputs sf = test::run_op(ps, 0x7f);
    EXPECT_EQ(sf.res.path, GemmPath::kGemv);
    EXPECT_EQ(sf.res.topk_weights.data, static_cast<void*>(dw.get())) << "separated routing returns the caller's weights";
    EXPECT_CLOSE("gemv out " + s.name(), sf.out, ref.out, 5e-3);
    EXPECT_EQ(download<int32_t>(map.get(), ids.size()), ref.e2p) << "expanded_to_permuted";
    if (!kf.out_bits.empty()) {
      EXPECT_EQ(kf.out_bits, sf.out_bits) << "in-kernel and separated routing differ";
    }
    expect_same_bits_every_block_shape(ps, sf.out_bits);
    bool any_local = s.shared;
    for (int32_t e : ids) any_local = any_local || (e >= s.begin && e < (s.end < 0 ? s.E : s.end));
    if (!any_local) {
      EXPECT_EQ(sf.out_bits, f32_to_bf16(d.residual)) << "no local route: out = residual";
    }
    expect_close_to_stream(ps, sf, s);
  }
}

// The gemv decode of several tokens (two per block row, 18 warps per block at top-8 + shared): T = 2 (the
// heuristic's choice), T = 5 (forced: three block rows, the last half empty) and T = 17 (nine rows, the grid's
// rows on x and column blocks on y, so rows sharing experts read them together). Each token's output row bit for
// bit what a one-token call of that token alone gives (the same warps' arithmetic), in-kernel == separated routing,
// the reference with bf16 activations, the returned map, every block shape and `down` variant, the fused norm of
// every row against norm::rmsnorm (a counter per block row), and the stream path within the tolerance. Forced
// routes: both tokens on the same experts (each expert's rows read by two warps), and expert parallelism with
// drops (a token with no local route). T = 33, and two top-16 tokens (34 warps), are refused.
TEST(MoeOpGpu, GemvDecodeTokenPairs) {
  SKIP_WITHOUT_GPU();
  std::vector<GemvCase> cases;
  for (auto [wf, af] : {kFormats[0], kFormats[1]}) {
    const Case s = gemv_case(wf, af, 2);
    cases.push_back({s, {}});
    cases.push_back({s, {3, 7, 1, 30, 12, 0, 9, 21, 21, 9, 0, 12, 30, 1, 7, 3}});  // the same experts, reordered
    const Case ep = expert_parallel(s);  // 16 warps
    cases.push_back({ep, {}});
    cases.push_back({ep, {0, 1, 2, 3, 4, 5, 30, 31, 9, 30, 9, 23, 8, 0, 23, 12}});  // token 0: no local route
    Case five = s;  // three block rows, the last with one token
    five.T = 5;
    cases.push_back({five, {}});
    Case five_ep = ep;
    five_ep.T = 5;
    cases.push_back({five_ep, {}});
    Case many = s;
    many.T = 17;
    cases.push_back({many, {}});
  }
  int rows_compared = 0;
  for (const GemvCase& tc : cases) {
    const Case& s = tc.s;
    SCOPED_TRACE(s.name() + (tc.forced.empty() ? "" : " forced ids"));
    Data d(s);
    const size_t R = static_cast<size_t>(s.T) * s.TOPK;
    std::vector<int32_t> ids = tc.forced;
    std::vector<float> w;
    test::OpOutputs kf;
    if (ids.empty()) {
      MoeParams pk = d.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
      if (s.T <= 2) pk.force_path.reset();  // the default choice at T = 2; forced beyond
      kf = test::run_op(pk, 0xff);
      EXPECT_EQ(kf.res.path, GemmPath::kGemv);
      ids = kf.ids;
      w = kf.weights;
    } else {
      w = ds::test::randu(R, 5, 0.1f, 1.0f);
    }
    const Ref ref = reference(d, ids, w, ActFormat::kBF16);
    DeviceBuffer dids = upload(ids), dw = upload(w), map(R * 4);
    MoeParams ps = d.params(RoutingMode::kSeparated, false, GemmPath::kGemv);
    ps.topk_ids_in = dids.get<int32_t>();
    ps.topk_weights_in = dw.get<float>();
    CUDA_CHECK(cudaMemset(map.get(), 0x7f, map.bytes()));
    ps.expanded_to_permuted = map.get<int32_t>();
    const test::OpOutputs sf = test::run_op(ps, 0x7f);
    EXPECT_EQ(sf.res.path, GemmPath::kGemv);
    EXPECT_CLOSE("gemv out " + s.name(), sf.out, ref.out, 5e-3);
    EXPECT_EQ(download<int32_t>(map.get(), R), ref.e2p) << "expanded_to_permuted";
    if (!kf.out_bits.empty()) {
      EXPECT_EQ(kf.out_bits, sf.out_bits) << "in-kernel and separated routing differ";
    }
    // Each token alone: a one-token call on its rows of x, residual, ids and weights.
    for (int t = 0; t < s.T; ++t) {
      MoeParams p1 = ps;
      p1.T = 1;
      p1.x = d.dx.get<bf16_t>() + static_cast<size_t>(t) * s.D;
      p1.residual = d.dres.get<bf16_t>() + static_cast<size_t>(t) * s.D;
      p1.topk_ids_in = dids.get<int32_t>() + t * s.TOPK;
      p1.topk_weights_in = dw.get<float>() + t * s.TOPK;
      p1.expanded_to_permuted = nullptr;
      const test::OpOutputs one = test::run_op(p1, 0x3c);
      ASSERT_EQ(one.res.path, GemmPath::kGemv);
      const std::vector<uint16_t> row(sf.out_bits.begin() + static_cast<size_t>(t) * s.D,
                                      sf.out_bits.begin() + static_cast<size_t>(t + 1) * s.D);
      const int64_t differ = ds::test::count_differing(row, one.out_bits);
      std::printf("[err] gemv %s token %d against a call of its own: %lld of %d outputs differ in their bits\n",
                  s.name().c_str(), t, static_cast<long long>(differ), s.D);
      EXPECT_EQ(differ, 0) << "token " << t;
      ++rows_compared;
    }
    bool any_local0 = s.shared;
    for (int k = 0; k < s.TOPK; ++k)
      any_local0 = any_local0 || (ids[k] >= s.begin && ids[k] < (s.end < 0 ? s.E : s.end));
    if (!any_local0) {
      const std::vector<uint16_t> row0(sf.out_bits.begin(), sf.out_bits.begin() + s.D);
      const auto res0 = f32_to_bf16(std::vector<float>(d.residual.begin(), d.residual.begin() + s.D));
      EXPECT_EQ(row0, res0) << "token 0 has no local route: its row = its residual";
    }
    expect_same_bits_every_block_shape(ps, sf.out_bits);
    for (bool persistent : {false, true}) {
      MoeParams pv = ps;
      pv.gemv_down_preload = !persistent;
      pv.gemv_down_persistent = persistent;
      EXPECT_EQ(test::run_op(pv, 0x5a).out_bits, sf.out_bits) << (persistent ? "persistent down" : "preloaded down");
      pv.gemv_down_preload = pv.gemv_down_persistent = false;
      EXPECT_EQ(test::run_op(pv, 0x5a).out_bits, sf.out_bits) << "streaming down";
    }
    {  // the next layer's input norm of both rows, fused into the last `down` block
      const auto nw = f32_to_bf16(ds::test::randu(s.D, 21, 0.5f, 1.5f));
      DeviceBuffer dnw = upload(nw), y(static_cast<size_t>(s.T) * s.D * 2);
      CUDA_CHECK(cudaMemset(y.get(), 0x7f, y.bytes()));
      MoeParams pn = ps;
      pn.norm_w = dnw.get<bf16_t>();
      pn.norm_out = y.get<bf16_t>();
      pn.norm_eps = 1e-6f;
      const test::OpOutputs fused = test::run_op(pn, 0x3c);
      EXPECT_EQ(fused.out_bits, sf.out_bits) << "the fused norm changed out";
      EXPECT_TRUE(fused.res.normed);
      DeviceBuffer dout = upload(sf.out_bits), ry(static_cast<size_t>(s.T) * s.D * 2);
      norm::rmsnorm({dout.get<bf16_t>(), s.D, dnw.get<bf16_t>(), ry.get<bf16_t>(), s.T, s.D, 1e-6f}, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download<uint16_t>(y.get(), static_cast<size_t>(s.T) * s.D),
                download<uint16_t>(ry.get(), static_cast<size_t>(s.T) * s.D))
          << "fused norm of every row vs norm::rmsnorm";
    }
    expect_close_to_stream(ps, sf, s);
  }
  int rows_expected = 0;
  for (const GemvCase& tc : cases) rows_expected += tc.s.T;
  EXPECT_EQ(rows_compared, rows_expected);
  // 33 tokens, and two top-16 tokens (34 warps), forced onto the gemv path: refused with the reason, before any
  // kernel runs.
  Case too_many = cases[0].s;
  too_many.T = kGemvTokenLimit + 1;
  Case wide = cases[0].s;
  wide.E = 64;
  wide.TOPK = 16;
  for (const Case& c : {too_many, wide}) {
    Data dr(c);
    MoeParams pr = dr.params(RoutingMode::kInKernel, false, GemmPath::kGemv);
    try {
      test::run_op(pr, 0x3c);
      ADD_FAILURE() << c.name() << " on the gemv path was not refused";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find("gemv path runs up to 32 tokens"), std::string::npos) << e.what();
    }
  }
}

TEST(MoeOpGpu, CudaGraphReplayEqualsEagerRun) {
  SKIP_WITHOUT_GPU();
  for (auto [wf, af, T] : {std::tuple{kFormats[0].first, kFormats[0].second, 5},
                           std::tuple{kFormats[1].first, kFormats[1].second, 5},
                           std::tuple{kFormats[0].first, kFormats[0].second, 17},  // bf16: the stream kernel
                           std::tuple{kFormats[1].first, kFormats[1].second, 17},  // FP8: wgmma at a decode size
                           std::tuple{kFormats[0].first, kFormats[0].second, 1},  // the gemv decode
                           std::tuple{kFormats[1].first, kFormats[1].second, 1},
                           std::tuple{kFormats[0].first, kFormats[0].second, 2},  // the gemv decode, two tokens
                           std::tuple{kFormats[1].first, kFormats[1].second, 2}}) {
    Case s;
    s.T = T;
    s.wf = wf;
    s.af = af;
    Data d(s);
    MoeParams p = d.params(RoutingMode::kInKernel, false, GemmPath::kStream);
    p.force_path.reset();
    p.fp8_decode_wgmma = true;  // whatever the default
    DeviceBuffer ws(moe_workspace_bytes(p)), out(static_cast<size_t>(s.T) * s.D * 2);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    p.out = out.get<bf16_t>();
    CudaStream stream;
    p.stream = stream.get();
    const GemmPath path = moe_forward(p).path;  // eager (also sets kernel attributes before capture)
    stream.sync();
    if (T == 17) {
      EXPECT_EQ(path, wf == WeightFormat::kFP8Block ? GemmPath::kWgmma : GemmPath::kStream) << s.name();
    }
    const auto eager = download<uint16_t>(out.get(), static_cast<size_t>(s.T) * s.D);
    CUDA_CHECK(cudaMemset(out.get(), 0x7f, out.bytes()));
    CUDA_CHECK(cudaMemset(ws.get(), 0x7f, ws.bytes()));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
    moe_forward(p);
    CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    stream.sync();
    EXPECT_EQ(download<uint16_t>(out.get(), static_cast<size_t>(s.T) * s.D), eager) << s.name();
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    // Without programmatic dependent launch: the same bits.
    CUDA_CHECK(cudaMemset(out.get(), 0x55, out.bytes()));
    p.pdl = false;
    moe_forward(p);
    stream.sync();
    EXPECT_EQ(download<uint16_t>(out.get(), static_cast<size_t>(s.T) * s.D), eager) << s.name() << " without PDL";
  }
}

}  // namespace
}  // namespace ds::moe

#endif  // DELTASERVE_WITH_CUDA
