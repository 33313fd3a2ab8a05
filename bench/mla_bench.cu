// MLA benchmark: weight-absorbed split-K decode attention (q absorption + split kernel + merge/up-projection) at
// contexts 1k..128k, batch 1 and 16, 32 heads, page size 64 with shuffled page tables; GB/s on the latent-cache
// bytes read (N * ctx * 1152 B) against the copy bandwidth measured in the same run. Plus expanded prefill
// (gather + kv_b GEMM + causal attention) at two shapes. CUDA events, warm-up, median of 15 samples of 10 calls,
// random inputs; caches below 256 MB are rotated over copies so the numbers are HBM, not L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/mla/mla.h"
#include "bench_util.cuh"

using namespace ds;
using namespace ds::bench;

namespace {

constexpr int kH = 32, kPage = 64;

void bench_decode(int N, int ctx, int sms, double bw, int variant) {
  const int pages_per_seq = (ctx + kPage - 1) / kPage, pages = N * pages_per_seq;
  const size_t cache_elems = static_cast<size_t>(pages) * kPage * mla::kRow;
  const size_t cache_bytes = cache_elems * 2;
  const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / cache_bytes + 1, 1, 64));
  std::vector<DeviceBuffer> caches;
  for (int c = 0; c < copies; ++c) {
    caches.emplace_back(cache_bytes);
    fill(caches.back(), cache_elems, 5 + c, 4.0f);
  }
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  auto dtable = upload(table);
  auto dctx = upload(std::vector<int32_t>(N, ctx));
  const int qs = kH * mla::kQk + mla::kRow;
  DeviceBuffer q(static_cast<size_t>(N) * qs * 2), wkv(static_cast<size_t>(kH) * 256 * mla::kLatent * 2),
      out(static_cast<size_t>(N) * kH * mla::kValue * 2);
  fill(q, static_cast<size_t>(N) * qs, 7, 2.0f);
  fill(wkv, static_cast<size_t>(kH) * 256 * mla::kLatent, 8, 0.1f);
  const int splits = mla::decode_num_splits(90, sms, N, kH, ctx);
  DeviceBuffer ws(mla::decode_workspace_bytes(N, kH, splits));
  mla::DecodeParams p;
  p.q = q.get<bf16_t>();
  p.q_stride = qs;
  p.wkv_b = wkv.get<bf16_t>();
  p.cache = {nullptr, dtable.get<int32_t>(), kPage, pages_per_seq};
  p.ctx_lens = dctx.get<int32_t>();
  p.N = N;
  p.H = kH;
  p.num_splits = splits;
  p.variant = variant;
  p.scale = 1.0f / std::sqrt(192.0f);
  p.workspace = ws.get();
  p.out = out.get<bf16_t>();
  const double ms = time_ms([&](int i) {
    p.cache.data = caches[i % copies].get<bf16_t>();
    mla::decode(p, nullptr);
  });
  // The same step captured in CUDA graphs (one per cache copy, at most 16) and replayed: no launch gaps.
  CudaStream stream;
  std::vector<cudaGraphExec_t> execs;
  for (int c = 0; c < std::min(copies, 16); ++c) {
    p.cache.data = caches[c].get<bf16_t>();
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    mla::decode(p, stream.get());
    CUDA_CHECK(cudaStreamEndCapture(stream.get(), &g));
    cudaGraphExec_t e;
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    execs.push_back(e);
  }
  const double ms_graph = time_ms([&](int i) { CUDA_CHECK(cudaGraphLaunch(execs[i % execs.size()], nullptr)); });
  for (auto e : execs) CUDA_CHECK(cudaGraphExecDestroy(e));
  const double read = static_cast<double>(N) * ctx * mla::kRow * 2;  // the cache rows actually attended
  const double gbs = read / (ms * 1e-3) / 1e9, gbs_graph = read / (ms_graph * 1e-3) / 1e9;
  std::printf("| decode v%d | %d | %d | %d | %d | %.1f | %.0f | %.1f | %.1f | %.0f | %.1f |\n", variant, N, ctx, kH,
              splits, ms * 1e3, gbs, 100.0 * gbs / bw, ms_graph * 1e3, gbs_graph, 100.0 * gbs_graph / bw);
  std::fflush(stdout);
}

void bench_prefill(int past, int tn) {
  const int ctx = past + tn, pages_per_seq = (ctx + kPage - 1) / kPage;
  DeviceBuffer cache(static_cast<size_t>(pages_per_seq) * kPage * mla::kRow * 2);
  fill(cache, static_cast<size_t>(pages_per_seq) * kPage * mla::kRow, 3, 4.0f);
  std::vector<int32_t> table(pages_per_seq);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(2));
  auto dtable = upload(table);
  auto dcu = upload(std::vector<int32_t>{0, tn}), dctx = upload(std::vector<int32_t>{ctx}),
       dcuctx = upload(std::vector<int32_t>{0, ctx});
  const int qs = kH * mla::kQk + mla::kRow;
  DeviceBuffer q(static_cast<size_t>(tn) * qs * 2), wkv(static_cast<size_t>(kH) * 256 * mla::kLatent * 2),
      out(static_cast<size_t>(tn) * kH * mla::kValue * 2), ws(mla::prefill_workspace_bytes(ctx, kH));
  fill(q, static_cast<size_t>(tn) * qs, 4, 2.0f);
  fill(wkv, static_cast<size_t>(kH) * 256 * mla::kLatent, 5, 0.1f);
  mla::PrefillParams p;
  p.q = q.get<bf16_t>();
  p.q_stride = qs;
  p.wkv_b = wkv.get<bf16_t>();
  p.cache = {cache.get<bf16_t>(), dtable.get<int32_t>(), kPage, pages_per_seq};
  p.cu_seqlens = dcu.get<int32_t>();
  p.ctx_lens = dctx.get<int32_t>();
  p.cu_ctx = dcuctx.get<int32_t>();
  p.N = 1, p.H = kH, p.T = tn, p.total_ctx = ctx, p.max_new_tokens = tn;
  p.scale = 1.0f / std::sqrt(192.0f);
  p.workspace = ws.get();
  p.out = out.get<bf16_t>();
  gemm::GemmRunner runner;
  const double ms = time_ms([&](int) { mla::prefill(runner, p, nullptr); }, 3, 9);
  // Useful FLOPs: kv expansion 2*ctx*512*H*256, causal attention 2*H*(192+128)*sum_i(past+i+1).
  const double pairs = static_cast<double>(tn) * past + static_cast<double>(tn) * (tn + 1) / 2.0;
  const double flop = 2.0 * ctx * 512 * kH * 256 + 2.0 * kH * (192 + 128) * pairs;
  std::printf("| prefill | 1 | past %d + new %d | %d | - | %.1f | %.1f TFLOP/s | %.1f %% of bf16 peak 804 |\n", past,
              tn, kH, ms * 1e3, flop / (ms * 1e-3) / 1e12, 100.0 * flop / (ms * 1e-3) / 1e12 / 804.0);
  std::fflush(stdout);
}

}  // namespace

int main() {
  if (cudaFree(nullptr) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double bw = copy_bandwidth_gbs();
  std::printf("# mla_bench on %s (%d SMs): copy bandwidth %.0f GB/s (read + write, 1 GiB)\n", prop.name,
              prop.multiProcessorCount, bw);
  std::printf("| op | N | ctx | H | splits | eager us | cache GB/s | %% copy bw | graph us | GB/s | %% copy bw |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int N : {1, 16})
    for (int ctx : {1024, 4096, 16384, 32768, 65536, 131072})
      for (int variant : {1, 2}) bench_decode(N, ctx, prop.multiProcessorCount, bw, variant);
  bench_prefill(0, 4096);
  bench_prefill(8192, 1024);
  return 0;
}
