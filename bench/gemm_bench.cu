// Dense GEMM benchmark through the cuBLASLt wrapper: bf16 and FP8 block-scaled out[M, N] = x[M, K] @ W[N, K]^T for
// the Kimi-Linear projection shapes at M in {1, 16, 128, 1024, 8192}, plus 8192^3. CUDA events, warm-up, median of
// 15 samples of 10 launches; random inputs; weights rotated over copies totalling >= 256 MB so small-M runs read
// HBM, not L2. Prints TFLOP/s, % of the H200 peaks in perf/targets.md, and weight GB/s vs the copy bandwidth
// measured in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_detail.h"
#include "bench_util.cuh"

using namespace ds;
using namespace ds::bench;

namespace {

constexpr double kBf16Peak = 804.0, kFp8Peak = 1536.0;  // TFLOP/s, perf/targets.md (H200, cuBLAS)

struct Shape {
  const char* name;
  int N, K;
};

}  // namespace

int main(int argc, char** argv) {
  // --gemv [SHAPE]: the decode GEMV split sweep only (skips the cuBLASLt table), optionally one shape of it
  // (e.g. kda_qkvfbg: scripts/gpu-ncu.sh profiles that shape's kernels alone).
  const bool gemv_only = argc > 1 && std::string(argv[1]) == "--gemv";
  const std::string gemv_shape = gemv_only && argc > 2 ? argv[2] : "";
  if (cudaFree(nullptr) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double bw = copy_bandwidth_gbs();
  std::printf("# gemm_bench on %s: copy bandwidth %.0f GB/s (read + write, 1 GiB)\n", prop.name, bw);
  std::printf("# peaks used for %%: bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s (perf/targets.md)\n", kBf16Peak, kFp8Peak);

  // KDA packed projection: q, k, v (3 x 4096) + f_a 128 + b 32 + g_a 128 = 12576 rows (spec section 3.1).
  const Shape shapes[] = {{"kda_qkvfbg", 12576, 2304}, {"mla_fused_a", 6720, 2304},  {"o_proj", 2304, 4096},
                          {"mlp_gate_up", 18432, 2304}, {"mlp_down", 2304, 9216}, {"lm_head", 163840, 2304},
                          {"square", 8192, 8192}};
  const int Ms[] = {1, 16, 128, 1024, 8192};
  gemm::GemmRunner runner;
  runner.init();
  std::printf("| shape | M | N | K | bf16 us | bf16 TFLOP/s | %% bf16 peak | bf16 W GB/s | %% copy bw | fp8 us | fp8 "
              "TFLOP/s | %% fp8 peak | fp8 W GB/s | act quant us |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    if (gemv_only) break;
    const size_t wn = static_cast<size_t>(s.N) * s.K;
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / (wn * 2) + 1, 1, 16));
    std::vector<DeviceBuffer> w16, w8, ws;
    const int KB = s.K / 128, KBp = static_cast<int>(gemm::w_scale_cols(s.K)), NB = (s.N + 127) / 128;
    for (int c = 0; c < copies; ++c) {
      w16.emplace_back(wn * 2);
      fill(w16.back(), wn, 17 + c, 0.05f);
      w8.emplace_back(wn);
      ws.emplace_back(static_cast<size_t>(NB) * KBp * 4);
      gemm::quantize_weight_fp8({w16.back().get<bf16_t>(), w8.back().get<uint8_t>(), ws.back().get<float>(), s.N, s.K},
                                nullptr);
    }
    for (int M : Ms) {
      if (s.N == 8192 && M != 8192) continue;  // 8192^3 only
      const size_t xn = static_cast<size_t>(M) * s.K;
      DeviceBuffer x16(xn * 2), x8(xn), xs(static_cast<size_t>(KB) * M * 4), out(static_cast<size_t>(M) * s.N * 2);
      fill(x16, xn, 99 + M, 2.0f);
      auto act_q = [&] {
        gemm::quantize_act_fp8({x16.get<bf16_t>(), s.K, x8.get<uint8_t>(), xs.get<float>(), M, s.K}, nullptr);
      };
      act_q();
      auto view = [](const DeviceBuffer& b, DType t, std::initializer_list<int64_t> d) {
        return TensorView(b.get(), t, d, Device::kCUDA);
      };
      constexpr auto cfg = gemm::detail::kVerifiedFp8Layout;
      const double t16 = time_ms([&](int i) {
        runner.run({view(x16, DType::kBF16, {M, s.K}), view(w16[i % copies], DType::kBF16, {s.N, s.K}), {}, {},
                    view(out, DType::kBF16, {M, s.N}), "bench"},
                   nullptr);
      });
      double t8 = -1.0;  // a refused or failing FP8 configuration is reported, not fatal
      if (M % gemm::kFp8RowMultiple == 0) try {
        t8 = time_ms([&](int i) {
        runner.run({view(x8, DType::kF8E4M3, {M, s.K}), view(w8[i % copies], DType::kF8E4M3, {s.N, s.K}),
                    cfg.x_scale_k_major ? view(xs, DType::kF32, {M, KB}) : view(xs, DType::kF32, {KB, M}),
                    cfg.w_scale_n_major ? view(ws[i % copies], DType::kF32, {KB, NB})
                                        : view(ws[i % copies], DType::kF32, {NB, KBp}),
                    view(out, DType::kBF16, {M, s.N}), "bench fp8"},
                   nullptr);
        });
      } catch (const Error& e) {
        std::printf("# fp8 %s M=%d: %s\n", s.name, M, e.what());
      }
      const double tq = time_ms([&](int) { act_q(); });
      const double flop = 2.0 * M * s.N * s.K;
      const double tf16 = flop / (t16 * 1e-3) / 1e12, tf8 = flop / (t8 * 1e-3) / 1e12;
      const double gb16 = wn * 2 / (t16 * 1e-3) / 1e9, gb8 = wn / (t8 * 1e-3) / 1e9;
      const std::string fp8 = t8 > 0 ? fmt::format("{:.1f} | {:.1f} | {:.1f} | {:.0f}", t8 * 1e3, tf8, 100 * tf8 / kFp8Peak, gb8)
                                     : std::string("- | - | - | -");  // M % 8 != 0: refused (gemm.h)
      std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.0f | %.1f | %s | %.1f |\n", s.name, M, s.N, s.K,
                  t16 * 1e3, tf16, 100 * tf16 / kBf16Peak, gb16, 100 * gb16 / bw, fp8.c_str(), tq * 1e3);
      std::fflush(stdout);
    }
  }

  // Decode GEMV (M = 1): the split count (warps of a block sharing one row group over K) the kernel chooses
  // against every other, bf16 and W8A16, on the engine's decode shapes: the data for tuning choose_splits
  // (small GEMVs land at 1-2 waves of blocks, where the split count decides how full the last wave is).
  // The last column repeats the default with one copy of the weights, hot in L2 where they fit (50 MB): what an
  // op would take if an earlier, latency-bound kernel had prefetched its weights. The "+ norm" rows sweep the
  // split count again with the input RMSNorm fused in (the engine's kda.proj / mla.fused_a / lm_head at C = 1):
  // every block normalises the row after the PDL wait, so fewer, larger blocks may pay off there.
  std::printf("\n# decode GEMV split sweep, M = 1 (us; %% of copy bandwidth on the weight bytes; * = the default)\n");
  std::printf("| shape | N | K | weights | splits 1 | 2 | 4 | 8 | default, L2-hot |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const Shape gemv_shapes[] = {{"kda_qkvfbg", 12576, 2304}, {"mla_fused_a", 6720, 2304}, {"o_proj", 2304, 4096},
                               {"kda_f_b", 4096, 128},      {"mlp_down", 2304, 9216},     {"lm_head", 163840, 2304}};
  for (const auto& s : gemv_shapes) {
    if (!gemv_shape.empty() && gemv_shape != s.name) continue;
    const size_t wn = static_cast<size_t>(s.N) * s.K;
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wn + 1, 1, 16));
    const int pitch = static_cast<int>(gemm::w_scale_cols(s.K)), NB = (s.N + 127) / 128;
    std::vector<DeviceBuffer> w16, w8, ws;
    for (int c = 0; c < copies; ++c) {
      w16.emplace_back(wn * 2);
      fill(w16.back(), wn, 31 + c, 0.05f);
      w8.emplace_back(wn);
      ws.emplace_back(static_cast<size_t>(NB) * pitch * 4);
      gemm::quantize_weight_fp8({w16.back().get<bf16_t>(), w8.back().get<uint8_t>(), ws.back().get<float>(), s.N, s.K},
                                nullptr);
    }
    DeviceBuffer x(static_cast<size_t>(s.K) * 2), out(static_cast<size_t>(s.N) * 2), norm_w(static_cast<size_t>(s.K) * 2);
    fill(x, s.K, 7, 1.0f);
    fill(norm_w, s.K, 8, 1.0f);
    for (const bool fp8 : {false, true}) {
      for (const bool fused_norm : {false, true}) {
        if (fp8 && s.K % 128 != 0) continue;
        if (fused_norm && s.K > gemm::kNormMaxK) continue;
        const int def = gemm::detail::gemv_default_splits(s.N, s.K, fp8);
        std::string row = fmt::format("| {} | {} | {} | {}{} |", s.name, s.N, s.K, fp8 ? "e4m3 (W8A16)" : "bf16",
                                      fused_norm ? " + norm" : "");
        // 0: the default split, one weight copy (unfused rows only)
        for (const int sp : {1, 2, 4, 8, 0}) {
          if (sp == 0 && fused_norm) {
            row += " - |";
            continue;
          }
          const int n_copies = sp == 0 ? 1 : copies;
          const gemm::detail::GemvNorm nrm =
              fused_norm ? gemm::detail::GemvNorm{norm_w.get(), 1e-6f} : gemm::detail::GemvNorm{};
          const double t = time_ms([&](int i) {
            if (fp8)
              gemm::detail::gemv_w8a16(x.get(), w8[i % n_copies].get(), ws[i % n_copies].get<float>(), pitch,
                                       out.get(), false, 1, s.N, s.K, nullptr, sp == 0 ? def : sp, nrm);
            else
              gemm::detail::gemv_bf16(x.get(), w16[i % n_copies].get(), out.get(), false, 1, s.N, s.K, nullptr,
                                      sp == 0 ? def : sp, nrm);
          });
          const double gbs = static_cast<double>(wn) * (fp8 ? 1 : 2) / (t * 1e-3) / 1e9;
          row += fmt::format(" {:.1f} ({:.0f} %){} |", t * 1e3, 100 * gbs / bw, sp == def ? " *" : "");
        }
        std::printf("%s\n", row.c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
