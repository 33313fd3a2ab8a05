// util ops on the GPU (silu_mul, copy_columns, fill_random) against their CPU definitions in util_ref.h.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cuda_utils.h"
#include "core/dtype.h"
#include "kernels/util/util.h"
#include "kernels/util/util_ref.h"
#include "tests/test_util.h"

namespace ds::util {
namespace {

constexpr uint16_t kPoison = 0xffff;  // a bf16 NaN: an element the kernel forgot to write shows up

// bf16 ulp distance (both finite, same sign region is all the tests need).
int ulp_diff(uint16_t a, uint16_t b) {
  auto key = [](uint16_t v) { return (v & 0x8000) ? -static_cast<int>(v & 0x7fff) : static_cast<int>(v); };
  return std::abs(key(a) - key(b));
}

TEST(UtilKernels, SiluMulMatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Shape { int I; int64_t x_pad, y_pad; };
  // Vector path (I % 8 == 0, aligned strides), odd strides and odd I (scalar path), the real dense I = 9216.
  const Shape shapes[] = {{8, 0, 0}, {136, 64, 8}, {9216, 0, 0}, {1, 0, 0}, {3, 5, 1}, {136, 3, 0}, {264, 0, 3}};
  for (const Shape& s : shapes)
    for (int T : {1, 3, 17, 1000}) {
      if (static_cast<int64_t>(T) * s.I > 3'000'000) continue;
      const int64_t xs = 2 * s.I + s.x_pad, ys = s.I + s.y_pad;
      std::vector<float> x = test::randn(static_cast<size_t>(T * xs), T * 131 + s.I, 2.0f);
      for (auto& v : x) v = round_bf16(v);
      auto dx = upload(f32_to_bf16(x));
      DeviceBuffer dy(static_cast<size_t>(T) * ys * 2);
      CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.bytes()));
      silu_mul({dx.get<bf16_t>(), xs, dy.get<bf16_t>(), T, s.I, s.y_pad ? ys : 0}, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> ref(static_cast<size_t>(T) * s.I);
      silu_mul_ref(x.data(), xs, T, s.I, ref.data());
      const auto got = download<uint16_t>(dy.get(), static_cast<size_t>(T) * ys);
      std::vector<float> out(ref.size());
      int64_t far = 0, pad_touched = 0;
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < s.I; ++i) {
          const uint16_t g = got[t * ys + i];
          out[static_cast<size_t>(t) * s.I + i] = bf16_to_f32(g);
          far += ulp_diff(g, f32_to_bf16(ref[static_cast<size_t>(t) * s.I + i])) > 1;
        }
        for (int64_t i = s.I; i < ys; ++i) pad_touched += got[t * ys + i] != kPoison;
      }
      const std::string what = fmt::format("silu_mul T={} I={} x_stride={} y_stride={}", T, s.I, xs, ys);
      EXPECT_CLOSE(what, out, ref, 5e-3);  // one bf16 rounding: ~1e-3 RMS
      EXPECT_EQ(far, 0) << what << ": values more than 1 bf16 ulp from the fp32 reference";
      EXPECT_EQ(pad_touched, 0) << what << ": wrote past I in a row";
    }
}

TEST(UtilKernels, CopyColumnsIsExact) {
  SKIP_WITHOUT_GPU();
  struct Shape { int64_t src_stride; int col0, cols; int64_t dst_stride; };
  // KDA f_a slice of the packed projection (real and tiny widths), then misaligned starts, odd widths and strides.
  const Shape shapes[] = {{12576, 12288, 128, 128}, {1040, 768, 128, 128}, {1040, 1024, 2, 2},  {1040, 1, 128, 136},
                          {37, 3, 17, 17},          {64, 8, 8, 9},         {1000, 0, 1000, 1000}};
  for (const Shape& s : shapes)
    for (int T : {1, 3, 17, 1000}) {
      std::vector<uint16_t> src(static_cast<size_t>(T) * s.src_stride);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>((i * 2654435761u) >> 7) & 0x7fff;
      auto dsrc = upload(src);
      DeviceBuffer ddst(static_cast<size_t>(T) * s.dst_stride * 2);
      CUDA_CHECK(cudaMemset(ddst.get(), 0xff, ddst.bytes()));
      copy_columns({dsrc.get<bf16_t>(), s.src_stride, s.col0, s.cols, ddst.get<bf16_t>(), s.dst_stride, T}, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = download<uint16_t>(ddst.get(), static_cast<size_t>(T) * s.dst_stride);
      int64_t bad = 0, pad_touched = 0;
      for (int t = 0; t < T; ++t) {
        for (int c = 0; c < s.cols; ++c) bad += got[t * s.dst_stride + c] != src[t * s.src_stride + s.col0 + c];
        for (int64_t c = s.cols; c < s.dst_stride; ++c) pad_touched += got[t * s.dst_stride + c] != kPoison;
      }
      std::printf("[err] copy_columns T=%d src_stride=%lld col0=%d cols=%d dst_stride=%lld: %lld mismatches\n", T,
                  static_cast<long long>(s.src_stride), s.col0, s.cols, static_cast<long long>(s.dst_stride),
                  static_cast<long long>(bad));
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(pad_touched, 0);
    }
}

struct FillCase {
  const char* name;
  FillDist dist;
  FillMap map;
  float a, b;
};
const FillCase kFillCases[] = {
    {"normal(0.5, 2)", FillDist::kNormal, FillMap::kNone, 0.5f, 2.0f},
    {"uniform[-3, 5)", FillDist::kUniform, FillMap::kNone, -3.0f, 5.0f},
    {"const 1", FillDist::kConst, FillMap::kNone, 1.0f, 0.0f},
    {"A_log log(1+15u)", FillDist::kUniform, FillMap::kLog1p15, 0.0f, 1.0f},
    {"dt_bias inv-softplus", FillDist::kUniform, FillMap::kInvSoftplus, 0.001f, 0.1f},
};

FillParams fill_params(const FillCase& c, DType t, int64_t n, uint64_t seed) {
  FillParams p;
  p.dtype = t;
  p.n = n;
  p.seed = seed;
  p.dist = c.dist;
  p.map = c.map;
  p.a = c.a;
  p.b = c.b;
  return p;
}

// Runs fill_random into a poisoned buffer (out offset by `offset_elems` to force the unaligned path), checks the
// element past the end stays poisoned, and returns the n values as fp32.
std::vector<float> gpu_fill(FillParams p, int offset_elems = 0) {
  const size_t esz = dtype_size(p.dtype);
  DeviceBuffer b((p.n + offset_elems + 1) * esz);
  CUDA_CHECK(cudaMemset(b.get(), 0xff, b.bytes()));
  p.out = b.get<char>() + offset_elems * esz;
  fill_random(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> raw((p.n + 1) * esz);
  CUDA_CHECK(cudaMemcpy(raw.data(), p.out, raw.size(), cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < esz; ++k) EXPECT_EQ(raw[p.n * esz + k], 0xff) << "fill_random wrote past n = " << p.n;
  std::vector<float> v(p.n);
  for (int64_t i = 0; i < p.n; ++i) v[i] = load_as_f32(raw.data(), p.dtype, i);
  return v;
}

TEST(UtilKernels, FillRandomMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const FillCase& c : kFillCases)
    for (DType t : {DType::kF32, DType::kBF16})
      for (int64_t n : {1, 7, 17, 1000, 1'000'003})
        for (int offset : {0, 1}) {
          const FillParams p = fill_params(c, t, n, 0x1234567890abcdefull + n);
          const std::vector<float> got = gpu_fill(p, offset);
          std::vector<float> ref(n);
          for (int64_t i = 0; i < n; ++i) ref[i] = fill_value_ref(p, i);
          // GPU and host libm (logf, cosf, expm1f) and FMA contraction differ by an ulp or two: f32 within
          // 1e-5 * (1 + |v|); bf16 equal after rounding except where the fp32 values straddle a rounding boundary
          // (1 ulp, rare).
          int64_t nan = 0, far = 0, off_by_one = 0;
          double max_rel = 0;
          for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(got[i])) { ++nan; continue; }
            if (t == DType::kF32) {
              max_rel = std::max(max_rel, std::fabs(got[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
            } else {
              // Near zero the mean + sd * z cancellation makes an fp32 ulp many bf16 ulps: judge those absolutely.
              const int d = ulp_diff(f32_to_bf16(got[i]), f32_to_bf16(ref[i]));
              far += d > 1 && std::fabs(got[i] - round_bf16(ref[i])) > 1e-5 * (1.0 + std::fabs(ref[i]));
              off_by_one += d >= 1;
            }
          }
          const std::string what = fmt::format("fill {} {} n={} offset={}", c.name, dtype_name(t), n, offset);
          std::printf("[err] %-50s nan=%lld max_rel=%.2e bf16 1-ulp=%lld >1-ulp=%lld\n", what.c_str(),
                      static_cast<long long>(nan), max_rel, static_cast<long long>(off_by_one),
                      static_cast<long long>(far));
          EXPECT_EQ(nan, 0) << what;
          EXPECT_LT(max_rel, 1e-5) << what;
          EXPECT_EQ(far, 0) << what;
          EXPECT_LE(off_by_one, n / 1000 + 1) << what;
        }
}

struct Moments {
  double mean = 0, sd = 0, lo = 1e30, hi = -1e30;
};
Moments moments(const std::vector<float>& v) {
  Moments m;
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    m.lo = std::min<double>(m.lo, x);
    m.hi = std::max<double>(m.hi, x);
  }
  m.mean = s / v.size();
  for (float x : v) s2 += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(s2 / v.size());
  return m;
}

TEST(UtilKernels, FillRandomStatistics) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  for (DType t : {DType::kF32, DType::kBF16}) {
    {  // normal: mean and sd within ~5 standard errors (se(mean) = 2/1024, se(sd) = 2/sqrt(2n) = 0.0014)
      const auto v = gpu_fill(fill_params(kFillCases[0], t, n, 11));
      const Moments m = moments(v);
      int64_t within1 = 0, within2 = 0;
      for (float x : v) {
        within1 += std::fabs(x - 0.5f) < 2.0f;
        within2 += std::fabs(x - 0.5f) < 4.0f;
      }
      std::printf("[stat] normal(0.5, 2) %s: mean=%.5f sd=%.5f min=%.3f max=%.3f P(|z|<1)=%.4f P(|z|<2)=%.4f\n",
                  dtype_name(t), m.mean, m.sd, m.lo, m.hi, double(within1) / n, double(within2) / n);
      EXPECT_NEAR(m.mean, 0.5, 0.01);
      EXPECT_NEAR(m.sd, 2.0, 0.01);
      EXPECT_NEAR(double(within1) / n, 0.6827, 0.003);
      EXPECT_NEAR(double(within2) / n, 0.9545, 0.002);
      EXPECT_LT(std::max(-m.lo, m.hi), 0.5 + 2.0 * 5.8);  // 24-bit u1: |z| <= 5.77
    }
    {  // uniform [-3, 5): mean 1, sd 8/sqrt(12)
      const Moments m = moments(gpu_fill(fill_params(kFillCases[1], t, n, 12)));
      std::printf("[stat] uniform[-3,5) %s: mean=%.5f sd=%.5f min=%.5f max=%.5f\n", dtype_name(t), m.mean, m.sd, m.lo,
                  m.hi);
      EXPECT_NEAR(m.mean, 1.0, 0.02);
      EXPECT_NEAR(m.sd, 8.0 / std::sqrt(12.0), 0.01);
      EXPECT_GE(m.lo, -3.0);
      EXPECT_LE(m.hi, 5.0);  // bf16 rounding may reach the upper bound
      EXPECT_LT(m.lo, -2.99);
      EXPECT_GT(m.hi, 4.99);
    }
    {  // const
      const Moments m = moments(gpu_fill(fill_params(kFillCases[2], t, 1000, 13)));
      EXPECT_EQ(m.lo, 1.0);
      EXPECT_EQ(m.hi, 1.0);
    }
    {  // A_log = log(1 + 15u): exp(A_log) in [1, 16)
      const Moments m = moments(gpu_fill(fill_params(kFillCases[3], t, n, 14)));
      std::printf("[stat] A_log %s: mean=%.5f min=%.5f max=%.5f\n", dtype_name(t), m.mean, m.lo, m.hi);
      EXPECT_GE(m.lo, 0.0);
      EXPECT_LE(m.hi, std::log(16.0) + 0.02);
      // E[log(1 + 15u)] = (16 ln 16 - 15) / 15
      EXPECT_NEAR(m.mean, (16 * std::log(16.0) - 15) / 15, 0.01);
    }
    {  // dt_bias: softplus(v) in [0.001, 0.1)
      const auto v = gpu_fill(fill_params(kFillCases[4], t, n, 15));
      double lo = 1e30, hi = -1e30, s = 0;
      for (float x : v) {
        const double sp = std::log1p(std::exp(static_cast<double>(x)));
        lo = std::min(lo, sp);
        hi = std::max(hi, sp);
        s += sp;
      }
      std::printf("[stat] dt_bias %s: softplus mean=%.5f min=%.5f max=%.5f\n", dtype_name(t), s / n, lo, hi);
      const double tol = t == DType::kBF16 ? 0.02 : 1e-4;  // bf16 rounds dt_bias (-6.9..-2.3) by <= 0.0135: 1.4 %
      EXPECT_GE(lo, 0.001 * (1 - tol));
      EXPECT_LE(hi, 0.1 * (1 + tol));
      EXPECT_NEAR(s / n, 0.0505, 0.001);
    }
  }
}

TEST(UtilKernels, FillRandomDeterministicAndIndependentOfLaunch) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1'000'000;
  for (DType t : {DType::kF32, DType::kBF16}) {
    FillParams p = fill_params(kFillCases[0], t, n, 77);
    const auto a = gpu_fill(p);
    const auto b = gpu_fill(p);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0) << "two runs differ";
    for (int grid : {1, 7, 1000}) {  // grid-stride loops of very different shapes
      p.grid = grid;
      const auto g = gpu_fill(p);
      EXPECT_EQ(std::memcmp(a.data(), g.data(), n * 4), 0) << "grid " << grid << " gives other values";
    }
    p.grid = 0;
    p.n = 1001;  // a different launch size: the prefix is the same
    const auto small = gpu_fill(p);
    EXPECT_EQ(std::memcmp(a.data(), small.data(), 1001 * 4), 0) << "n = 1001 gives other values";
    p.n = n;
    const auto shifted = gpu_fill(p, 1);  // unaligned output (scalar stores)
    EXPECT_EQ(std::memcmp(a.data(), shifted.data(), n * 4), 0) << "unaligned output gives other values";
    p.seed = 78;
    const auto other = gpu_fill(p);
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += a[i] == other[i];
    EXPECT_LT(same, n / 100) << "seeds 77 and 78 agree on " << same << " values";
  }
}

}  // namespace
}  // namespace ds::util
