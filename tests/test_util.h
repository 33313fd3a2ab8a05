// Shared test helpers: the one tolerance report (max-abs error, RMS ratio, NaN count), random fills, GPU skip.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/device.h"

namespace ds::test {

struct ErrorStats {
  double max_abs = 0;
  double rms_ratio = 0;  // ||out - ref|| / ||ref||
  int64_t nan_count = 0;
  int64_t n = 0;
};

// How many elements of a and b differ, a size difference counting as that many (a bitwise comparison that also
// counts, for the error line of a test that expects 0).
template <class T>
int64_t count_differing(const std::vector<T>& a, const std::vector<T>& b) {
  const size_t n = std::min(a.size(), b.size());
  int64_t d = static_cast<int64_t>(std::max(a.size(), b.size()) - n);
  for (size_t i = 0; i < n; ++i) d += a[i] != b[i];
  return d;
}

// Compares out against ref, prints one line with the statistics, and returns them.
inline ErrorStats compare(const std::string& what, const float* out, const float* ref, int64_t n) {
  ErrorStats s;
  s.n = n;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(out[i]) || std::isnan(ref[i])) {
      ++s.nan_count;
      continue;
    }
    const double d = static_cast<double>(out[i]) - ref[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  s.rms_ratio = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  std::printf("[err] %-40s n=%-9lld max_abs=%.3e rms_ratio=%.3e nan=%lld\n", what.c_str(),
              static_cast<long long>(n), s.max_abs, s.rms_ratio, static_cast<long long>(s.nan_count));
  std::fflush(stdout);
  return s;
}
inline ErrorStats compare(const std::string& what, const std::vector<float>& out, const std::vector<float>& ref) {
  EXPECT_EQ(out.size(), ref.size()) << what;
  return compare(what, out.data(), ref.data(), static_cast<int64_t>(std::min(out.size(), ref.size())));
}

// Asserts the RMS ratio is below `tol` and nothing is NaN.
#define EXPECT_CLOSE(what, out, ref, tol)                              \
  do {                                                                 \
    const auto ds_s_ = ::ds::test::compare(what, out, ref);            \
    EXPECT_EQ(ds_s_.nan_count, 0) << what;                             \
    EXPECT_LT(ds_s_.rms_ratio, tol) << what;                           \
  } while (0)

// The same report as a gtest predicate, with fla's assert_close rule: passes when nothing is NaN and
// (max_abs <= atol or rms_ratio < rms_tol). Use as EXPECT_TRUE(expect_close(...)).
inline ::testing::AssertionResult expect_close(const std::string& what, const std::vector<float>& out,
                                               const std::vector<float>& ref, double rms_tol, double atol = 1e-6) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << out.size() << " vs " << ref.size();
  const ErrorStats s = compare(what, out.data(), ref.data(), static_cast<int64_t>(out.size()));
  if (s.nan_count == 0 && (s.max_abs <= atol || s.rms_ratio < rms_tol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max_abs=" << s.max_abs << " rms_ratio=" << s.rms_ratio
                                       << " nan=" << s.nan_count << " (rms_tol " << rms_tol << ", atol " << atol
                                       << ")";
}

inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// An empty directory unique to the running test (process id, suite and test name), removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("ds_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ds::test

// First line of every GPU test: skips cleanly on machines without a GPU (CI).
#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    if (!::ds::cuda_device_available()) GTEST_SKIP() << "no CUDA GPU present"; \
  } while (0)
