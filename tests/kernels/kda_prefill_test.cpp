// KDA chunked prefill vs the fp32 CPU recurrence: varlen batches (empty, 1-token, non-multiple-of-64 and
// multi-chunk sequences, a padding sequence), the stage-1 chunk factors vs a CPU model of them, a long
// sequence, 32 heads, strong decays, and prefill followed by decode == the recurrence over all tokens.
#include <gtest/gtest.h>

#include <string>

#include "tests/kernels/kda_test_common.h"

#ifdef DELTASERVE_WITH_CUDA
namespace ds::kda::test {
namespace {

constexpr double kTol = 5e-3;

struct PrefillRun {
  DeviceBuffer cu, chunk_offsets, workspace;
  KdaPrefillParams params;
};

// Prefill params for the rows currently set on `d`, sequences `cu` (host).
PrefillRun prefill_params(const DeviceLayer& d, const std::vector<int32_t>& cu) {
  PrefillRun r;
  const auto off = kda_chunk_offsets(cu);
  r.cu = upload(cu);
  r.chunk_offsets = upload(off);
  r.params = {};
  d.fill_common(r.params);
  r.params.N = static_cast<int>(cu.size()) - 1;
  r.params.T = cu.back();
  r.params.cu_seqlens = r.cu.get<int32_t>();
  r.params.chunk_offsets = r.chunk_offsets.get<int32_t>();
  r.params.num_chunks = off.back();
  r.params.workspace_bytes = kda_prefill_workspace_bytes(off.back(), d.p.H);
  r.workspace.reset(r.params.workspace_bytes);
  r.params.workspace = r.workspace.get();
  return r;
}

std::vector<int> iota_rows(int n) {
  std::vector<int> r(n);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

void run_prefill_case(const std::vector<int>& lens, int H, uint64_t seed, const std::vector<int>& padding,
                      float A_log_shift = 0.0f, KdaScanConfig scan = {0, 0}, int loader = 0, int silu = 0) {
  LayerProblem p = make_problem(lens, H, seed, padding);
  for (auto& a : p.A_log) a += A_log_shift;
  DeviceLayer d(p);
  d.set_rows(iota_rows(p.T), p.slots);
  PrefillRun run = prefill_params(d, p.cu);
  run.params.scan_vtiles = scan.vtiles;
  run.params.scan_stages = scan.stages;
  run.params.scan_loader = loader;
  run.params.intra_silu = silu;
  kda_prefill(run.params, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> state_ref = p.state;
  std::vector<uint16_t> conv_ref = p.conv;
  const auto ref = reference_layer(p, p.cu, p.slots, 0, state_ref, conv_ref);
  const std::string what =
      fmt::format("prefill H={} T={} N={}{}{}{}", H, p.T, p.N,
                  scan.vtiles ? fmt::format(" scan {}x{}", scan.vtiles, scan.stages) : "",
                  loader == kKdaScanLoaderBulk ? " bulk" : loader == kKdaScanLoaderCpAsync ? " cp.async" : "",
                  silu == kKdaSiluTanh ? " silu tanh" : silu == kKdaSiluExact ? " silu exact" : "");
  EXPECT_CLOSE(what + ": output", d.output(), ref, kTol);
  std::vector<int32_t> touched;
  for (int n = 0; n < p.N; ++n)
    if (p.slots[n] >= 0 && lens[n] > 0) touched.push_back(p.slots[n]);
  expect_pools(what, d, state_ref, conv_ref, touched, kTol);
}

TEST(KdaPrefill, VarlenBatchMatchesRecurrence) {
  SKIP_WITHOUT_GPU();
  // Empty, single-token, exactly one chunk, partial chunks, multi-chunk, a padding sequence (index 5).
  run_prefill_case({130, 0, 1, 64, 77, 3, 200, 2}, 3, 11, {5});
}

TEST(KdaPrefill, LongSequence) {
  SKIP_WITHOUT_GPU();
  run_prefill_case({2048 + 17}, 2, 12, {});
}

TEST(KdaPrefill, ThirtyTwoHeads) {
  SKIP_WITHOUT_GPU();
  run_prefill_case({300, 45, 0}, 32, 13, {});
}

// 16 sequences x 32 heads: the measured rule runs the scan at 2 V-tiles x 1 stage (two CTAs per SM); the
// varlen case keeps 4 x 3. EveryScanConfiguration below forces each of the four.
TEST(KdaPrefill, ManySequencesNarrowScan) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> lens = {70, 1, 0, 129, 64, 5, 33, 200, 2, 64, 17, 90, 3, 65, 128, 11};
  KdaPrefillParams shape;
  shape.H = 32;
  shape.N = static_cast<int>(lens.size());
  KdaScanConfig c = kda_prefill_scan_config(shape);
  ASSERT_EQ(std::pair(c.vtiles, c.stages), std::pair(2, 1)) << "this case must exercise the 2 x 1 scan";
  shape.H = 3, shape.N = 8;
  c = kda_prefill_scan_config(shape);
  EXPECT_EQ(std::pair(c.vtiles, c.stages), std::pair(4, 3)) << "VarlenBatchMatchesRecurrence's grid takes 4 x 3";
  run_prefill_case(lens, 32, 17, {4});
}

// Each scan configuration forced (4 or 2 V-tiles per head, three / two stages or one), with each factor loader,
// on a batch with an empty, a one-token, a padding and multi-chunk sequences: the rule picks among them by grid
// size. The 450-token sequence takes 8 chunks, so every stage of the 3-stage ring is refilled twice (the bulk
// loader's mbarrier parity flips).
TEST(KdaPrefill, EveryScanConfiguration) {
  SKIP_WITHOUT_GPU();
  for (const int loader : {kKdaScanLoaderCpAsync, kKdaScanLoaderBulk})
    for (const KdaScanConfig c : {KdaScanConfig{4, 3}, KdaScanConfig{4, 1}, KdaScanConfig{2, 2}, KdaScanConfig{2, 1}})
      run_prefill_case({150, 0, 1, 64, 450, 7}, 3, 18, {3}, 0.0f, c, loader);
}

// Each SiLU form of the conv (KdaPrefillParams::intra_silu) against the same reference, under the same bar: the
// varlen batch and 32 heads; the printed error statistics compare the two forms. An unknown form is refused.
TEST(KdaPrefill, EverySiluForm) {
  SKIP_WITHOUT_GPU();
  for (const int silu : {kKdaSiluExact, kKdaSiluTanh}) {
    run_prefill_case({130, 0, 1, 64, 77, 3, 200, 2}, 3, 11, {5}, 0.0f, {0, 0}, 0, silu);
    run_prefill_case({300, 45, 0}, 32, 13, {}, 0.0f, {0, 0}, 0, silu);
  }
  KdaPrefillParams bad;
  bad.H = 2;
  bad.intra_silu = 3;
  const auto why = kda_prefill_unsupported(bad);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("intra_silu=3"), std::string::npos) << *why;
}

TEST(KdaPrefill, StrongDecayStaysFinite) {
  SKIP_WITHOUT_GPU();
  run_prefill_case({150, 64}, 4, 14, {}, 3.0f);
}

// CPU model of the stage-1 factors (spec 4.1 steps 1-4) in fp32/fp64, same layout as KdaChunkFactors.
struct CpuFactors {
  std::vector<float> qg, kd, w, u, aqk, gl;
};
CpuFactors cpu_factors(const LayerProblem& p, const Activations& a, int num_chunks) {
  const int H = p.H, P = p.P, C = kChunk;
  CpuFactors f;
  const size_t tiles = static_cast<size_t>(num_chunks) * H;
  for (auto* v : {&f.qg, &f.kd, &f.w, &f.u}) v->assign(tiles * C * kD, 0.0f);
  f.aqk.assign(tiles * C * C, 0.0f);
  f.gl.assign(tiles * kD, 0.0f);
  int chunk = 0;
  for (int n = 0; n < p.N; ++n)
    for (int t0 = p.cu[n]; t0 < p.cu[n + 1]; t0 += C, ++chunk) {
      const int L = std::min(C, p.cu[n + 1] - t0);
      for (int h = 0; h < H; ++h) {
        const size_t tile = static_cast<size_t>(chunk) * H + h;
        std::vector<double> q(C * kD, 0), k(C * kD, 0), G(C * kD, 0), M(C * C, 0), A(C * C, 0), beta(C, 0);
        for (int r = 0; r < L; ++r) {
          const size_t row = static_cast<size_t>(t0 + r) * P + h * kD;
          double sq = 0, sk = 0;
          for (int d = 0; d < kD; ++d) sq += a.q[row + d] * a.q[row + d], sk += a.k[row + d] * a.k[row + d];
          for (int d = 0; d < kD; ++d) {
            q[r * kD + d] = a.q[row + d] / std::sqrt(sq + 1e-6) / std::sqrt(128.0);
            k[r * kD + d] = a.k[row + d] / std::sqrt(sk + 1e-6);
            G[r * kD + d] = (r ? G[(r - 1) * kD + d] : 0.0) + a.g[row + d];
          }
          beta[r] = a.beta[static_cast<size_t>(t0 + r) * H + h];
        }
        for (int r = L; r < C; ++r)
          for (int d = 0; d < kD; ++d) G[r * kD + d] = G[(L - 1) * kD + d];
        for (int r = 0; r < L; ++r)
          for (int j = 0; j <= r; ++j) {
            double sqk = 0, skk = 0;
            for (int d = 0; d < kD; ++d) {
              const double e = std::exp(G[r * kD + d] - G[j * kD + d]);
              sqk += q[r * kD + d] * k[j * kD + d] * e;
              skk += k[r * kD + d] * k[j * kD + d] * e;
            }
            f.aqk[tile * C * C + r * C + j] = static_cast<float>(sqk);
            if (j < r) A[r * C + j] = beta[r] * skk;
          }
        for (int c = 0; c < C; ++c) {  // M = (I + A)^-1
          M[c * C + c] = 1;
          for (int r = c + 1; r < C; ++r) {
            double m = 0;
            for (int j = c; j < r; ++j) m -= A[r * C + j] * M[j * C + c];
            M[r * C + c] = m;
          }
        }
        for (int r = 0; r < C; ++r)
          for (int d = 0; d < kD; ++d) {
            double w = 0, u = 0;
            for (int j = 0; j <= r; ++j) {
              w += M[r * C + j] * beta[j] * std::exp(G[j * kD + d]) * k[j * kD + d];
              u += M[r * C + j] * beta[j] * (j < L ? a.v[static_cast<size_t>(t0 + j) * P + h * kD + d] : 0.0);
            }
            const size_t i = tile * C * kD + r * kD + d;
            f.w[i] = static_cast<float>(w);
            f.u[i] = static_cast<float>(u);
            f.qg[i] = static_cast<float>(q[r * kD + d] * std::exp(G[r * kD + d]));
            f.kd[i] = static_cast<float>(k[r * kD + d] * std::exp(G[(C - 1) * kD + d] - G[r * kD + d]));
          }
        for (int d = 0; d < kD; ++d) f.gl[tile * kD + d] = static_cast<float>(std::exp(G[(C - 1) * kD + d]));
      }
    }
  return f;
}

std::vector<float> download_bf16(const bf16_t* p, size_t n) {
  std::vector<uint16_t> raw(n);
  CUDA_CHECK(cudaMemcpy(raw.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = bf(raw[i]);
  return r;
}
// The dense [tiles, 64, cols] contents of swizzled workspace tiles (kda.h): element (r, c) of tile t sits at
// t * tile_elems + offset(r, c).
template <class Offset>
std::vector<float> dense_tiles(const std::vector<float>& stored, size_t tiles, int cols, size_t tile_elems,
                               Offset offset) {
  std::vector<float> d(tiles * kChunk * cols);
  for (size_t t = 0; t < tiles; ++t)
    for (int r = 0; r < kChunk; ++r)
      for (int c = 0; c < cols; ++c) d[(t * kChunk + r) * cols + c] = stored[t * tile_elems + offset(r, c)];
  return d;
}
std::vector<float> download_f32(const float* p, size_t n) {
  std::vector<float> r(n);
  CUDA_CHECK(cudaMemcpy(r.data(), p, n * 4, cudaMemcpyDeviceToHost));
  return r;
}

TEST(KdaPrefill, StageOneChunkFactorsMatchCpuModel) {
  SKIP_WITHOUT_GPU();
  LayerProblem p = make_problem({100, 37, 64}, 2, 15);
  DeviceLayer d(p);
  d.set_rows(iota_rows(p.T), p.slots);
  PrefillRun run = prefill_params(d, p.cu);
  kda_prefill_intra(run.params, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> conv = p.conv;
  const Activations a = reference_activations(p, p.cu, p.slots, 0, conv);
  const int C = run.params.num_chunks;
  const CpuFactors want = cpu_factors(p, a, C);
  const KdaChunkFactors got = kda_chunk_factors(run.params.workspace, C, p.H);
  const size_t tiles = static_cast<size_t>(C) * p.H;
  const auto factor = [&](const bf16_t* f) {
    return dense_tiles(download_bf16(f, tiles * kKdaFactorTile), tiles, kD, kKdaFactorTile, kda_factor_offset);
  };
  // bf16 factors: ~3e-3 RMS from storage rounding alone.
  EXPECT_CLOSE("stage 1: qg", factor(got.qg), want.qg, 1e-2);
  EXPECT_CLOSE("stage 1: kd", factor(got.kd), want.kd, 1e-2);
  EXPECT_CLOSE("stage 1: aqk",
               dense_tiles(download_bf16(got.aqk, tiles * kKdaAqkTile), tiles, kChunk, kKdaAqkTile,
                           kda_aqk_offset),
               want.aqk, 1e-2);
  EXPECT_CLOSE("stage 1: gl", download_f32(got.gl, tiles * kD), want.gl, 1e-4);
  EXPECT_CLOSE("stage 1: w", factor(got.w), want.w, 1e-2);
  EXPECT_CLOSE("stage 1: u", dense_tiles(download_f32(got.u, tiles * kKdaUTile), tiles, kD, kKdaUTile, kda_u_offset),
               want.u, 1e-2);
}

// Prefill the first `pre[n]` tokens of each sequence, then decode the rest one token per step (finished
// sequences become padding rows): outputs and final states equal the recurrence over all tokens.
TEST(KdaPrefill, ThenDecodeEqualsRecurrence) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> lens = {150, 70, 5}, pre = {100, 64, 2};
  const int H = 4;
  LayerProblem p = make_problem(lens, H, 16);
  DeviceLayer d(p);
  std::vector<float> out(static_cast<size_t>(p.T) * p.P, NAN);
  // Prefill rows: each sequence's first pre[n] tokens, packed.
  std::vector<int> rows;
  std::vector<int32_t> cu = {0};
  for (int n = 0; n < p.N; ++n) {
    for (int t = 0; t < pre[n]; ++t) rows.push_back(p.cu[n] + t);
    cu.push_back(cu.back() + pre[n]);
  }
  d.set_rows(rows, p.slots);
  PrefillRun run = prefill_params(d, cu);
  kda_prefill(run.params, nullptr);
  auto o = d.output();
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(o.begin() + i * p.P, o.begin() + (i + 1) * p.P, out.begin() + static_cast<size_t>(rows[i]) * p.P);
  const KdaDecodeSetup setup = kda_decode_setup();
  for (int step = 0;; ++step) {
    std::vector<int> drows;
    std::vector<int32_t> dslots;
    bool any = false;
    for (int n = 0; n < p.N; ++n) {
      const int t = pre[n] + step;
      const bool live = t < lens[n];
      any = any || live;
      drows.push_back(live ? p.cu[n] + t : 0);
      dslots.push_back(live ? p.slots[n] : -1);
    }
    if (!any) break;
    d.set_rows(drows, dslots);
    kda_decode(d.decode_params(), setup, nullptr);
    o = d.output();
    for (int n = 0; n < p.N; ++n)
      if (dslots[n] >= 0)
        std::copy(o.begin() + n * p.P, o.begin() + (n + 1) * p.P, out.begin() + static_cast<size_t>(drows[n]) * p.P);
  }
  std::vector<float> state_ref = p.state;
  std::vector<uint16_t> conv_ref = p.conv;
  const auto ref = reference_layer(p, p.cu, p.slots, 0, state_ref, conv_ref);
  EXPECT_CLOSE("prefill + decode vs recurrence: output", out, ref, kTol);
  expect_pools("prefill + decode vs recurrence", d, state_ref, conv_ref, p.slots, kTol);
}

}  // namespace
}  // namespace ds::kda::test
#endif  // DELTASERVE_WITH_CUDA
