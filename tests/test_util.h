// The one tolerance helper of the test suite: always prints max-abs error, RMS ratio ||out-ref||/||ref|| and the
// NaN count, then passes when nothing is NaN and (max-abs <= atol or RMS ratio < rms_tol) (fla's assert_close).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace ds::test {

struct CloseStats {
  double max_abs = 0.0;   // max |out - ref|
  double rms_ratio = 0.0; // ||out - ref|| / ||ref||  (||out - ref|| when ref is all zeros)
  size_t nan_count = 0;   // NaN or inf in out where ref is finite
  size_t n = 0;
};

inline CloseStats close_stats(const float* out, const float* ref, size_t n) {
  CloseStats s;
  s.n = n;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i]) && std::isfinite(ref[i])) {
      ++s.nan_count;
      continue;
    }
    const double d = static_cast<double>(out[i]) - ref[i];
    if (std::isfinite(d)) {
      s.max_abs = std::max(s.max_abs, std::fabs(d));
      err2 += d * d;
    }
    if (std::isfinite(ref[i])) ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  s.rms_ratio = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return s;
}

// Prints one line "[what] n=.. max_abs=.. rms_ratio=.. nan=.." and returns the verdict.
inline ::testing::AssertionResult expect_close(const std::string& what, const float* out, const float* ref, size_t n,
                                               double rms_tol, double atol = 1e-6) {
  const CloseStats s = close_stats(out, ref, n);
  std::printf("[close] %-40s n=%zu max_abs=%.3e rms_ratio=%.3e nan=%zu (rms_tol %.1e)\n", what.c_str(), s.n,
              s.max_abs, s.rms_ratio, s.nan_count, rms_tol);
  std::fflush(stdout);
  if (s.nan_count == 0 && (s.max_abs <= atol || s.rms_ratio < rms_tol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max_abs=" << s.max_abs << " rms_ratio=" << s.rms_ratio
                                       << " nan=" << s.nan_count << " (rms_tol " << rms_tol << ", atol " << atol
                                       << ")";
}

inline ::testing::AssertionResult expect_close(const std::string& what, const std::vector<float>& out,
                                               const std::vector<float>& ref, double rms_tol, double atol = 1e-6) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << out.size() << " vs " << ref.size();
  return expect_close(what, out.data(), ref.data(), out.size(), rms_tol, atol);
}

}  // namespace ds::test
