// MoE benchmark (plain main, CUDA events, warm-up, median): decode and prefill of the fused MoE op for the
// Kimi-Linear shape (bf16, FP8 block) and the larger 896-expert shape (FP8 block, MXFP4), against the copy
// bandwidth, cuBLASLt per-expert GEMMs and cuBLASLt's large dense GEMMs, all measured in the same run.
//
// Definitions (printed with the table):
//   op_us      moe_forward with separated routing, routed experts only (gather, gate/up GEMM, SwiGLU, down
//              GEMM, finalize), the reference table's definition; decode points are CUDA-graph replays.
//   nopdl_us   op_us without programmatic dependent launch between the op's kernels (decode only).
//   sep_us     op_us on the stream path with its separate dispatch and finalize kernels (gemv_decode = false;
//              decode only): what T = 1 and 2 ran before the gemv decode, equal to op_us where the gemv decode does
//              not apply (T >= 3 at top-8).
//   full_us    in-kernel routing (router GEMM + top-k) and the shared expert included.
//   route_us   the routing alone (moe_route: router GEMM + top-k); decode: a graph of nx routings back to
//              back, divided by nx (one routing is shorter than a graph launch).  topk_us: its top-k kernel.
//   touched    bytes of the distinct experts the routes hit (weights + scales), averaged over route sets.
//   GB/s       touched / op_us;  %copy = GB/s / device-to-device copy GB/s (bytes read + written).
//   TFLOP/s    2 * routes * (2I*D + D*I) / op_us;   cublas_us: one cuBLASLt GEMM per active expert and
//              projection (gate+up, down) only, graph-replayed;  x_cublas = cublas_us / op_us.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/moe/moe.h"

using namespace ds;
using namespace ds::moe;

// cuBLASLt status check (kernels/gemm keeps its own private to gemm.cu).
#define LT_CHECK(x)                                                                                        \
  do {                                                                                                     \
    const cublasStatus_t st_ = (x);                                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
      throw std::runtime_error(std::string(#x) + " failed: status " + std::to_string(static_cast<int>(st_))); \
  } while (0)

namespace {

// ------------------------------------------------------------------ random device data (never zeros)
__device__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed * 0x85EBCA6Bu;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}
enum Fill { kBf16, kF32, kE4M3, kByte, kE8M0 };
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed, int kind, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i, seed);
    const float u = lo + (hi - lo) * (h >> 8) * (1.0f / 16777216.0f);
    switch (kind) {
      case kBf16: reinterpret_cast<uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16(u)); break;
      case kF32: reinterpret_cast<float*>(p)[i] = u; break;
      case kE4M3: p[i] = static_cast<uint8_t>((h & 0x80u) | (0x20u + (h >> 8) % 0x50u)); break;  // |v| in [2^-3, 2^7)
      case kByte: p[i] = static_cast<uint8_t>(h); break;
      case kE8M0: p[i] = static_cast<uint8_t>(lo + (h >> 8) % static_cast<uint32_t>(hi - lo + 1)); break;
    }
  }
}
void fill(void* p, size_t n, int kind, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  fill_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), n, seed, kind, lo, hi);
  CUDA_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ expert weights of one format
struct Experts {
  DeviceBuffer w13, s13, g13, w2, s2, g2;
  size_t bytes_per_expert = 0;
  ExpertWeights view() const {
    ExpertWeights e;
    e.w13 = w13.get();
    e.w13_scale = s13.bytes() ? s13.get() : nullptr;
    e.w13_global = g13.bytes() ? g13.get<float>() : nullptr;
    e.w2 = w2.get();
    e.w2_scale = s2.bytes() ? s2.get() : nullptr;
    e.w2_global = g2.bytes() ? g2.get<float>() : nullptr;
    return e;
  }
};
Experts make_experts(int n, int D, int I, WeightFormat f, uint32_t seed) {
  Experts x;
  const size_t e13 = static_cast<size_t>(n) * 2 * I * D, e2 = static_cast<size_t>(n) * D * I;
  auto mat = [&](DeviceBuffer& w, DeviceBuffer& s, DeviceBuffer& g, size_t elems, int rows, int K, uint32_t sd) {
    switch (f) {
      case WeightFormat::kBF16:
        w.reset(elems * 2);
        fill(w.get(), elems, kBf16, sd, -0.03f, 0.03f);
        break;
      case WeightFormat::kFP8Block:
        w.reset(elems);
        fill(w.get(), elems, kE4M3, sd);
        s.reset(elems / (128 * 128) * 4);
        fill(s.get(), elems / (128 * 128), kF32, sd + 1, 1e-4f, 3e-4f);
        break;
      case WeightFormat::kMXFP8:
        w.reset(elems);
        fill(w.get(), elems, kE4M3, sd);
        s.reset(elems / 32);
        fill(s.get(), elems / 32, kE8M0, sd + 1, 112, 116);
        break;
      case WeightFormat::kMXFP4:
      case WeightFormat::kNVFP4:
        w.reset(elems / 2);
        fill(w.get(), elems / 2, kByte, sd);
        if (f == WeightFormat::kMXFP4) {
          s.reset(elems / 32);
          fill(s.get(), elems / 32, kE8M0, sd + 1, 118, 122);
        } else {
          s.reset(elems / 16);
          fill(s.get(), elems / 16, kE4M3, sd + 1);
          g.reset(n * 4);
          fill(g.get(), n, kF32, sd + 2, 1e-4f, 2e-4f);
        }
        break;
    }
    (void)rows;
    (void)K;
  };
  mat(x.w13, x.s13, x.g13, e13, 2 * I, D, seed);
  mat(x.w2, x.s2, x.g2, e2, D, I, seed + 7);
  x.bytes_per_expert = (x.w13.bytes() + x.s13.bytes() + x.w2.bytes() + x.s2.bytes()) / n;
  return x;
}

// ------------------------------------------------------------------ timing
float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
// Median time (us) of `reps` calls of launch(i), each bracketed by events, after `warm` calls.
template <class F>
float time_us(F&& launch, int warm, int reps, cudaStream_t s) {
  for (int i = 0; i < warm; ++i) launch(i);
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < reps; ++i) {
    launch(i);
    CUDA_CHECK(cudaEventRecord(ev[i + 1], s));
  }
  CUDA_CHECK(cudaEventSynchronize(ev[reps]));
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  return median(t) * 1000.0f;
}
struct Graph {
  cudaGraphExec_t exec = nullptr;
  template <class F>
  Graph(F&& body, cudaStream_t s) {
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    body();
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
  }
  Graph(Graph&& o) noexcept : exec(std::exchange(o.exec, nullptr)) {}
  ~Graph() { if (exec) cudaGraphExecDestroy(exec); }
  void launch(cudaStream_t s) const { CUDA_CHECK(cudaGraphLaunch(exec, s)); }
};

// ------------------------------------------------------------------ cuBLASLt (layouts verified in deps.md)
class Lt {
 public:
  Lt() {
    LT_CHECK(cublasLtCreate(&h_));
    ws_.reset(64 << 20);
  }
  ~Lt() { cublasLtDestroy(h_); }
  // D[N, M] (col-major M x N) = act[M, K] . w[N, K]^T; fp8: act 1x128 scales sa[kb * M + m], w 128x128 sb.
  bool gemm(int M, int N, int K, bool fp8, const void* act, const void* w, const float* sa, const float* sb, void* d,
            cudaStream_t s) {
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    if (fp8) {
      const int ma = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, in, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, in, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = ws_.bytes();
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(h_, op, la, lb, ld, ld, pref, 1, &res, &found);
    bool ok = found > 0;
    if (ok) {
      const float alpha = 1.0f, beta = 0.0f;
      ok = cublasLtMatmul(h_, op, &alpha, act, la, w, lb, &beta, d, ld, d, ld, &res.algo, ws_.get(), wsb, s) ==
           CUBLAS_STATUS_SUCCESS;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return ok;
  }

 private:
  cublasLtHandle_t h_;
  DeviceBuffer ws_;
};

// ------------------------------------------------------------------ routes
struct Routes {
  DeviceBuffer ids, w;
  std::vector<int> count;  // tokens per expert
  int touched = 0;
};
Routes random_routes(int T, int E, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T) * K);
  std::vector<float> w(ids.size());
  Routes r;
  r.count.assign(E, 0);
  for (int t = 0; t < T; ++t) {
    std::set<int> chosen;
    while (static_cast<int>(chosen.size()) < K) chosen.insert(static_cast<int>(rng() % E));
    int k = 0;
    for (int e : chosen) {
      ids[t * K + k] = e;
      w[t * K + k++] = 0.3f;
      r.count[e]++;
    }
  }
  for (int c : r.count) r.touched += c > 0;
  r.ids.reset(ids.size() * 4);
  r.w.reset(w.size() * 4);
  CUDA_CHECK(cudaMemcpy(r.ids.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(r.w.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  return r;
}

struct Shape {
  const char* name;
  int E, topk, D, I;
};

struct Env {
  cudaStream_t s;
  Lt* lt;
  double copy_gbs;
  double fp8_tflops;  // cuBLASLt dense FP8 block-scaled 8192^3, this run (the FP8 prefill target is half of it)
};

// One format of one shape over a list of token counts.
// tiles_only (--tiles): the stream path's token-tile sweep alone, at every T given (graph-replayed).
void bench_format(const Env& env, const Shape& sh, WeightFormat wf, ActFormat af, const std::vector<int>& tokens,
                  bool tiles_only = false) {
  const int D = sh.D, I = sh.I, E = sh.E, K = sh.topk;
  const int Tmax = *std::max_element(tokens.begin(), tokens.end());
  Experts ex = make_experts(E, D, I, wf, 1), shx = make_experts(1, D, I, wf, 99);
  const bool fp8 = wf != WeightFormat::kBF16;  // the cuBLASLt baseline runs in FP8 for every non-bf16 format
  // MXFP4 has no cuBLASLt path on Hopper: its baseline is the FP8 block per-expert GEMMs on FP8 copies.
  std::unique_ptr<Experts> f8;
  if (wf == WeightFormat::kMXFP4) f8 = std::make_unique<Experts>(make_experts(E, D, I, WeightFormat::kFP8Block, 3));
  // Activations for the op (8 rotating inputs for decode) and cuBLAS scratch.
  const int nx = 8;
  std::vector<DeviceBuffer> xs;
  for (int i = 0; i < nx; ++i) {
    xs.emplace_back(static_cast<size_t>(Tmax) * D * 2);
    fill(xs.back().get(), static_cast<size_t>(Tmax) * D, kBf16, 500 + i);
  }
  DeviceBuffer gate(static_cast<size_t>(E) * D * 2), bias(E * 4), res(static_cast<size_t>(Tmax) * D * 2),
      out(static_cast<size_t>(Tmax) * D * 2);
  fill(gate.get(), static_cast<size_t>(E) * D, kBf16, 7, -0.05f, 0.05f);
  fill(bias.get(), E, kF32, 8, -0.01f, 0.01f);
  fill(res.get(), static_cast<size_t>(Tmax) * D, kBf16, 9);
  const size_t amax_rows = static_cast<size_t>(Tmax) * K;
  DeviceBuffer ca(amax_rows * std::max(D, I) * (fp8 ? 1 : 2)), csa(amax_rows * std::max(D, I) / 128 * 4 + 16),
      cd(amax_rows * 2 * I * 2);
  fill(ca.get(), ca.bytes(), kE4M3, 11);  // valid e4m3 bytes; as bf16 pairs they are finite values too
  fill(csa.get(), csa.bytes() / 4, kF32, 12, 0.5f, 1.5f);

  MoeParams base;
  base.D = D;
  base.I = I;
  base.router.E = E;
  base.router.topk = K;
  base.router.routed_scaling_factor = 2.446f;
  base.weight_format = wf;
  base.act_format = af;
  base.experts = ex.view();
  base.shared = shx.view();
  base.gate_w = gate.get<bf16_t>();
  base.gate_bias = bias.get<float>();
  base.residual = res.get<bf16_t>();
  base.out = out.get<bf16_t>();
  base.stream = env.s;
  base.max_tokens = Tmax;
  base.has_shared = true;
  DeviceBuffer rlogits(static_cast<size_t>(Tmax) * E * 4), rids(static_cast<size_t>(Tmax) * K * 4),
      rw(static_cast<size_t>(Tmax) * K * 4);
  DeviceBuffer ws(moe_workspace_bytes(base));
  base.workspace = ws.get();
  base.workspace_bytes = ws.bytes();

  for (int T : tokens) {
    const bool decode = T <= 64 || tiles_only;
    const int nsets = decode ? 8 : 1, reps = decode ? 40 : (T * K >= 131072 && D > 4096 ? 3 : 7);
    std::vector<Routes> routes;
    for (int i = 0; i < nsets; ++i) routes.push_back(random_routes(T, E, K, 1000 * T + i));
    double touched = 0;
    for (auto& r : routes) touched += static_cast<double>(r.touched) * ex.bytes_per_expert / nsets;
    const double flops = 2.0 * T * K * (3.0 * D * I);

    auto op_params = [&](int i, bool full, bool pdl = true, bool gemv = true) {
      MoeParams p = base;
      p.pdl = pdl;
      p.gemv_decode = gemv;
      p.T = T;
      p.x = xs[i % nx].get<bf16_t>();
      p.has_shared = full;
      p.routing = full ? RoutingMode::kInKernel : RoutingMode::kSeparated;
      p.topk_ids_in = routes[i % nsets].ids.get<int32_t>();
      p.topk_weights_in = routes[i % nsets].w.get<float>();
      return p;
    };
    const GemmPath path = moe_forward(op_params(0, false)).path;  // also the warm-up of lazy attributes
    auto route = [&](int i, bool logits_given = false, bool cluster = false) {
      RouteParams r;
      r.logits_given = logits_given;
      r.cluster = cluster;
      r.router = base.router;
      r.T = T;
      r.D = D;
      r.x = xs[i % nx].get<bf16_t>();
      r.gate_w = base.gate_w;
      r.bias = base.gate_bias;
      r.logits = rlogits.get<float>();
      r.topk_ids = rids.get<int32_t>();
      r.topk_weights = rw.get<float>();
      r.stream = env.s;
      moe_route(r);
    };
    // Decode routing timed as a graph of nx routings back to back, per routing (one is shorter than a launch).
    auto routing_us = [&](bool logits_given, bool cluster) {
      Graph gr([&] {
        for (int i = 0; i < nx; ++i) route(i, logits_given, cluster);
      }, env.s);
      return time_us([&](int) { gr.launch(env.s); }, 8, reps, env.s) / nx;
    };
    // The op on the stream path wherever the rule would take it with the gemv decode off (T = 2 has both), FP8 with
    // its decode kept off the wgmma kernels (MoeParams::fp8_decode_wgmma: the stream kernel's rule still applies
    // with DELTASERVE_MOE_FP8_DECODE_WGMMA=0).
    auto stream_params = [&](int i, bool full) {
      MoeParams p = op_params(i, full, true, false);
      p.fp8_decode_wgmma = false;
      return p;
    };
    // The streaming GEMM's token tiles per pass (MoeParams::stream_token_tiles), graph-replayed like op_us and
    // full_us (full: the shared expert sees all T tokens, so fewer tiles make it take several passes): the data
    // for moe_stream_token_tiles()'s rule. Two rounds, the tile counts alternated within each.
    auto tile_sweep = [&] {
      std::string row;
      for (int round = 0; round < 2; ++round)
        for (int tiles : {1, 2, 4, 8}) {
          std::vector<Graph> gt, gtf;
          for (int i = 0; i < nx; ++i) {
            gt.emplace_back([&] {
              MoeParams p = stream_params(i, false);
              p.stream_token_tiles = tiles;
              moe_forward(p);
            }, env.s);
            gtf.emplace_back([&] {
              MoeParams p = stream_params(i, true);
              p.stream_token_tiles = tiles;
              moe_forward(p);
            }, env.s);
          }
          const float op = time_us([&](int i) { gt[i % nx].launch(env.s); }, 8, reps, env.s);
          const float full = time_us([&](int i) { gtf[i % nx].launch(env.s); }, 8, reps, env.s);
          char buf[64];
          std::snprintf(buf, sizeof buf, " %d:%.1f/%.1f", tiles, op, full);
          row += buf;
        }
      std::printf("#   stream token tiles (%s/%s, T = %d, default %d; tiles:op_us/full_us, two rounds):%s\n",
                  weight_format_name(wf), act_format_name(af), T, moe_stream_token_tiles(T, op_params(0, false)),
                  row.c_str());
      std::fflush(stdout);
    };
    // The sweep times the stream path wherever it would run (stream_params).
    const bool stream_path = moe_forward(stream_params(0, false)).path == GemmPath::kStream;
    if (tiles_only) {
      if (stream_path) tile_sweep();
      continue;
    }
    float op_us, full_us, route_us, topk_us, nopdl_us = -1.0f, sep_us = -1.0f;
    std::vector<Graph> g, gf;  // decode: the op's default path, routed experts only / with routing and shared
    if (decode) {
      std::vector<Graph> gn, gs;
      for (int i = 0; i < nx; ++i) {
        g.emplace_back([&] { moe_forward(op_params(i, false)); }, env.s);
        gf.emplace_back([&] { moe_forward(op_params(i, true)); }, env.s);
        gn.emplace_back([&] { moe_forward(op_params(i, false, false)); }, env.s);
        gs.emplace_back([&] { moe_forward(op_params(i, false, true, false)); }, env.s);
      }
      op_us = time_us([&](int i) { g[i % nx].launch(env.s); }, 8, reps, env.s);
      full_us = time_us([&](int i) { gf[i % nx].launch(env.s); }, 8, reps, env.s);
      nopdl_us = time_us([&](int i) { gn[i % nx].launch(env.s); }, 8, reps, env.s);
      sep_us = time_us([&](int i) { gs[i % nx].launch(env.s); }, 8, reps, env.s);
      route_us = routing_us(false, false);
      topk_us = routing_us(true, false);
    } else {
      op_us = time_us([&](int i) { moe_forward(op_params(i, false)); }, 1, reps, env.s);
      full_us = time_us([&](int i) { moe_forward(op_params(i, true)); }, 1, reps, env.s);
      route_us = time_us([&](int i) { route(i); }, 1, reps, env.s);
      topk_us = time_us([&](int i) { route(i, true); }, 1, reps, env.s);
    }
    // cuBLASLt baseline: per active expert, gate+up [n, D] x [2I, D]^T and down [n, I] x [D, I]^T.
    float cublas_us = -1.0f;
    if (wf == WeightFormat::kBF16 || wf == WeightFormat::kFP8Block || wf == WeightFormat::kMXFP4) {
      const bool lt8 = wf != WeightFormat::kBF16;
      const Experts& bx = f8 ? *f8 : ex;
      const size_t es = lt8 ? 1 : 2;
      bool ok = true;
      std::vector<Graph> g;
      for (int i = 0; i < nsets && ok; ++i)
        g.emplace_back([&] {
          for (int e = 0; e < E && ok; ++e) {
            const int n = routes[i].count[e];
            if (!n) continue;
            const auto* w13 = static_cast<const uint8_t*>(bx.w13.get()) + static_cast<size_t>(e) * 2 * I * D * es;
            const auto* w2 = static_cast<const uint8_t*>(bx.w2.get()) + static_cast<size_t>(e) * D * I * es;
            const float* s13 = lt8 ? bx.s13.get<float>() + static_cast<size_t>(e) * (2 * I / 128) * (D / 128) : nullptr;
            const float* s2 = lt8 ? bx.s2.get<float>() + static_cast<size_t>(e) * (D / 128) * (I / 128) : nullptr;
            ok = ok && env.lt->gemm(n, 2 * I, D, lt8, ca.get(), w13, csa.get<float>(), s13, cd.get(), env.s);
            ok = ok && env.lt->gemm(n, D, I, lt8, ca.get(), w2, csa.get<float>(), s2, cd.get(), env.s);
          }
        }, env.s);
      if (ok) cublas_us = time_us([&](int i) { g[i % nsets].launch(env.s); }, 2, decode ? 20 : 3, env.s);
    }
    const double gbs = touched / (op_us * 1e3);
    std::printf("%-10s %-10s %6d  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8.0f %6.1f%% %8.1f %9.1f %7.2fx\n",
                sh.name, weight_format_name(wf), T, gemm_path_name(path), op_us, sep_us, nopdl_us, full_us, route_us,
                topk_us, touched / 1e6, gbs,
                100.0 * gbs / env.copy_gbs, flops / (op_us * 1e6), cublas_us, cublas_us > 0 ? cublas_us / op_us : 0.0);
    std::fflush(stdout);
    if (!decode && wf == WeightFormat::kFP8Block && path == GemmPath::kWgmma) {
      // The FP8 GEMMs' tile rows (MoeParams::fp8_prefill_tile_m: 64 rows, or 128 warp-specialised), alternated,
      // two rounds, in FLOP/s of the whole op: the data for moe_fp8_prefill_tile_m()'s rule.
      auto tile_us = [&](int rows) {
        return time_us([&](int i) {
          MoeParams p = op_params(i, false);
          p.fp8_prefill_tile_m = rows;
          moe_forward(p);
        }, 1, reps, env.s);
      };
      // The expert GEMMs alone (the target's measure): events around gate/up + down inside the op, median over
      // reps. Recording them splits the op's launch chain, so this runs apart from the op timings above.
      auto gemms_us = [&](int rows) {
        std::vector<cudaEvent_t> ev(2 * reps);
        for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
        std::vector<float> t(reps);
        for (int i = -1; i < reps; ++i) {  // i = -1: warm-up
          const int r = i < 0 ? 0 : i;
          MoeParams p = op_params(r, false);
          p.fp8_prefill_tile_m = rows;
          p.gemm_begin = ev[2 * r];
          p.gemm_end = ev[2 * r + 1];
          moe_forward(p);
        }
        CUDA_CHECK(cudaStreamSynchronize(env.s));
        for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
        for (auto& e : ev) cudaEventDestroy(e);
        return median(t) * 1000.0f;
      };
      std::string row, grow;
      char buf[64];
      for (int round = 0; round < 2; ++round)
        for (int rows : {64, 128}) {
          const float us = tile_us(rows);
          std::snprintf(buf, sizeof buf, " %d: %.1f us %.0f TFLOP/s;", rows, us, flops / (us * 1e6));
          row += buf;
          const float gus = gemms_us(rows);
          std::snprintf(buf, sizeof buf, " %d: %.1f us %.0f TFLOP/s;", rows, gus, flops / (gus * 1e6));
          grow += buf;
        }
      std::printf("#   fp8 tile rows (T = %d, op, default %d):%s\n", T, moe_fp8_prefill_tile_m(T, op_params(0, false)),
                  row.c_str());
      std::printf("#   fp8 tile rows (T = %d, expert GEMMs only; cuBLASLt dense FP8 %.0f TFLOP/s):%s\n", T,
                  env.fp8_tflops, grow.c_str());
      std::fflush(stdout);
    }
    if (decode && T <= 16) {
      // Routing as one cluster kernel (MoeParams::cluster_route, off by default until these numbers say so).
      std::vector<Graph> gfc;
      for (int i = 0; i < nx; ++i)
        gfc.emplace_back([&] {
          MoeParams p = op_params(i, true);
          p.cluster_route = true;
          moe_forward(p);
        }, env.s);
      std::printf("#   cluster route (%s, T = %d): route_us %.1f (two kernels %.1f), full_us %.1f (%.1f)\n",
                  weight_format_name(wf), T, routing_us(false, true), route_us,
                  time_us([&](int i) { gfc[i % nx].launch(env.s); }, 8, reps, env.s), full_us);
      std::fflush(stdout);
    }
    if (decode && stream_path) tile_sweep();
    if (decode && path != GemmPath::kGemv && T <= kGemvTokenLimit &&
        (wf == WeightFormat::kBF16 || wf == WeightFormat::kFP8Block)) {
      // The gemv decode forced beyond the heuristic's two tokens (blocks of two tokens, rows of blocks): the data
      // for moe_choose_path's token limit, graph-replayed like op_us and full_us, alternated with them, two rounds.
      std::vector<Graph> gv, gvf;
      for (int i = 0; i < nx; ++i) {
        gv.emplace_back([&] {
          MoeParams p = op_params(i, false);
          p.force_path = GemmPath::kGemv;
          moe_forward(p);
        }, env.s);
        gvf.emplace_back([&] {
          MoeParams p = op_params(i, true);
          p.force_path = GemmPath::kGemv;
          moe_forward(p);
        }, env.s);
      }
      std::string row;
      for (int round = 0; round < 2; ++round) {
        char buf[128];
        const float dop = time_us([&](int i) { g[i % nx].launch(env.s); }, 8, reps, env.s);
        const float gop = time_us([&](int i) { gv[i % nx].launch(env.s); }, 8, reps, env.s);
        const float dfull = time_us([&](int i) { gf[i % nx].launch(env.s); }, 8, reps, env.s);
        const float gfull = time_us([&](int i) { gvf[i % nx].launch(env.s); }, 8, reps, env.s);
        std::snprintf(buf, sizeof buf, "%s op %.1f -> %.1f, full %.1f -> %.1f", round ? ";" : "", dop, gop, dfull,
                      gfull);
        row += buf;
      }
      std::printf("#   gemv forced (%s, T = %d; default path -> gemv, us, two rounds): %s\n", weight_format_name(wf), T,
                  row.c_str());
      std::fflush(stdout);
    }
    if (decode && path != GemmPath::kGemv && T >= 12 && T <= 64 &&
        (wf == WeightFormat::kBF16 || wf == WeightFormat::kFP8Block)) {
      // The wgmma (prefill) path at decode sizes against the stream kernel, both forced: the wgmma TMA rings keep
      // far more weight bytes in flight per SM than the stream kernel's registers (run 21: ~64 KB), at the price of
      // tiles that are mostly padding. The data for moe_choose_path (MoeParams::fp8_decode_wgmma, and bf16's cut-over
      // at 16 routes per expert); graph-replayed, alternated, two rounds; FP8 with both tile heights.
      const std::vector<int> tile_rows =
          wf == WeightFormat::kFP8Block ? std::vector<int>{-1, 64, 128} : std::vector<int>{-1, 0};
      std::vector<std::vector<Graph>> gw(tile_rows.size());
      for (size_t v = 0; v < tile_rows.size(); ++v) {
        auto forced = [&, v](int i) {  // -1: the stream kernel
          MoeParams p = op_params(i, false);
          p.force_path = tile_rows[v] < 0 ? GemmPath::kStream : GemmPath::kWgmma;
          p.fp8_prefill_tile_m = std::max(tile_rows[v], 0);
          return p;
        };
        moe_forward(forced(0));  // eager first: lazy attributes and the TMA encoder before any capture
        CUDA_CHECK(cudaStreamSynchronize(env.s));
        for (int i = 0; i < nx; ++i) gw[v].emplace_back([&, i] { moe_forward(forced(i)); }, env.s);
      }
      std::string row;
      for (int round = 0; round < 2; ++round) {
        char buf[96];
        for (size_t v = 0; v < tile_rows.size(); ++v) {
          const float us = time_us([&](int i) { gw[v][i % nx].launch(env.s); }, 8, reps, env.s);
          const std::string name = tile_rows[v] < 0   ? "stream"
                                   : tile_rows[v] > 0 ? "wgmma m" + std::to_string(tile_rows[v])
                                                      : "wgmma";
          std::snprintf(buf, sizeof buf, "%s %s %.1f (%.1f %%)", v ? "," : round ? ";" : "", name.c_str(), us,
                        100.0 * touched / (us * 1e3) / env.copy_gbs);
          row += buf;
        }
      }
      std::printf("#   stream vs wgmma (%s, T = %d, default %s; op_us, %% of copy, two rounds):%s\n",
                  weight_format_name(wf), T, gemm_path_name(path), row.c_str());
      std::fflush(stdout);
    }
    if (path == GemmPath::kGemv) {
      // The gemv path's block shapes (h columns per gate/up block x rows of D per down block), graph-replayed
      // like op_us: the data for its defaults (moe_gemv.cu).
      char buf[96];
      std::snprintf(buf, sizeof buf, "#   gemv block shapes (%s, T = %d, op_us):", weight_format_name(wf), T);
      std::string row = buf;
      for (int uc : {2, 4})
        for (int dr : {2, 4, 8}) {
          std::vector<Graph> gv;
          for (int i = 0; i < nx; ++i)
            gv.emplace_back([&] {
              MoeParams p = op_params(i, false);
              p.gemv_up_cols = uc;
              p.gemv_down_rows = dr;
              moe_forward(p);
            }, env.s);
          std::snprintf(buf, sizeof buf, " %dx%d %.1f", uc, dr,
                        time_us([&](int i) { gv[i % nx].launch(env.s); }, 8, reps, env.s));
          row += buf;
        }
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --quick: the Kimi shape only; --decode: decode token counts only (T <= 64);
  // --t1: one token only (the gemv decode's rows); --prefill: prefill token counts only.
  // --tokens N: that token count only (profiling runs). --tiles: the stream path's token-tile sweep alone, for
  // every weight format at the Kimi shape, T = 2..512 (the stream path's range there on sm_90); --format NAME
  // (repeatable, a weight format's name as printed, e.g. mxfp4) keeps only those formats' rows of the sweep.
  bool quick = false, decode_only = false, t1 = false, prefill_only = false, tiles = false;
  int only_tokens = 0;
  std::vector<std::string> only_formats;
  auto parse_int = [](const char* v) {  // a whole decimal number, else -1 (rejected below)
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return end != v && *end == '\0' && n >= 0 && n <= (1 << 24) ? static_cast<int>(n) : -1;
  };
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::string(argv[i]) == "--quick";
    decode_only = decode_only || std::string(argv[i]) == "--decode";
    t1 = t1 || std::string(argv[i]) == "--t1";
    prefill_only = prefill_only || std::string(argv[i]) == "--prefill";
    tiles = tiles || std::string(argv[i]) == "--tiles";
    if (i + 1 < argc && std::string(argv[i]) == "--tokens") {
      const int n = parse_int(argv[i + 1]);
      only_tokens = n >= 1 ? n : -1;
    }
    if (i + 1 < argc && std::string(argv[i]) == "--format") only_formats.emplace_back(argv[i + 1]);
  }
  if (only_tokens < 0) {
    std::fprintf(stderr, "moe_bench: --tokens N needs a whole number N >= 1\n");
    return 2;
  }
  // The --tiles sweep's weight/activation pairs.
  const std::pair<WeightFormat, ActFormat> fmts[] = {
      {WeightFormat::kBF16, ActFormat::kBF16},    {WeightFormat::kFP8Block, ActFormat::kFP8Block},
      {WeightFormat::kMXFP8, ActFormat::kMXFP8},  {WeightFormat::kMXFP4, ActFormat::kBF16},
      {WeightFormat::kNVFP4, ActFormat::kBF16},   {WeightFormat::kNVFP4, ActFormat::kFP8Block}};
  auto in_sweep = [&](const std::string& name) {
    return std::any_of(std::begin(fmts), std::end(fmts),
                       [&](const auto& f) { return name == weight_format_name(f.first); });
  };
  for (const auto& name : only_formats)
    if (!in_sweep(name)) {
      std::fprintf(stderr, "moe_bench: --format %s: not a weight format of the --tiles sweep\n", name.c_str());
      return 2;
    }
  if (!cuda_device_available()) {
    std::printf("moe_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  Lt lt;

  // Ceilings measured now: D2D copy (1 GiB), dense bf16 and FP8 block-scaled GEMMs at 8192^3.
  DeviceBuffer a(1u << 30), b(1u << 30);
  fill(a.get(), (1u << 30) / 2, kBf16, 1);
  const float copy_us = time_us([&](int) { CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), 1u << 30, cudaMemcpyDeviceToDevice, s)); }, 2, 10, s);
  const double copy_gbs = 2.0 * (1u << 30) / (copy_us * 1e3);
  const int M = 8192;
  DeviceBuffer c(static_cast<size_t>(M) * M * 2), sa(static_cast<size_t>(M) * M / 128 * 4), sb(static_cast<size_t>(M / 128) * (M / 128) * 4);
  fill(sa.get(), sa.bytes() / 4, kF32, 2, 0.5f, 1.5f);
  fill(sb.get(), sb.bytes() / 4, kF32, 3, 0.5f, 1.5f);
  fill(b.get(), (1u << 30), kE4M3, 4);  // e4m3 bytes: finite as bf16 pairs too
  const double f = 2.0 * M * M * M;
  const float bf16_us = time_us([&](int) { lt.gemm(M, M, M, false, b.get(), b.get(), nullptr, nullptr, c.get(), s); }, 2, 10, s);
  const float fp8_us = time_us([&](int) {
    lt.gemm(M, M, M, true, b.get(), b.get(), sa.get<float>(), sb.get<float>(), c.get(), s);
  }, 2, 10, s);
  a.release();
  b.release();
  c.release();
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("ceilings: copy %.0f GB/s | cuBLASLt bf16 8192^3 %.0f TFLOP/s | cuBLASLt fp8 block-scaled 8192^3 %.0f TFLOP/s\n",
              copy_gbs, f / (bf16_us * 1e6), f / (fp8_us * 1e6));
  std::printf("%-10s %-10s %6s  %-16s %9s %9s %9s %9s %9s %9s %9s %8s %7s %8s %9s %8s\n", "shape", "weights", "T",
              "path", "op_us", "sep_us", "nopdl_us", "full_us", "route_us", "topk_us", "touchedMB", "GB/s", "%copy",
              "TFLOP/s", "cublas_us", "x_cublas");
  Env env{s, &lt, copy_gbs, f / (fp8_us * 1e6)};
  const std::vector<int> decode = {1, 2, 4, 8, 12, 16, 32, 64}, prefill = {1024, 4096, 16384};
  std::vector<int> all = t1 ? std::vector<int>{1} : prefill_only ? std::vector<int>{} : decode;
  if (!decode_only && !t1) all.insert(all.end(), prefill.begin(), prefill.end());
  if (only_tokens > 0) all = {only_tokens};
  const Shape kimi{"kimi48b", 256, 8, 2304, 1024}, big{"e896k16", 896, 16, 7168, 2048};
  if (tiles) {
    const std::vector<int> ts = only_tokens > 0 ? std::vector<int>{only_tokens}
                                                : std::vector<int>{2, 8, 16, 32, 64, 128, 256, 512};
    for (const auto& [wf, af] : fmts) {
      const bool keep = only_formats.empty() || std::find(only_formats.begin(), only_formats.end(),
                                                          std::string(weight_format_name(wf))) != only_formats.end();
      if (keep) bench_format(env, kimi, wf, af, ts, true);
    }
    CUDA_CHECK(cudaStreamDestroy(s));
    return 0;
  }
  bench_format(env, kimi, WeightFormat::kBF16, ActFormat::kBF16, all);
  bench_format(env, kimi, WeightFormat::kFP8Block, ActFormat::kFP8Block, all);
  if (!quick) {
    bench_format(env, big, WeightFormat::kFP8Block, ActFormat::kFP8Block, all);
    bench_format(env, big, WeightFormat::kMXFP4, ActFormat::kBF16,
                 decode_only ? std::vector<int>{1, 8, 64} : std::vector<int>{1, 8, 64, 1024});
  }
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
