// The sweep plot, written as SVG directly (no plotting dependency): tps/user and output throughput against
// concurrency, one line per series (run, or base and candidate).
#pragma once

#include <string>
#include <vector>

namespace ds::tools {

struct PlotPoint {
  int concurrency = 0;
  double tps_per_user = 0;  // NaN points are skipped
  double output_tps = 0;
};
struct PlotSeries {
  std::string label;
  std::vector<PlotPoint> points;
};

// Two panels side by side; x is log2(concurrency) with a tick at every concurrency measured.
std::string render_sweep_svg(const std::vector<PlotSeries>& series, const std::string& title);

}  // namespace ds::tools
