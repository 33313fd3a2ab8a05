// KDA decode and chunked-prefill benchmarks on random inputs: CUDA events, warm-up, medians; decode both
// layouts (eager back-to-back bursts and CUDA-graph replay) against the device-to-device copy bandwidth
// measured in the same run; prefill on the targets-table shapes against the best public timings.
//
//   kda_bench [--decode-only] [--prefill-only] [--quick] [--intra-phases] [--scan-variants] [--silu-variants]
//             [--rmw-ceiling]   (only the in-place streaming ceiling of the decode's state traffic)
// --intra-phases: also the intra kernel's SM cycles per CTA by phase (KdaPrefillParams::intra_phase_cycles).
// --scan-variants: also the scan stage timed in each configuration (KdaPrefillParams::scan_vtiles / scan_stages),
// with each factor loader (scan_loader: cp.async / bulk copies).
// --silu-variants: also the intra kernel and the whole op with each SiLU form of the conv (KdaPrefillParams::
// intra_silu: exact / tanh), alternated, three rounds.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/kda/kda.h"

namespace {

using namespace ds;
using namespace ds::kda;

constexpr size_t kL2Bytes = 60ull << 20;   // H200 L2 (~60 MB): smaller working sets are rotated
constexpr size_t kRotateBytes = 256ull << 20;  // rotate over at least this much state

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = __float2bfloat16(offset + scale * (static_cast<float>(h) * 2.3283064e-10f * 2.0f - 1.0f));
  }
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = offset + scale * (static_cast<float>(h) * 2.3283064e-10f * 2.0f - 1.0f);
  }
}
void rand_bf16(DeviceBuffer& b, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  fill_bf16<<<1024, 256>>>(b.get<__nv_bfloat16>(), b.bytes() / 2, seed, scale, offset);
  CUDA_CHECK(cudaGetLastError());
}
void rand_f32(DeviceBuffer& b, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  fill_f32<<<1024, 256>>>(b.get<float>(), b.bytes() / 4, seed, scale, offset);
  CUDA_CHECK(cudaGetLastError());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `reps` of the per-call time (us) of `burst` back-to-back calls fn(i); prep(rep) runs before each
// rep, outside the timed region (it rotates the inputs).
template <class F, class Prep>
double time_burst(cudaStream_t s, int reps, int burst, F&& fn, Prep&& prep) {
  CudaEvent a, b;
  prep(-1);
  for (int i = 0; i < burst; ++i) fn(i);  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    prep(r);
    a.record(s);
    for (int i = 0; i < burst; ++i) fn(i);
    b.record(s);
    t.push_back(1e3 * b.elapsed_since(a) / burst);
  }
  return median(t);
}
template <class F>
double time_burst(cudaStream_t s, int reps, int burst, F&& fn) {
  return time_burst(s, reps, burst, fn, [](int) {});
}

// The same through a CUDA graph holding the `burst` calls (GPU time without launch gaps).
template <class F, class Prep>
double time_graph(cudaStream_t s, int reps, int burst, F&& fn, Prep&& prep) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < burst; ++i) fn(i);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  prep(-1);
  CUDA_CHECK(cudaGraphLaunch(ge, s));
  CudaEvent a, b;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    prep(r);
    a.record(s);
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    b.record(s);
    t.push_back(1e3 * b.elapsed_since(a) / burst);
  }
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  return median(t);
}

// Device-to-device copy bandwidth, 1 GiB, bytes read + written (core/device.h).
double copy_bandwidth_gbs() { return ds::cuda_copy_bandwidth() / 1e9; }

// Weights and inputs of one layer shape (H heads) for up to max_rows rows.
struct Layer {
  int H, P;
  int64_t ld_proj, ld_fg;
  DeviceBuffer proj, fg, conv_w, A_log, dt_bias, o_norm_w, out;
  Layer(int H_, int max_rows) : H(H_), P(H_ * kHeadDim) {
    ld_proj = 3 * P + ((H + 7) / 8) * 8;
    ld_fg = 2 * P;
    proj.reset(static_cast<size_t>(max_rows) * ld_proj * 2);
    fg.reset(static_cast<size_t>(max_rows) * ld_fg * 2);
    conv_w.reset(static_cast<size_t>(3) * P * kConvWidth * 2);
    A_log.reset(H * 4);
    dt_bias.reset(P * 4);
    o_norm_w.reset(kHeadDim * 4);
    out.reset(static_cast<size_t>(max_rows) * P * 2);
    rand_bf16(proj, 1);
    rand_bf16(fg, 2);
    rand_bf16(conv_w, 3, 0.5f);
    rand_f32(A_log, 4, 0.5f, 0.5f);
    rand_f32(dt_bias, 5, 1.0f, -2.0f);
    rand_f32(o_norm_w, 6, 0.2f, 1.0f);
  }
  template <class Params>
  void fill(Params& p, float* state, bf16_t* conv, int num_slots) const {
    p.H = H;
    p.q = {proj.get<bf16_t>(), ld_proj};
    p.k = {proj.get<bf16_t>() + P, ld_proj};
    p.v = {proj.get<bf16_t>() + 2 * P, ld_proj};
    p.beta_logits = {proj.get<bf16_t>() + 3 * P, ld_proj};
    p.f = {fg.get<bf16_t>(), ld_fg};
    p.gz = {fg.get<bf16_t>() + P, ld_fg};
    p.num_slots = num_slots;
    p.state_pool = state;
    p.conv_pool = conv;
    p.conv_w = conv_w.get<bf16_t>();
    p.A_log = A_log.get<float>();
    p.dt_bias = dt_bias.get<float>();
    p.o_norm_w = o_norm_w.get<float>();
    p.out = out.get<bf16_t>();
    p.out_stride = P;
  }
};

struct DecodeRow {
  int N, H;
  double bytes, many_eager, compact_eager, many_graph, compact_graph;
  double stream_graph;  // the streaming layout (graph replay), N >= 8 only (0 otherwise)
  KdaLayout chosen;     // what the selector picks
  double best_graph() const { return std::min({many_graph, compact_graph, stream_graph > 0 ? stream_graph : 1e30}); }
  double chosen_graph() const {
    return chosen == KdaLayout::kCompact ? compact_graph : chosen == KdaLayout::kStream ? stream_graph : many_graph;
  }
};

std::vector<DecodeRow> bench_decode(cudaStream_t s, double copy_gbs, bool quick) {
  const std::vector<int> Ns = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  const std::vector<int> Hs = quick ? std::vector<int>{2, 8, 32, 96}
                                    : std::vector<int>(std::begin(kCompactHeadCounts), std::end(kCompactHeadCounts));
  const size_t slot_bytes_max = static_cast<size_t>(128) * kHeadDim * kHeadDim * 4;
  // One state pool serves every shape: 4.3 GB = 512 x 128 heads, also >= kRotateBytes for the small ones.
  const size_t pool_bytes = 512 * slot_bytes_max;
  DeviceBuffer state(pool_bytes), conv(pool_bytes / 16), slots(static_cast<size_t>(1) << 20);
  rand_f32(state, 7, 0.5f);
  rand_bf16(conv, 8);
  std::vector<DecodeRow> rows;
  const int reps = quick ? 5 : 15, burst = 20;
  std::printf("\n# KDA decode (K = V = 128), state bytes = N*H*128*128*4*2; copy bandwidth %.0f GB/s\n", copy_gbs);
  std::printf("%5s %4s %10s | %9s %9s | %9s %9s %9s | %7s %7s | %s\n", "N", "H", "state MB", "many us", "cmpct us",
              "many(g)", "cmpct(g)", "strm(g)", "GB/s(g)", "%copy", "auto");
  const KdaDecodeSetup setup = kda_decode_setup();
  for (int H : Hs) {
    Layer layer(H, 512);
    const size_t slot_bytes = static_cast<size_t>(H) * kHeadDim * kHeadDim * 4;
    const int pool_slots = static_cast<int>(pool_bytes / slot_bytes);
    for (int N : Ns) {
      // Rotation: call i of rep r uses slot set (r * burst + i) % sets, disjoint groups of N slots spanning
      // >= kRotateBytes, so a set is reused only after its state has left the L2.
      const double state_rw = static_cast<double>(N) * slot_bytes * 2;
      const int sets = N * slot_bytes >= kL2Bytes ? 1
                       : static_cast<int>(std::min<size_t>(pool_slots / N, kRotateBytes / (N * slot_bytes) + 1));
      std::vector<int32_t> ids(static_cast<size_t>(burst) * N);
      auto prep = [&](int rep) {
        for (int i = 0; i < burst; ++i) {
          const int set = ((rep + 1) * burst + i) % sets;
          for (int j = 0; j < N; ++j) ids[static_cast<size_t>(i) * N + j] = set * N + j;
        }
        CUDA_CHECK(cudaMemcpyAsync(slots.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
      };
      KdaDecodeParams p;
      layer.fill(p, state.get<float>(), conv.get<bf16_t>(), pool_slots);
      p.N = N;
      auto call = [&](KdaLayout layout) {
        return [&, layout](int i) {
          KdaDecodeParams q = p;
          q.slot_ids = slots.get<int32_t>() + static_cast<size_t>(i) * N;
          kda_decode_launch(q, layout, s);
        };
      };
      DecodeRow r{N, H, state_rw};
      r.many_eager = time_burst(s, reps, burst, call(KdaLayout::kMany), prep);
      r.compact_eager = time_burst(s, reps, burst, call(KdaLayout::kCompact), prep);
      r.many_graph = time_graph(s, reps, burst, call(KdaLayout::kMany), prep);
      r.compact_graph = time_graph(s, reps, burst, call(KdaLayout::kCompact), prep);
      r.stream_graph = N >= 8 ? time_graph(s, reps, burst, call(KdaLayout::kStream), prep) : 0.0;
      r.chosen = kda_decode_layout(setup, N, H);
      const double best = r.best_graph();
      std::printf("%5d %4d %10.2f | %9.2f %9.2f | %9.2f %9.2f %9.2f | %7.0f %6.1f%% | %s\n", N, H, state_rw / 1e6,
                  r.many_eager, r.compact_eager, r.many_graph, r.compact_graph, r.stream_graph,
                  state_rw / (best * 1e-6) / 1e9, 100.0 * state_rw / (best * 1e-6) / 1e9 / copy_gbs,
                  kda_layout_name(r.chosen));
      rows.push_back(r);
    }
  }
  return rows;
}

struct PrefillRow {
  int T, N, H;
  double public_us, us, intra_us, scan_us;
};

std::vector<PrefillRow> bench_prefill(cudaStream_t s, bool quick, bool phases, bool scan_variants,
                                      bool silu_variants) {
  struct Shape {
    int tokens, seqs, H;
    double public_us;
  };
  const std::vector<Shape> shapes = {{8192, 1, 32, 1048}, {1024, 8, 32, 425},  {512, 16, 32, 442},
                                     {32768, 1, 32, 3697}, {8192, 1, 64, 1260}, {8192, 1, 96, 1470}};
  std::vector<PrefillRow> rows;
  std::printf("\n# KDA chunked prefill (bf16 in, fp32 state, conv + gate + norm fused)\n");
  std::printf("%6s %4s %4s | %9s %9s %9s | %9s %7s %7s | %10s\n", "tokens", "seqs", "H", "total us", "intra us",
              "scan us", "public us", "ratio", "target", "Mtok/s");
  for (const Shape& sh : shapes) {
    const int T = sh.tokens * sh.seqs, H = sh.H;
    Layer layer(H, T);
    std::vector<int32_t> cu(sh.seqs + 1);
    for (int n = 0; n <= sh.seqs; ++n) cu[n] = n * sh.tokens;
    const auto off = kda_chunk_offsets(cu);
    std::vector<int32_t> ids(sh.seqs);
    for (int n = 0; n < sh.seqs; ++n) ids[n] = n;
    DeviceBuffer d_cu(cu.size() * 4), d_off(off.size() * 4), d_slots(ids.size() * 4);
    CUDA_CHECK(cudaMemcpy(d_cu.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_off.get(), off.data(), off.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_slots.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    const size_t slot_bytes = static_cast<size_t>(H) * kHeadDim * kHeadDim * 4;
    DeviceBuffer state(sh.seqs * slot_bytes), conv(static_cast<size_t>(sh.seqs) * 3 * 3 * H * kHeadDim * 2);
    rand_f32(state, 9, 0.5f);
    rand_bf16(conv, 10);
    KdaPrefillParams p;
    layer.fill(p, state.get<float>(), conv.get<bf16_t>(), sh.seqs);
    p.N = sh.seqs;
    p.T = T;
    p.cu_seqlens = d_cu.get<int32_t>();
    p.chunk_offsets = d_off.get<int32_t>();
    p.num_chunks = off.back();
    p.slot_ids = d_slots.get<int32_t>();
    p.workspace_bytes = kda_prefill_workspace_bytes(p.num_chunks, H);
    DeviceBuffer ws(p.workspace_bytes);
    p.workspace = ws.get();
    const int reps = quick ? 5 : 11;
    PrefillRow r{sh.tokens, sh.seqs, H, sh.public_us};
    r.us = time_burst(s, reps, 1, [&](int) { kda_prefill(p, s); });
    r.intra_us = time_burst(s, reps, 1, [&](int) { kda_prefill_intra(p, s); });
    r.scan_us = time_burst(s, reps, 1, [&](int) { kda_prefill_scan(p, s); });
    std::printf("%6d %4d %4d | %9.1f %9.1f %9.1f | %9.0f %7.2f %7s | %10.2f\n", sh.tokens, sh.seqs, H, r.us,
                r.intra_us, r.scan_us, sh.public_us, r.us / sh.public_us, r.us <= 0.67 * sh.public_us ? "met" : "MISS",
                T / r.us);
    rows.push_back(r);
    if (scan_variants) {  // every scan configuration, forced (kda_prefill_scan_config picks one of them)
      const KdaScanConfig pick = kda_prefill_scan_config(p);
      std::printf("  scan us by V-tiles x stages (rule: %d x %d):", pick.vtiles, pick.stages);
      // Each configuration with each factor loader, the loaders alternated per configuration and the whole round
      // twice, so a drift of the clocks shows as a difference between rounds rather than between loaders.
      for (int round = 0; round < 2; ++round) {
        std::printf("%s", round ? "\n  round 2:" : "");
        for (const KdaScanConfig c :
             {KdaScanConfig{4, 3}, KdaScanConfig{4, 1}, KdaScanConfig{2, 2}, KdaScanConfig{2, 1}}) {
          KdaPrefillParams pv = p;
          pv.scan_vtiles = c.vtiles;
          pv.scan_stages = c.stages;
          pv.scan_loader = kKdaScanLoaderCpAsync;
          const double async_us = time_burst(s, reps, 1, [&](int) { kda_prefill_scan(pv, s); });
          pv.scan_loader = kKdaScanLoaderBulk;
          const double bulk_us = time_burst(s, reps, 1, [&](int) { kda_prefill_scan(pv, s); });
          std::printf(" %dx%d %.1f/%.1f", c.vtiles, c.stages, async_us, bulk_us);
        }
      }
      std::printf("  (us, cp.async/bulk)\n");
    }
    if (silu_variants) {
      std::printf("  silu exact/tanh, intra us | total us:");
      for (int round = 0; round < 3; ++round) {
        double us[2][2];
        for (int v = 0; v < 2; ++v) {
          KdaPrefillParams pv = p;
          pv.intra_silu = v ? kKdaSiluTanh : kKdaSiluExact;
          us[v][0] = time_burst(s, reps, 1, [&](int) { kda_prefill_intra(pv, s); });
          us[v][1] = time_burst(s, reps, 1, [&](int) { kda_prefill(pv, s); });
        }
        std::printf("%s %.1f/%.1f | %.1f/%.1f", round ? ";" : "", us[0][0], us[1][0], us[0][1], us[1][1]);
      }
      std::printf("\n");
    }
    if (phases) {  // one more intra run with the phase counters (timed runs above have none)
      DeviceBuffer cyc(kKdaIntraPhases * sizeof(unsigned long long));
      CUDA_CHECK(cudaMemsetAsync(cyc.get(), 0, kKdaIntraPhases * sizeof(unsigned long long), s));
      KdaPrefillParams pp = p;
      pp.intra_phase_cycles = cyc.get<unsigned long long>();
      kda_prefill_intra(pp, s);
      CUDA_CHECK(cudaStreamSynchronize(s));  // the stream does not order against the legacy stream's copy
      unsigned long long c[kKdaIntraPhases];
      CUDA_CHECK(cudaMemcpy(c, cyc.get(), sizeof(c), cudaMemcpyDeviceToHost));
      const double ctas = static_cast<double>(p.num_chunks) * H;
      double tot = 0;
      for (unsigned long long x : c) tot += static_cast<double>(x);
      static const char* names[kKdaIntraPhases] = {"conv/norm/gate", "cumsum", "Akk/Aqk", "qg/kd", "inverse", "W/U"};
      std::printf("  intra cycles per CTA (%.0f in all):", tot / ctas);
      for (int i = 0; i < kKdaIntraPhases; ++i)
        std::printf(" %s %.0f (%.0f %%)", names[i], c[i] / ctas, 100.0 * static_cast<double>(c[i]) / tot);
      std::printf("\n");
    }
  }
  return rows;
}

// ---- --rmw-ceiling: what the decode's access pattern can reach at all -----------------------------------------
// The decode reads each 64 KB head state and writes it back in place. Its target is 90 % of a device-to-device
// copy, which reads one buffer and writes another. These kernels stream 1 GiB of fp32 "states" the decode's way
// (a 256-thread CTA per 64 KB state, 16 float4 loads per thread issued together, then 16 stores; two CTAs per SM)
// and as a grid-stride stream, each in place and into a second buffer, so the ceiling of in-place state traffic
// is measured, not assumed.
// kStreaming: the decode's cache hints (ld.global.cs / st.global.cs: evict-first).
template <bool kStreaming>
__global__ void __launch_bounds__(256, 2) state_blocks_kernel(const float4* src, float4* dst, float a) {
  const size_t base = static_cast<size_t>(blockIdx.x) * 4096 + threadIdx.x;  // 4096 float4 = 64 KB per CTA
  float4 v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = kStreaming ? __ldcs(src + base + 256 * i) : src[base + 256 * i];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float4 y = make_float4(v[i].x * a, v[i].y * a, v[i].z * a, v[i].w * a);
    if (kStreaming) __stcs(dst + base + 256 * i, y);
    else dst[base + 256 * i] = y;
  }
}
__global__ void stream_kernel(const float4* src, float4* dst, size_t n, float a) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    dst[i] = make_float4(v.x * a, v.y * a, v.z * a, v.w * a);
  }
}

void bench_rmw_ceiling(cudaStream_t s, double copy_gbs) {
  const size_t bytes = size_t{1} << 30, n = bytes / 16;
  DeviceBuffer x(bytes), y(bytes);
  CUDA_CHECK(cudaMemsetAsync(x.get(), 0, bytes, s));
  CUDA_CHECK(cudaMemsetAsync(y.get(), 0, bytes, s));
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto* xs = static_cast<float4*>(x.get());
  auto* ys = static_cast<float4*>(y.get());
  std::printf("\n# in-place ceiling: 1 GiB of fp32, GB/s = bytes read + written (copy %.0f GB/s)\n", copy_gbs);
  auto row = [&](const char* name, auto&& launch) {
    const double us = time_burst(s, 9, 3, [&](int) {
      launch();
      CUDA_CHECK(cudaGetLastError());
    });
    const double gbs = 2.0 * bytes / (us * 1e3);
    std::printf("rmw %-34s %8.1f us %7.0f GB/s %5.1f %% of copy\n", name, us, gbs, 100.0 * gbs / copy_gbs);
  };
  const unsigned states = static_cast<unsigned>(bytes / 65536);
  row("64 KB states, in place", [&] { state_blocks_kernel<false><<<states, 256, 0, s>>>(xs, xs, 1.0f); });
  row("64 KB states, in place, .cs hints", [&] { state_blocks_kernel<true><<<states, 256, 0, s>>>(xs, xs, 1.0f); });
  row("64 KB states, into a second buffer", [&] { state_blocks_kernel<false><<<states, 256, 0, s>>>(xs, ys, 1.0f); });
  row("64 KB states, second buffer, .cs", [&] { state_blocks_kernel<true><<<states, 256, 0, s>>>(xs, ys, 1.0f); });
  row("grid-stride stream, in place", [&] { stream_kernel<<<4 * sms, 512, 0, s>>>(xs, xs, n, 1.0f); });
  row("grid-stride stream, second buffer", [&] { stream_kernel<<<4 * sms, 512, 0, s>>>(xs, ys, n, 1.0f); });
}

}  // namespace

int main(int argc, char** argv) {
  bool decode = true, prefill = true, quick = false, phases = false, scan_variants = false, silu_variants = false;
  bool rmw = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--decode-only")) prefill = false;
    else if (!std::strcmp(argv[i], "--prefill-only")) decode = false;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--intra-phases")) phases = true;
    else if (!std::strcmp(argv[i], "--scan-variants")) scan_variants = true;
    else if (!std::strcmp(argv[i], "--silu-variants")) silu_variants = true;
    else if (!std::strcmp(argv[i], "--rmw-ceiling")) rmw = true, decode = prefill = false;
    else {
      std::fprintf(stderr,
                   "usage: kda_bench [--decode-only] [--prefill-only] [--quick] [--intra-phases] [--scan-variants] "
                   "[--silu-variants] [--rmw-ceiling]\n");
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::printf("kda_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    CudaStream stream;
    const double copy_gbs = copy_bandwidth_gbs();
    std::vector<DecodeRow> d;
    std::vector<PrefillRow> pf;
    if (rmw) bench_rmw_ceiling(stream.get(), copy_gbs);
    if (decode) d = bench_decode(stream.get(), copy_gbs, quick);
    if (prefill) pf = bench_prefill(stream.get(), quick, phases, scan_variants, silu_variants);

    // Compact summary: decode targets and the measured selector thresholds, then prefill.
    std::printf("\n# summary (copy bandwidth %.0f GB/s)\n", copy_gbs);
    int last_h = -1, max_compact = 0;
    bool monotone = true, seen_many = false;
    auto flush = [&] {
      if (last_h > 0)
        std::printf("selector H=%-3d compact faster for N <= %d%s\n", last_h, max_compact,
                    monotone ? "" : " (not monotone in N)");
    };
    for (const auto& r : d) {
      if (r.H != last_h) flush(), last_h = r.H, max_compact = 0, monotone = true, seen_many = false;
      const bool c = r.compact_graph < r.many_graph;
      if (c && seen_many) monotone = false;
      if (c && !seen_many) max_compact = r.N;
      seen_many = seen_many || !c;
      const double best_eager = std::min(r.many_eager, r.compact_eager);
      const double best_graph = r.best_graph();
      const double target_us = r.N >= 64 ? r.bytes / (0.90 * copy_gbs * 1e3) : 3.0 + r.bytes / (0.85 * copy_gbs * 1e3);
      const double chosen = r.chosen_graph();
      if (r.H == 2 || r.H == 8 || r.H == 32 || r.H == 96)
        std::printf("decode N=%-3d H=%-3d graph %7.2f us eager %7.2f us target %7.2f us auto %7.2f us %s\n", r.N,
                    r.H, best_graph, best_eager, target_us, chosen, chosen <= target_us ? "met" : "MISS");
    }
    flush();
    for (const auto& r : pf)
      std::printf("prefill %5dx%-2d H=%-2d %8.1f us (intra %7.1f scan %7.1f) public %5.0f ratio %.2f %s\n", r.T,
                  r.N, r.H, r.us, r.intra_us, r.scan_us, r.public_us, r.us / r.public_us,
                  r.us <= 0.67 * r.public_us ? "met" : "MISS");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
