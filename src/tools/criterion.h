// Pass criteria of qualification stages, written as short text in the matrix and parsed strictly:
//
//   criterion := clause (" and " clause)*
//   clause    := condition [" at " selector]              (selector defaults to "all")
//   selector  := all | cN | c>=N | c>N | c<=N | c<N
//   condition := parity | better | not worse              (ab: the point's verdict; an anomaly never passes)
//              | OP X%                                    (ab: median paired delta of tps/user, e.g. ">= +5%")
//              | OP X% vs stage N [base|cand]             (sweep: median tps/user against another stage)
//              | OP X tps/user                            (sweep, ab (candidate side): absolute)
//              | equals stage N [base|cand]               (parity within the noise band, unpaired)
//              | no failures                              (every request succeeded)
//   OP        := >= | > | <= | <
//
// Examples: "parity at c>=3", ">= +5% at c1", ">= -3% vs stage 3", "equals stage 6 cand at c>=3".
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/ab.h"

namespace ds::tools {

struct Selector {
  enum class Op { kAll, kEq, kGe, kGt, kLe, kLt } op = Op::kAll;
  int value = 0;
  bool matches(int c) const;
  std::string text() const;
};

struct Clause {
  enum class Kind { kParity, kBetter, kNotWorse, kDelta, kDeltaVsStage, kAbsolute, kEquals, kNoFailures } kind;
  std::string op;          // ">=", ">", "<=", "<" for kDelta / kDeltaVsStage / kAbsolute
  double value = 0;        // percent or tps/user
  int stage = 0;           // referenced stage id
  std::string side;        // "base" | "cand" | "" (reference stage's side when it is an A/B)
  Selector at;
  std::string text;        // as written
};

struct Criterion {
  std::vector<Clause> clauses;
  std::string text;
  bool empty() const { return clauses.empty(); }
};

// Throws ds::Error quoting the criterion and the part that does not parse.
Criterion parse_criterion(const std::string& s);

// What a performance stage measured: per concurrency, per-repeat tps/user (sweep) or both sides and the
// verdict (ab).
struct StagePoints {
  bool is_ab = false;
  std::map<int, std::vector<double>> tps_user;   // sweep: per repeat
  std::map<int, std::vector<double>> base, cand; // ab: per repeat
  std::map<int, AbPointResult> verdicts;         // ab
  int failed_requests = 0;
  // The series a reference "stage N [side]" means: sweep -> tps_user; ab -> the named side (cand default).
  const std::map<int, std::vector<double>>& series(const std::string& side) const;
};

struct CriterionOutcome {
  bool pass = false;
  std::string detail;  // one line per clause and point that decided it
};

// `others` maps stage ids to their points (stages without data are absent: referencing one fails).
CriterionOutcome evaluate_criterion(const Criterion& c, const StagePoints& self,
                                    const std::map<int, StagePoints>& others, const AbOptions& ab);

}  // namespace ds::tools
