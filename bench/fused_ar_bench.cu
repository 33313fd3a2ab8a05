// Fused MoE finalize + all-reduce + residual add + RMSNorm against the unfused path, at 1, 2, 3, 4, 8 and 16
// tokens, hidden 2304 and 7168, TP 2, 4 and 8 (TOPK 8). CUDA events around CUDA-graph replays, warm-up, medians.
//
//   fused_ar_bench            R ranks simulated on one GPU: R buffer sets, one stream per rank, one graph that
//                             forks into the R rank streams and joins (time = the whole R-rank step). Unfused =
//                             moe_finalize + one-shot peer all-reduce + add_rmsnorm on each rank. Both paths run
//                             through TpFinalizeNorm, the engine's layer boundary. The figures rank the two paths
//                             against each other on one device; they are not multi-GPU times.
//   fused_ar_bench --nccl [--tp N]
//                             one process per GPU started by the launcher (TP 2, 4, 8 or N, as many as there are
//                             GPUs): IPC peer buffers for the fused kernel, NCCL all-reduce for the unfused path;
//                             each rank times its own graph replays; the table shows the slowest rank's median.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "core/dtype.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/launcher.h"
#include "runtime/parallel/peer_buffers.h"
#include "runtime/parallel/tp_finalize.h"

using namespace ds;
using namespace ds::parallel;

namespace {

constexpr int kTopk = 8;
constexpr int kTokens[] = {1, 2, 3, 4, 8, 16};
constexpr int kHidden[] = {2304, 7168};
constexpr int kWarmup = 20, kSamples = 30, kReplays = 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One rank's inputs for T tokens: random bf16 expert outputs (a few dropped routes), weights, shared output,
// residual (updated in place by every replay: values drift, the timing does not), norm weight.
struct RankInputs {
  DeviceBuffer y, e2p, w, shared, residual, norm_w, out;
  RankInputs(int T, int D, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    auto bf16s = [&](size_t n, float mean) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = f32_to_bf16(mean + nd(rng));
      return v;
    };
    auto put = [](DeviceBuffer& b, const void* src, size_t bytes) {
      b.reset(bytes);
      CUDA_CHECK(cudaMemcpy(b.get(), src, bytes, cudaMemcpyHostToDevice));
    };
    const size_t td = static_cast<size_t>(T) * D;
    const auto yv = bf16s(td * kTopk, 0.0f), sv = bf16s(td, 0.0f), rv = bf16s(td, 0.0f), nv = bf16s(D, 1.0f);
    std::vector<int32_t> m(static_cast<size_t>(T) * kTopk);
    std::vector<float> wv(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = i % 7 == 3 ? -1 : static_cast<int32_t>(i);
      wv[i] = 0.05f + 0.1f * static_cast<float>(i % 5);
    }
    put(y, yv.data(), yv.size() * 2);
    put(shared, sv.data(), sv.size() * 2);
    put(residual, rv.data(), rv.size() * 2);
    put(norm_w, nv.data(), nv.size() * 2);
    put(e2p, m.data(), m.size() * 4);
    put(w, wv.data(), wv.size() * 4);
    out.reset(td * 2);
  }
  TpFinalizeNormCall call(int T, int D, cudaStream_t s) {
    TpFinalizeNormCall c;
    c.T = T;
    c.expert_out = moe::MoeTensor(y.get(), DType::kBF16, T, kTopk, D);
    c.expanded_to_permuted = moe::MoeTensor(e2p.get(), DType::kI32, static_cast<int64_t>(T) * kTopk);
    c.topk_weights = moe::MoeTensor(w.get(), DType::kF32, T, kTopk);
    c.shared_out = moe::MoeTensor(shared.get(), DType::kBF16, T, D);
    c.residual = residual.get();
    c.norm_w = norm_w.get();
    c.y = out.get();
    c.stream = s;
    return c;
  }
};

TpFinalizeNormSetup setup_for(int rank, int world, int D, int knob, const allreduce::RankView* peer, bool access,
                              AllReduce* fallback) {
  TpFinalizeNormSetup s;
  s.rank = rank;
  s.world = world;
  s.D = D;
  s.TOPK = kTopk;
  s.max_tokens = 16;
  s.fused_max_tokens = knob;
  s.peer = peer;
  s.peer_access = access;
  s.fallback = fallback;
  return s;
}

// Median microseconds of one replay of `g` on `s` (kSamples samples of kReplays back-to-back replays).
double time_graph(cudaGraphExec_t g, cudaStream_t s) {
  for (int i = 0; i < kWarmup; ++i) CUDA_CHECK(cudaGraphLaunch(g, s));
  CudaEvent a, b;
  std::vector<double> t;
  for (int i = 0; i < kSamples; ++i) {
    a.record(s);
    for (int j = 0; j < kReplays; ++j) CUDA_CHECK(cudaGraphLaunch(g, s));
    b.record(s);
    t.push_back(1000.0 * b.elapsed_since(a) / kReplays);
  }
  return median(t);
}

// ---------------------------------------------------------------------------------------- simulated ranks
struct SimResult {
  double fused_us = 0, unfused_us = 0;
};

SimResult bench_simulated(int R, int D, int T) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  auto bufs = PeerBuffers::create_simulated(R, static_cast<size_t>(16) * D, dev);
  CudaStream origin;
  std::vector<std::unique_ptr<CudaStream>> streams;
  std::vector<std::unique_ptr<PeerAllReduce>> ars;
  std::vector<std::unique_ptr<RankInputs>> in;
  std::vector<std::unique_ptr<TpFinalizeNorm>> fused, unfused;
  for (int r = 0; r < R; ++r) {
    streams.push_back(std::make_unique<CudaStream>());
    bufs[r]->bind_stream(streams[r]->get());
    ars.push_back(std::make_unique<PeerAllReduce>(bufs[r]->view()));
    in.push_back(std::make_unique<RankInputs>(T, D, 1000 * R + 10 * T + r));
    fused.push_back(std::make_unique<TpFinalizeNorm>(setup_for(r, R, D, 16, &bufs[r]->view(), true, ars[r].get())));
    unfused.push_back(std::make_unique<TpFinalizeNorm>(setup_for(r, R, D, 0, &bufs[r]->view(), true, ars[r].get())));
  }
  CudaEvent fork;
  std::vector<std::unique_ptr<CudaEvent>> joins(R);
  for (auto& j : joins) j = std::make_unique<CudaEvent>();
  auto capture = [&](std::vector<std::unique_ptr<TpFinalizeNorm>>& path) {
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(origin.get(), cudaStreamCaptureModeThreadLocal));
    fork.record(origin.get());
    for (int r = 0; r < R; ++r) {
      CUDA_CHECK(cudaStreamWaitEvent(streams[r]->get(), fork.get(), 0));
      path[r]->run(in[r]->call(T, D, streams[r]->get()));
      joins[r]->record(streams[r]->get());
      CUDA_CHECK(cudaStreamWaitEvent(origin.get(), joins[r]->get(), 0));
    }
    CUDA_CHECK(cudaStreamEndCapture(origin.get(), &g));
    cudaGraphExec_t e;
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return e;
  };
  SimResult res;
  cudaGraphExec_t gf = capture(fused), gu = capture(unfused);
  res.fused_us = time_graph(gf, origin.get());
  res.unfused_us = time_graph(gu, origin.get());
  origin.sync();
  for (auto& b : bufs) b->check();
  CUDA_CHECK(cudaGraphExecDestroy(gf));
  CUDA_CHECK(cudaGraphExecDestroy(gu));
  return res;
}

int run_simulated() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const int resident = allreduce::device_resident_blocks(dev);
  std::printf("# fused finalize + all-reduce + RMSNorm, TP ranks simulated on one %s (%d resident blocks)\n",
              prop.name, resident);
  std::printf("# fused_us: one TP step of all R ranks (fused kernel per rank); unfused_us: moe_finalize + one-shot\n"
              "# peer all-reduce + add_rmsnorm per rank; graph replays, median of %d x %d; TOPK %d, bf16.\n"
              "# Simulated ranks share one GPU's SMs and memory: these rank the paths, they are not multi-GPU times.\n\n",
              kSamples, kReplays, kTopk);
  std::printf("| D | TP | T | grid (chunks x vpt) | fused_us | unfused_us | unfused / fused |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int D : kHidden)
    for (int R : {2, 4, 8})
      for (int T : kTokens) {
        const auto g = allreduce::fused_ar_norm_grid(T, D, R, resident);
        const SimResult r = bench_simulated(R, D, T);
        std::printf("| %d | %d | %d | %d x %d | %.2f | %.2f | %.2fx |\n", D, R, T, g ? g->chunks : 0, g ? g->vpt : 0,
                    r.fused_us, r.unfused_us, r.unfused_us / r.fused_us);
        std::fflush(stdout);
      }
  return 0;
}

// ------------------------------------------------------------------------------------- one process per GPU
int run_nccl_rank(const RankEnv& env) {
  CUDA_CHECK(cudaSetDevice(env.device));
  CommOptions opt;
  opt.timeout_s = 120;
  auto comm = Communicator::from_rank_env(env, opt);
  auto bufs = PeerBuffers::create_ipc(*comm, static_cast<size_t>(16) * 7168);
  CudaStream stream;
  bufs->bind_stream(stream.get());
  std::unique_ptr<PeerAllReduce> peer_ar;
  if (bufs->peer_access()) peer_ar = std::make_unique<PeerAllReduce>(bufs->view());
  const int R = env.world;
  if (env.rank == 0) {
    std::printf("# fused finalize + all-reduce + RMSNorm, TP %d, one process per GPU; peer access: %s\n", R,
                bufs->peer_access() ? "yes" : "NO (fused path unavailable)");
    std::printf("| D | TP | T | fused_us | unfused_us (NCCL) | unfused / fused |\n|---|---|---|---|---|---|\n");
  }
  DeviceBuffer barrier(16);
  for (int D : kHidden)
    for (int T : kTokens) {
      RankInputs in(T, D, 77 * env.rank + T);
      TpFinalizeNorm fused(setup_for(env.rank, R, D, 16, bufs->peer_access() ? &bufs->view() : nullptr,
                                     bufs->peer_access(), comm.get()));
      TpFinalizeNorm unfused(setup_for(env.rank, R, D, 0, nullptr, false, comm.get()));
      auto capture = [&](TpFinalizeNorm& t) {
        cudaGraph_t g;
        CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
        t.run(in.call(T, D, stream.get()));
        CUDA_CHECK(cudaStreamEndCapture(stream.get(), &g));
        cudaGraphExec_t e;
        CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
        return e;
      };
      double t_f = 0, t_u = 0;
      for (int path = 0; path < 2; ++path) {
        if (path == 0 && !bufs->peer_access()) continue;
        cudaGraphExec_t g = capture(path == 0 ? fused : unfused);
        comm->all_reduce(barrier.get(), barrier.get(), 4, DType::kF32, stream.get());  // line the ranks up
        stream.sync();
        (path == 0 ? t_f : t_u) = time_graph(g, stream.get());
        stream.sync();
        CUDA_CHECK(cudaGraphExecDestroy(g));
      }
      comm->check();
      if (bufs->peer_access()) bufs->check();
      // The slowest rank's medians.
      char mine[32];
      std::snprintf(mine, sizeof mine, "%12.3f %12.3f", t_f, t_u);
      double worst_f = 0, worst_u = 0;
      for (const auto& s : comm->all_gather_bytes(std::string(mine, 25))) {
        double f = 0, u = 0;
        std::sscanf(s.c_str(), "%lf %lf", &f, &u);
        worst_f = std::max(worst_f, f);
        worst_u = std::max(worst_u, u);
      }
      if (env.rank == 0) {
        std::printf("| %d | %d | %d | %.2f | %.2f | %.2fx |\n", D, R, T, worst_f, worst_u,
                    worst_f > 0 ? worst_u / worst_f : 0.0);
        std::fflush(stdout);
      }
    }
  return 0;
}

int run_nccl_launcher(int only_tp) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (!nccl_available()) {
    std::printf("--nccl: this build has no NCCL (DELTASERVE_NCCL=OFF)\n");
    return 0;
  }
  int rc = 0;
  for (int tp : {2, 4, 8}) {
    if (only_tp && tp != only_tp) continue;
    if (tp > n) {
      std::printf("--nccl: TP %d skipped (%d GPU(s) visible)\n", tp, n);
      continue;
    }
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) throw std::runtime_error("cannot resolve /proc/self/exe");
    exe[len] = '\0';
    LaunchSpec spec;
    spec.argv = {exe, "--nccl"};
    spec.nprocs = tp;
    const LaunchResult res = launch_ranks(spec);
    std::printf("# TP %d: %s\n\n", tp, res.message.c_str());
    if (res.exit_code != 0) rc = res.exit_code;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // Simulated ranks need one hardware queue per rank stream (see tests/kernels/allreduce_test_common.h).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);  // lazy loading can wait on a spinning rank kernel (tests)
  bool nccl = false;
  int tp = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nccl") nccl = true;
    else if (a == "--tp" && i + 1 < argc) tp = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--nccl [--tp N]]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (nccl) {
      if (const auto env = rank_env_from_environment()) return run_nccl_rank(*env);
      return run_nccl_launcher(tp);
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::printf("fused_ar_bench: no CUDA GPU, nothing to measure\n");
      return 0;
    }
    return run_simulated();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fused_ar_bench: %s\n", e.what());
    return 1;
  }
}
