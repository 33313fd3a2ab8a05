// Order statistics used by every report: percentiles (linear interpolation), mean, and a one-struct summary.
#pragma once

#include <cstddef>
#include <vector>

namespace ds::tools {

// Percentile q in [0, 100] with linear interpolation between closest ranks (numpy's default "linear"
// method), so small samples give the values people compare against elsewhere. NaN for an empty sample.
double percentile(std::vector<double> v, double q);
double median(std::vector<double> v);
double mean(const std::vector<double>& v);

struct Summary {
  size_t n = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;  // NaN when n == 0
};
Summary summarize(const std::vector<double>& v);

}  // namespace ds::tools
