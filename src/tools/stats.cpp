// Percentiles and summaries (see stats.h for the interpolation rule).
#include "tools/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ds::tools {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// v must be sorted.
double sorted_percentile(const std::vector<double>& v, double q) {
  if (v.empty()) return kNaN;
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}
}  // namespace

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return sorted_percentile(v, q);
}

double median(std::vector<double> v) { return percentile(std::move(v), 50.0); }

double mean(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

Summary summarize(const std::vector<double>& v) {
  Summary s;
  s.n = v.size();
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  s.mean = mean(v);
  s.median = sorted_percentile(sorted, 50);
  s.p90 = sorted_percentile(sorted, 90);
  s.p99 = sorted_percentile(sorted, 99);
  s.min = sorted.empty() ? kNaN : sorted.front();
  s.max = sorted.empty() ? kNaN : sorted.back();
  return s;
}

}  // namespace ds::tools
