// Hand-written SVG line charts (see svg_plot.h).
#include "tools/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace ds::tools {

namespace {
constexpr double kPanelW = 460, kPanelH = 320, kLeft = 70, kRight = 20, kTop = 50, kBottom = 60;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

std::string escape(const std::string& s) {
  std::string o;
  for (const char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// A "nice" upper bound (1, 2, 2.5 or 5 times a power of ten) so the y ticks read as round numbers.
double nice_max(double v) {
  if (!(v > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (v <= m * p) return m * p;
  }
  return 10 * p;
}

std::string panel(double x0, const std::vector<PlotSeries>& series, const std::vector<int>& xs, bool tps_user,
                  const std::string& ylabel) {
  std::string s;
  const double w = kPanelW - kLeft - kRight, h = kPanelH - kTop - kBottom;
  const double ox = x0 + kLeft, oy = kTop + h;
  double ymax = 0;
  for (const auto& se : series) {
    for (const auto& p : se.points) {
      const double y = tps_user ? p.tps_per_user : p.output_tps;
      if (std::isfinite(y)) ymax = std::max(ymax, y);
    }
  }
  ymax = nice_max(ymax * 1.05);
  const double lx0 = std::log2(static_cast<double>(xs.front()));
  const double lx1 = std::log2(static_cast<double>(xs.back()));
  auto px = [&](int c) {
    return xs.size() == 1 || lx1 == lx0 ? ox + w / 2 : ox + w * (std::log2(static_cast<double>(c)) - lx0) / (lx1 - lx0);
  };
  auto py = [&](double y) { return oy - h * y / ymax; };
  s += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#444"/>)" "\n", ox, kTop, w, h);
  for (int i = 0; i <= 5; ++i) {
    const double y = ymax * i / 5;
    s += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)" "\n", ox, py(y), ox + w, py(y));
    s += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">{:g}</text>)" "\n", ox - 6, py(y) + 4, y);
  }
  for (const int c : xs) {
    s += fmt::format(R"(<text x="{:.1f}" y="{}" font-size="11" text-anchor="middle">{}</text>)" "\n", px(c), oy + 16, c);
  }
  s += fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">concurrency (users)</text>)" "\n",
                   ox + w / 2, oy + 36);
  s += fmt::format(R"(<text x="{}" y="{}" font-size="13" font-weight="bold" text-anchor="middle">{}</text>)" "\n",
                   ox + w / 2, kTop - 10, escape(ylabel));
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    std::string pts;
    for (const auto& p : series[i].points) {
      const double y = tps_user ? p.tps_per_user : p.output_tps;
      if (!std::isfinite(y)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(p.concurrency), py(y));
      s += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)" "\n", px(p.concurrency), py(y), color);
    }
    s += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)" "\n", pts, color);
  }
  return s;
}
}  // namespace

std::string render_sweep_svg(const std::vector<PlotSeries>& series, const std::string& title) {
  std::set<int> xs_set;
  for (const auto& se : series) {
    for (const auto& p : se.points) xs_set.insert(p.concurrency);
  }
  const double width = 2 * kPanelW, height = kPanelH + 30;
  std::string s = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif">)"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  s += fmt::format(R"(<text x="{}" y="20" font-size="15" text-anchor="middle">{}</text>)" "\n", width / 2, escape(title));
  if (xs_set.empty()) {
    s += R"(<text x="50%" y="50%" text-anchor="middle">no data</text>)" "\n</svg>\n";
    return s;
  }
  const std::vector<int> xs(xs_set.begin(), xs_set.end());
  s += panel(0, series, xs, true, "tps/user = 1000 / median TPOT (ms)");
  s += panel(kPanelW, series, xs, false, "output tokens/s (all users)");
  // Legend along the bottom.
  double lx = kLeft;
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    s += fmt::format(R"(<rect x="{}" y="{}" width="14" height="4" fill="{}"/>)" "\n", lx, height - 16, color);
    s += fmt::format(R"(<text x="{}" y="{}" font-size="12">{}</text>)" "\n", lx + 20, height - 11, escape(series[i].label));
    lx += 30 + 8.0 * static_cast<double>(series[i].label.size());
  }
  s += "</svg>\n";
  return s;
}

}  // namespace ds::tools
