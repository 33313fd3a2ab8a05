// The tensor-parallel layer boundary on one GPU with simulated ranks (PeerBuffers::create_simulated, one stream
// per rank): the fused path and the unfused path (moe_finalize -> one-shot peer all-reduce -> add_rmsnorm) give
// the same residual bits and the same normalised output up to the RMSNorm reduction order; the knob picks the
// path by batch size.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/cuda_utils.h"
#include "runtime/parallel/peer_buffers.h"
#include "runtime/parallel/tp_finalize.h"
#include "tests/kernels/allreduce_test_common.h"
#include "tests/test_util.h"

namespace ds::parallel {
namespace {

using namespace allreduce::simtest;

struct RankOutputs {
  std::vector<uint16_t> residual, y;
};

// Runs every rank of `pb` through TpFinalizeNorm with the given knob value; returns rank 0's outputs after
// checking that every rank holds the same bits and that each call took the expected path.
RankOutputs run_ranks(const Problem& pb, int knob, bool expect_fused, const std::string& tag) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  auto bufs = PeerBuffers::create_simulated(pb.R, static_cast<size_t>(16) * pb.D, dev);
  std::vector<std::unique_ptr<CudaStream>> streams;
  std::vector<std::unique_ptr<PeerAllReduce>> ars;
  std::vector<std::unique_ptr<TpFinalizeNorm>> tps;
  const size_t td = static_cast<size_t>(pb.T) * pb.D;
  std::vector<DeviceBuffer> res, y;
  for (int r = 0; r < pb.R; ++r) {
    streams.push_back(std::make_unique<CudaStream>());
    bufs[r]->bind_stream(streams[r]->get());
    bufs[r]->set_timeout(5.0);
    ars.push_back(std::make_unique<PeerAllReduce>(bufs[r]->view()));
    TpFinalizeNormSetup s;
    s.rank = r;
    s.world = pb.R;
    s.D = pb.D;
    s.TOPK = pb.K;
    s.dtype = pb.dt;
    s.max_tokens = 16;
    s.fused_max_tokens = knob;
    s.peer = &bufs[r]->view();
    s.peer_access = bufs[r]->peer_access();
    s.fallback = ars[r].get();
    tps.push_back(std::make_unique<TpFinalizeNorm>(s));
    res.push_back(upload(to_bits(pb.dt, pb.residual)));
    y.emplace_back(td * 2);
    CUDA_CHECK(cudaMemset(y.back().get(), 0xFF, td * 2));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < pb.R; ++r) {
    TpFinalizeNormCall c;
    c.T = pb.T;
    c.expert_out = moe::MoeTensor(const_cast<void*>(pb.dy[r].get()), pb.dt, pb.T, pb.K, pb.D);
    c.expanded_to_permuted = moe::MoeTensor(pb.de2p[r].get(), DType::kI32, static_cast<int64_t>(pb.T) * pb.K);
    c.topk_weights = moe::MoeTensor(pb.dw[r].get(), DType::kF32, pb.T, pb.K);
    if (!pb.shared[r].empty()) c.shared_out = moe::MoeTensor(pb.dshared[r].get(), pb.dt, pb.T, pb.D);
    c.residual = res[r].get();
    c.norm_w = pb.dnorm.get();
    c.y = y[r].get();
    c.stream = streams[r]->get();
    EXPECT_EQ(tps[r]->run(c), expect_fused) << tag << " rank " << r;
  }
  for (auto& s : streams) s->sync();
  for (auto& b : bufs) EXPECT_NO_THROW(b->check()) << tag;
  RankOutputs o{download16(res[0].get(), td), download16(y[0].get(), td)};
  for (int r = 1; r < pb.R; ++r) {
    EXPECT_EQ(count_different(download16(res[r].get(), td), o.residual), 0) << tag << " residual of rank " << r;
    EXPECT_EQ(count_different(download16(y[r].get(), td), o.y), 0) << tag << " y of rank " << r;
  }
  return o;
}

TEST(ParallelTpFinalize, FusedEqualsUnfused) {
  SKIP_WITHOUT_GPU();
  for (int R : {2, 4, 8})
    for (int D : {2304, 7168})
      for (int T : {1, 2, 16}) {
        const Problem pb(DType::kBF16, R, T, D, 8, true, 11 * R + D + T);
        const std::string tag = fmt::format("R={} D={} T={}", R, D, T);
        const auto fused = run_ranks(pb, 16, true, tag + " fused");
        const auto unfused = run_ranks(pb, 0, false, tag + " unfused");
        // Same partials, same rank-ordered sum, same roundings: the residual is bit-identical. y differs only
        // where the two RMSNorm reductions (different summation trees) round rsqrt differently.
        EXPECT_EQ(count_different(fused.residual, unfused.residual), 0) << tag;
        std::printf("[paths] %-24s y differing values: %lld of %zu\n", tag.c_str(),
                    static_cast<long long>(count_different(fused.y, unfused.y)), fused.y.size());
        EXPECT_CLOSE(tag + " fused vs unfused y", from_bits(pb.dt, fused.y), from_bits(pb.dt, unfused.y), 5e-3);
        std::vector<float> ref_res, ref_y;
        pb.reference(ref_res, ref_y);
        EXPECT_CLOSE(tag + " fused y vs reference", from_bits(pb.dt, fused.y), ref_y, 1e-2);
      }
}

TEST(ParallelTpFinalize, KnobPicksThePathByBatchSize) {
  SKIP_WITHOUT_GPU();
  for (int T : {1, 2, 3, 9}) {
    const Problem pb(DType::kBF16, 4, T, 2304, 8, false, 500 + T);
    const auto out = run_ranks(pb, 2, T <= 2, fmt::format("knob 2, T={}", T));
    std::vector<float> ref_res, ref_y;
    pb.reference(ref_res, ref_y);
    EXPECT_CLOSE(fmt::format("T={} y", T), from_bits(pb.dt, out.y), ref_y, 1e-2);
    EXPECT_CLOSE(fmt::format("T={} residual", T), from_bits(pb.dt, out.residual), ref_res, 1e-2);
  }
}

}  // namespace
}  // namespace ds::parallel
