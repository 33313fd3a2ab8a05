// Shared by the simulated-rank GPU tests of the fused finalize + all-reduce + RMSNorm (kernels and runtime):
// per-rank MoE outputs with their CPU reference, R buffer sets on one device, dtype helpers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "core/dtype.h"
#include "kernels/allreduce/allreduce.h"
#include "kernels/allreduce/allreduce_ref.h"
#include "tests/test_util.h"

namespace ds::allreduce::simtest {

// Simulated ranks need one hardware queue per stream: streams that share one of CUDA's default 8 connections
// can be serialised, and a rank kernel spinning on its peer would then wait for a kernel queued behind it (the
// protocol's timeout would report it). Read when the CUDA context is created, so set before main().
// EAGER module loading: with CUDA's default lazy loading, the first launch of a kernel on one simulated rank's
// stream waited for another rank's spinning all-reduce kernel (H200 run, 2026-12-02: one case of
// ParallelTpFinalize.FusedEqualsUnfused timed out at its first D = 7168 launch). Real ranks are separate
// processes on separate GPUs and do not share a context.
inline const int kConnections = [] {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  return setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
}();

inline uint16_t to_bits(DType dt, float v) { return dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v); }
inline float from_bits(DType dt, uint16_t b) { return dt == DType::kBF16 ? bf16_to_f32(b) : f16_to_f32(b); }
inline std::vector<uint16_t> to_bits(DType dt, const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = to_bits(dt, v[i]);
  return b;
}
inline std::vector<float> from_bits(DType dt, const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = from_bits(dt, b[i]);
  return v;
}
inline std::vector<float> rand_act(DType dt, size_t n, uint64_t seed, float stddev, float mean = 0.0f) {
  auto v = test::randn(n, seed, stddev, mean);
  for (auto& x : v) x = round_act(dt, x);
  return v;
}
inline std::vector<uint16_t> download16(const void* p, size_t n) {
  std::vector<uint16_t> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return v;
}

// R buffer sets on this device and one stream per rank.
struct SimRanks {
  int R;
  std::vector<DeviceBuffer> bufs;
  std::vector<std::unique_ptr<CudaStream>> streams;
  std::vector<RankView> views;
  SimRanks(int R_, size_t slot_elems, double timeout_s = 5.0) : R(R_) {
    (void)kConnections;  // odr-use: the initialiser above must be emitted
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const int resident = device_resident_blocks(dev);
    std::vector<void*> bases;
    for (int r = 0; r < R; ++r) {
      bufs.emplace_back(buffer_bytes(R, slot_elems));
      init_buffers(bufs.back().get(), R, slot_elems, nullptr);
      bases.push_back(bufs.back().get());
      streams.push_back(std::make_unique<CudaStream>());
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < R; ++r) {
      views.push_back(make_rank_view(bases.data(), r, R, slot_elems));
      views.back().co_resident_ranks = R;
      views.back().resident_blocks = resident;
      views.back().timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
      views.back().owner_stream = streams[r]->get();
    }
  }
  void sync() {
    for (auto& s : streams) s->sync();
  }
  // Every rank's sticky error word, described (empty when all are healthy).
  std::string errors() {
    std::string s;
    for (int r = 0; r < R; ++r)
      if (const uint32_t e = read_error(views[r])) s += "rank " + std::to_string(r) + ": " + describe_error(e) + "; ";
    return s;
  }
};

// One problem: every rank's MoE outputs (host values, already representable in dt) and their device copies.
struct Problem {
  DType dt;
  int R, T, D, K;
  bool shared_everywhere;  // tensor-parallel shared expert (each rank a partial) vs replicated (rank 0 only)
  std::vector<std::vector<float>> y, w, shared;
  std::vector<std::vector<int32_t>> e2p;
  std::vector<float> residual, norm_w;
  std::vector<DeviceBuffer> dy, dw, de2p, dshared;
  DeviceBuffer dres, dnorm;

  Problem(DType dt_, int R_, int T_, int D_, int K_, bool shared_everywhere_, uint64_t seed)
      : dt(dt_), R(R_), T(T_), D(D_), K(K_), shared_everywhere(shared_everywhere_) {
    const size_t td = static_cast<size_t>(T) * D;
    for (int r = 0; r < R; ++r) {
      y.push_back(rand_act(dt, td * K, seed * 100 + r, 0.5f));
      w.push_back(test::randu(static_cast<size_t>(T) * K, seed * 100 + 50 + r, 0.01f, 0.3f));
      std::vector<int32_t> m(static_cast<size_t>(T) * K);
      for (size_t i = 0; i < m.size(); ++i) m[i] = (i * 7 + r * 3 + seed) % 5 == 0 ? -1 : static_cast<int32_t>(i);
      e2p.push_back(m);
      shared.push_back(shared_everywhere || r == 0 ? rand_act(dt, td, seed * 100 + 80 + r, 0.5f) : std::vector<float>());
      dy.push_back(upload(to_bits(dt, y.back())));
      dw.push_back(upload(w.back()));
      de2p.push_back(upload(e2p.back()));
      dshared.push_back(upload(to_bits(dt, shared.back())));
    }
    residual = rand_act(dt, td, seed * 7 + 1, 2.0f);
    norm_w = rand_act(dt, D, seed * 7 + 2, 0.2f, 1.0f);
    dres = upload(to_bits(dt, residual));
    dnorm = upload(to_bits(dt, norm_w));
  }

  FusedArNormParams params(int r, const RankView& v, const void* res, void* res_out, void* out) const {
    FusedArNormParams p;
    p.dtype = dt;
    p.T = T;
    p.D = D;
    p.TOPK = K;
    p.eps = 1e-5f;
    p.expert_out = dy[r].get();
    p.expanded_to_permuted = de2p[r].get<int32_t>();
    p.topk_weights = dw[r].get<float>();
    p.shared_out = shared[r].empty() ? nullptr : dshared[r].get();
    p.residual = res;
    p.residual_out = res_out;
    p.norm_w = dnorm.get();
    p.y = out;
    p.comm = v;
    p.stream = v.owner_stream;
    return p;
  }

  void reference(std::vector<float>& res_out, std::vector<float>& out) const {
    const size_t td = static_cast<size_t>(T) * D;
    res_out.assign(td, 0);
    out.assign(td, 0);
    FusedArNormRefArgs a;
    a.dtype = dt;
    a.T = T;
    a.D = D;
    a.TOPK = K;
    for (int r = 0; r < R; ++r) {
      a.expert_out.push_back(y[r].data());
      a.expanded_to_permuted.push_back(e2p[r].data());
      a.topk_weights.push_back(w[r].data());
      a.shared_out.push_back(shared[r].empty() ? nullptr : shared[r].data());
    }
    a.residual = residual.data();
    a.norm_w = norm_w.data();
    a.residual_out = res_out.data();
    a.y = out.data();
    fused_ar_norm_ref(a);
  }
};

inline int64_t count_different(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  return ds::test::count_differing(a, b);
}

}  // namespace ds::allreduce::simtest
