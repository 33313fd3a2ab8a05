// Paired A/B verdicts with a noise band from the repeats and an anomaly flag (estimator in ab.h).
#include "tools/ab.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/stats.h"

namespace ds::tools {

namespace {
double spread_pct(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double m = median(v);
  return m > 0 ? 100.0 * (*hi - *lo) / m : 0.0;
}
bool usable(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x) && x > 0; });
}
}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kBetter: return "better";
    case Verdict::kWorse: return "worse";
    case Verdict::kParity: return "parity within noise";
  }
  return "?";
}

std::string AbPointResult::verdict_text() const {
  return anomaly ? "ANOMALY: " + anomaly_reason : verdict_name(verdict);
}

AbPointResult judge_ab_point(const AbPointInput& in, const AbOptions& opt) {
  CHECK(!in.base.empty() && !in.cand.empty(), "A/B point c={} has no repeats", in.concurrency);
  if (opt.paired) CHECK_EQ(in.base.size(), in.cand.size());
  AbPointResult r;
  r.concurrency = in.concurrency;
  r.repeats = static_cast<int>(std::min(in.base.size(), in.cand.size()));
  if (!usable(in.base) || !usable(in.cand)) {
    // A repeat without tps/user had failed or too-short requests: nothing can be concluded from the point.
    r.anomaly = true;
    r.anomaly_reason = "a repeat produced no tps/user (failed requests or outputs under 2 tokens)";
    return r;
  }
  r.base_median = median(in.base);
  r.cand_median = median(in.cand);
  if (opt.paired) {
    for (size_t i = 0; i < in.base.size(); ++i) r.paired_delta_pct.push_back(100.0 * (in.cand[i] / in.base[i] - 1.0));
    r.delta_pct = median(r.paired_delta_pct);
  } else {
    r.delta_pct = 100.0 * (r.cand_median / r.base_median - 1.0);
  }
  r.base_spread_pct = spread_pct(in.base);
  r.cand_spread_pct = spread_pct(in.cand);
  r.band_pct = std::max({opt.noise_floor_pct, r.base_spread_pct, r.cand_spread_pct});
  if (r.delta_pct > r.band_pct) {
    r.verdict = Verdict::kBetter;
  } else if (r.delta_pct < -r.band_pct) {
    r.verdict = Verdict::kWorse;
  } else {
    r.verdict = Verdict::kParity;
  }
  const double worst = std::max(r.base_spread_pct, r.cand_spread_pct);
  if (worst > opt.max_noise_pct) {
    r.anomaly = true;
    r.anomaly_reason = fmt::format("repeats of the {} spread {:.1f}% (> {:.1f}%)",
                                   r.base_spread_pct >= r.cand_spread_pct ? "baseline" : "candidate", worst,
                                   opt.max_noise_pct);
  }
  if (r.repeats < 2) r.note = "1 repeat: the band is the floor only";
  return r;
}

nlohmann::json to_json(const AbPointResult& r) {
  return {{"concurrency", r.concurrency},
          {"repeats", r.repeats},
          {"base_median_tps_per_user", r.base_median},
          {"cand_median_tps_per_user", r.cand_median},
          {"paired_delta_pct", r.paired_delta_pct},
          {"delta_pct", r.delta_pct},
          {"base_spread_pct", r.base_spread_pct},
          {"cand_spread_pct", r.cand_spread_pct},
          {"band_pct", r.band_pct},
          // An anomaly is reported as such in the machine-readable field too, so no script reads it as "worse".
          {"verdict", r.anomaly ? "anomaly" : verdict_name(r.verdict)},
          {"anomaly", r.anomaly},
          {"anomaly_reason", r.anomaly_reason},
          {"note", r.note},
          {"verdict_text", r.verdict_text()}};
}

}  // namespace ds::tools
