// DEP MoE layers of CudaForward: attention is data-parallel (each rank its own batch), experts are split over
// the ranks, so every MoE layer sends each token to the ranks that own its routed experts and gets back one
// partial output per rank (docs/parallel.md, "DEP flow"). Eager only: the per-rank counts are host-known
// (routes copied to the host, counts and routes exchanged over the group's host channel).
#include "runtime/cuda_forward_impl.h"

#if defined(DELTASERVE_WITH_CUDA)

#include <cstring>

#include "kernels/embed/embed.h"
#include "kernels/util/util.h"
#include "runtime/dep_dispatch.h"

namespace ds {

void CudaForward::Impl::allocate_dep(size_t& off, const std::function<void(void**, size_t)>& take) {
  (void)off;
  const size_t W = static_cast<size_t>(group->world()), Rw = W * R, K = cfg.num_experts_per_token, b16 = 2;
  take(reinterpret_cast<void**>(&dep_send), Rw * D * b16);
  take(reinterpret_cast<void**>(&dep_recv), Rw * D * b16);
  take(reinterpret_cast<void**>(&dep_out), Rw * D * b16);
  take(reinterpret_cast<void**>(&dep_back), Rw * D * b16);
  take(reinterpret_cast<void**>(&dep_comb), Rw * D * b16);
  take(reinterpret_cast<void**>(&dep_shared), static_cast<size_t>(R) * D * b16);
  take(reinterpret_cast<void**>(&dep_recv_ids), Rw * K * 4);
  take(reinterpret_cast<void**>(&dep_recv_w), Rw * K * 4);
  take(reinterpret_cast<void**>(&dep_send_idx), Rw * 4);
  take(reinterpret_cast<void**>(&dep_comb_idx), Rw * 4);
  take(reinterpret_cast<void**>(&dep_ones), Rw * 4);
  // Host staging: this rank's routes (ids + weights) and the uploads (received routes, two index arrays).
  dep_host = PinnedBuffer((static_cast<size_t>(R) * K * 2 + Rw * K * 2 + Rw * 2) * 4);
}

void CudaForward::Impl::moe_layer_dep(const DeviceLayer& l, int layer, int T) {
  cudaStream_t s = stream.get();
  const int W = group->world(), me = group->rank(), K = cfg.num_experts_per_token;
  const int EL = model->shard.expert_end - model->shard.expert_begin;
  const size_t Rw = static_cast<size_t>(W) * R, row_bytes = static_cast<size_t>(D) * sizeof(bf16_t);
  // The staging buffer is reused by every layer: the previous layer's uploads must have left it.
  CUDA_CHECK(cudaStreamSynchronize(s));
  int32_t* h_ids = dep_host.get<int32_t>();
  float* h_w = reinterpret_cast<float*>(h_ids + static_cast<size_t>(R) * K);
  int32_t* h_rids = reinterpret_cast<int32_t*>(h_w + static_cast<size_t>(R) * K);
  float* h_rw = reinterpret_cast<float*>(h_rids + Rw * K);
  int32_t* h_send_idx = reinterpret_cast<int32_t*>(h_rw + Rw * K);
  int32_t* h_comb_idx = h_send_idx + Rw;

  // 1. Route this rank's tokens (the router is whole on every rank) and bring the routes to the host.
  if (T > 0) {
    route_rows(l, layer, T);
    CUDA_CHECK(cudaMemcpyAsync(h_ids, topk_ids, sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(h_w, topk_w, sizeof(float) * T * K, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // 2. Tokens per destination rank, exchanged with their route rows (host collective; every rank, every layer).
  const dep::Dispatch dp = dep::plan_dispatch(h_ids, h_w, T, K, W, EL);
  const dep::Received rc = dep::parse_received(group->exchange(dp.message), me, W, K);
  const size_t Ts = dp.send_idx.size(), Tr = rc.total;
  CHECK(Tr <= Rw && Ts <= Rw, "DEP: {} received / {} sent rows exceed the {}-row buffers", Tr, Ts, Rw);
  const std::vector<size_t>&send_rows = dp.send_rows, &send_off = dp.send_off, &recv_rows = rc.rows,
                        &recv_off = rc.off;

  // 3. Rows to send (gathered by token index) and the received routes, on the device.
  if (Ts > 0) {
    std::memcpy(h_send_idx, dp.send_idx.data(), Ts * 4);
    CUDA_CHECK(cudaMemcpyAsync(dep_send_idx, h_send_idx, Ts * 4, cudaMemcpyHostToDevice, s));
    op(OpCat::kMoe, "dep.gather_send", [&] {
      embed::embed_lookup({dep_send_idx, x, dep_send, static_cast<int>(Ts), T, D}, s);
    });
  }
  if (Tr > 0) {
    std::memcpy(h_rids, rc.ids.data(), Tr * K * 4);
    std::memcpy(h_rw, rc.weights.data(), Tr * K * 4);
    CUDA_CHECK(cudaMemcpyAsync(dep_recv_ids, h_rids, Tr * K * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(dep_recv_w, h_rw, Tr * K * 4, cudaMemcpyHostToDevice, s));
  }
  auto bytes = [&](std::vector<size_t> v) {
    for (auto& b : v) b *= row_bytes;
    return v;
  };

  // 4. Dispatch, this rank's experts on what it received, combine back.
  op(OpCat::kMoe, "dep.dispatch", [&] {
    group->all_to_allv(dep_send, bytes(send_rows), bytes(send_off), dep_recv, bytes(recv_rows), bytes(recv_off), s);
  });
  if (Tr > 0) {
    moe::MoeParams p = moe_call(l, layer, static_cast<int>(Tr));  // no shared expert in the op under DEP
    p.x = dep_recv;
    p.topk_ids_in = dep_recv_ids;
    p.topk_weights_in = dep_recv_w;
    p.out = dep_out;  // sum over this rank's routes of w * y: one bf16 partial per received row
    op(OpCat::kMoe, "moe", [&] { moe::moe_forward(p); });
  }
  op(OpCat::kMoe, "dep.combine", [&] {
    group->all_to_allv(dep_out, bytes(recv_rows), bytes(recv_off), dep_back, bytes(send_rows), bytes(send_off), s);
  });
  if (T == 0) return;

  // 5. h += sum over ranks (rank order) of the partials + shared expert, one fp32 sum (moe_finalize with the
  //    ranks as its "routes", weight 1, a missing rank's row -1).
  std::memcpy(h_comb_idx, dp.comb_idx.data(), sizeof(int32_t) * T * W);
  CUDA_CHECK(cudaMemcpyAsync(dep_comb_idx, h_comb_idx, sizeof(int32_t) * T * W, cudaMemcpyHostToDevice, s));
  op(OpCat::kMoe, "dep.gather_partials", [&] {
    embed::embed_lookup({dep_comb_idx, dep_back, dep_comb, T * W, static_cast<int>(Ts), D}, s);
  });
  const bool shared = l.e.shared_dense.down.w.data != nullptr;
  if (shared) {
    const int Is = static_cast<int>(l.e.shared_dense.down.K());
    linear("moe.shared_gate_up", x, T, D, l.e.shared_dense.gate_up, gu);
    op(OpCat::kMoe, "moe.shared_silu_mul",
       [&] { util::silu_mul({gu, 2 * static_cast<int64_t>(Is), act, T, Is}, s); });
    linear("moe.shared_down", act, T, Is, l.e.shared_dense.down, dep_shared);
  }
  op(OpCat::kMoe, "dep.finalize", [&] {
    moe::FinalizeParams f;
    f.expert_out = moe::MoeTensor(dep_comb, DType::kBF16, T, W, D);
    f.expanded_to_permuted = moe::MoeTensor(dep_comb_idx, DType::kI32, static_cast<int64_t>(T) * W);
    f.topk_weights = moe::MoeTensor(dep_ones, DType::kF32, T, W);
    if (shared) f.shared_out = moe::MoeTensor(dep_shared, DType::kBF16, T, D);
    f.residual = moe::MoeTensor(h, DType::kBF16, T, D);
    f.out = moe::MoeTensor(h, DType::kBF16, T, D);
    f.stream = s;
    moe::moe_finalize(f);
  });
}

void CudaForward::Impl::step_idle() {
  CHECK(dep, "CudaForward::step_idle: only DEP ranks run idle steps");
  NvtxRange r("idle_step");
  step_tokens = 0;
  for (size_t i = 0; i < model->layers.size(); ++i)
    if (model->layers[i].moe) moe_layer_dep(model->layers[i], static_cast<int>(i), 0);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  group->check();
  last = StepProfile{};
  last_samples = 0;
}

}  // namespace ds

#endif  // DELTASERVE_WITH_CUDA
