// Paired A/B judgement of one sweep point from per-repeat tps/user values (pure; see docs/tools.md).
//
// Estimator, per point with R repeats measured interleaved (base, cand, cand, base, ...):
//   paired delta d_r = 100 * (cand_r / base_r - 1)                 (same-moment pairs: slow drift cancels)
//   delta           = median over r of d_r                        (unpaired: 100 * (median cand / median base - 1))
//   spread(side)    = 100 * (max - min) / median of that side's per-repeat tps/user
//   noise band B    = max(noise_floor_pct, spread(base), spread(cand))
//   verdict         = better if delta > B, worse if delta < -B, else parity within noise
//   anomaly         = some repeat failed, or a side's spread exceeds max_noise_pct: the repeats disagree beyond
//                     the band a sound measurement keeps, so the verdict is withheld (never a regression).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ds::tools {

enum class Verdict { kParity, kBetter, kWorse };

struct AbOptions {
  double noise_floor_pct = 1.0;  // smallest band: timer and scheduling jitter never vanish, even at R = 1
  double max_noise_pct = 10.0;   // a side whose repeats spread wider than this makes the point an anomaly
  bool paired = true;            // false for cross-run comparisons (repeats of two runs are not pairs)
};

struct AbPointInput {
  int concurrency = 0;
  std::vector<double> base;  // per-repeat tps/user of the baseline
  std::vector<double> cand;  // per-repeat tps/user of the candidate (same length when paired)
};

struct AbPointResult {
  int concurrency = 0;
  int repeats = 0;
  double base_median = 0, cand_median = 0;
  std::vector<double> paired_delta_pct;  // empty when unpaired
  double delta_pct = 0;
  double base_spread_pct = 0, cand_spread_pct = 0;
  double band_pct = 0;
  Verdict verdict = Verdict::kParity;
  bool anomaly = false;
  std::string anomaly_reason;
  std::string note;  // e.g. "1 repeat: band is the floor only"

  // "better", "worse", "parity within noise", or "ANOMALY: <reason>" (anomaly wins over the verdict).
  std::string verdict_text() const;
};

AbPointResult judge_ab_point(const AbPointInput& in, const AbOptions& opt);

const char* verdict_name(Verdict v);
nlohmann::json to_json(const AbPointResult& r);

}  // namespace ds::tools
