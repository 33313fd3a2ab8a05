// Criterion parsing and evaluation (grammar in criterion.h).
#include "tools/criterion.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/stats.h"

namespace ds::tools {

namespace {
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool compare(double a, const std::string& op, double b) {
  if (op == ">=") return a >= b;
  if (op == ">") return a > b;
  if (op == "<=") return a <= b;
  return a < b;
}

// Numbers the patterns matched (digits only), range-checked: std::stoi/stod threw std::out_of_range, not a
// message that names the criterion (fuzz finding).
int to_int(const std::string& digits, const std::string& whole) {
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  CHECK(ec == std::errc() && end == digits.data() + digits.size(), "criterion '{}': {} is out of range", whole, digits);
  return v;
}
double to_double(const std::string& text, const std::string& whole) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  CHECK(end == text.c_str() + text.size() && std::isfinite(v), "criterion '{}': {} is out of range", whole, text);
  return v;
}

Selector parse_selector(const std::string& s, const std::string& whole) {
  static const std::regex re(R"(c\s*(>=|<=|>|<|=)?\s*(\d+))");
  Selector sel;
  if (s == "all") return sel;
  std::smatch m;
  CHECK(std::regex_match(s, m, re), "criterion '{}': selector '{}' must be all, cN, c>=N, c>N, c<=N or c<N", whole, s);
  const std::string op = m[1].str();
  sel.value = to_int(m[2].str(), whole);
  sel.op = op.empty() || op == "=" ? Selector::Op::kEq
           : op == ">="            ? Selector::Op::kGe
           : op == ">"             ? Selector::Op::kGt
           : op == "<="            ? Selector::Op::kLe
                                   : Selector::Op::kLt;
  return sel;
}

Clause parse_clause(const std::string& text, const std::string& whole) {
  Clause c;
  c.text = text;
  std::string cond = text;
  if (const auto at = text.rfind(" at "); at != std::string::npos) {
    cond = trim(text.substr(0, at));
    c.at = parse_selector(trim(text.substr(at + 4)), whole);
  }
  static const std::regex delta(R"((>=|<=|>|<)\s*([+-]?\d+(?:\.\d+)?)\s*%)");
  static const std::regex delta_vs(R"((>=|<=|>|<)\s*([+-]?\d+(?:\.\d+)?)\s*%\s+vs\s+stage\s+(\d+)(?:\s+(base|cand))?)");
  static const std::regex absolute(R"((>=|<=|>|<)\s*(\d+(?:\.\d+)?)\s*tps/user)");
  static const std::regex equals(R"(equals\s+stage\s+(\d+)(?:\s+(base|cand))?)");
  std::smatch m;
  if (cond == "parity" || cond == "parity within noise") {
    c.kind = Clause::Kind::kParity;
  } else if (cond == "better") {
    c.kind = Clause::Kind::kBetter;
  } else if (cond == "not worse") {
    c.kind = Clause::Kind::kNotWorse;
  } else if (cond == "no failures") {
    c.kind = Clause::Kind::kNoFailures;
  } else if (std::regex_match(cond, m, delta_vs)) {
    c.kind = Clause::Kind::kDeltaVsStage;
    c.op = m[1].str();
    c.value = to_double(m[2].str(), whole);
    c.stage = to_int(m[3].str(), whole);
    c.side = m[4].str();
  } else if (std::regex_match(cond, m, delta)) {
    c.kind = Clause::Kind::kDelta;
    c.op = m[1].str();
    c.value = to_double(m[2].str(), whole);
  } else if (std::regex_match(cond, m, absolute)) {
    c.kind = Clause::Kind::kAbsolute;
    c.op = m[1].str();
    c.value = to_double(m[2].str(), whole);
  } else if (std::regex_match(cond, m, equals)) {
    c.kind = Clause::Kind::kEquals;
    c.stage = to_int(m[1].str(), whole);
    c.side = m[2].str();
  } else {
    DS_THROW("criterion '{}': cannot read '{}' (expected parity, better, not worse, no failures, 'OP X%', "
             "'OP X% vs stage N', 'OP X tps/user' or 'equals stage N', optionally followed by 'at SELECTOR')",
             whole, cond);
  }
  return c;
}

std::vector<int> selected(const std::map<int, std::vector<double>>& m, const Selector& s) {
  std::vector<int> out;
  for (const auto& [c, v] : m) {
    if (s.matches(c)) out.push_back(c);
  }
  return out;
}
}  // namespace

bool Selector::matches(int c) const {
  switch (op) {
    case Op::kAll: return true;
    case Op::kEq: return c == value;
    case Op::kGe: return c >= value;
    case Op::kGt: return c > value;
    case Op::kLe: return c <= value;
    case Op::kLt: return c < value;
  }
  return false;
}

std::string Selector::text() const {
  switch (op) {
    case Op::kAll: return "all";
    case Op::kEq: return fmt::format("c{}", value);
    case Op::kGe: return fmt::format("c>={}", value);
    case Op::kGt: return fmt::format("c>{}", value);
    case Op::kLe: return fmt::format("c<={}", value);
    case Op::kLt: return fmt::format("c<{}", value);
  }
  return "?";
}

Criterion parse_criterion(const std::string& s) {
  Criterion c;
  c.text = trim(s);
  CHECK(!c.text.empty(), "empty criterion");
  size_t pos = 0;
  while (true) {
    const auto sep = c.text.find(" and ", pos);
    const std::string part = trim(c.text.substr(pos, sep == std::string::npos ? std::string::npos : sep - pos));
    CHECK(!part.empty(), "criterion '{}': empty clause", c.text);
    c.clauses.push_back(parse_clause(part, c.text));
    if (sep == std::string::npos) break;
    pos = sep + 5;
  }
  return c;
}

const std::map<int, std::vector<double>>& StagePoints::series(const std::string& side) const {
  if (!is_ab) return tps_user;
  return side == "base" ? base : cand;
}

CriterionOutcome evaluate_criterion(const Criterion& crit, const StagePoints& self,
                                    const std::map<int, StagePoints>& others, const AbOptions& ab) {
  CriterionOutcome out;
  out.pass = true;
  auto fail = [&](const std::string& why) {
    out.pass = false;
    out.detail += "FAIL " + why + "\n";
  };
  auto ok = [&](const std::string& why) { out.detail += "ok   " + why + "\n"; };
  for (const Clause& cl : crit.clauses) {
    if (cl.kind == Clause::Kind::kNoFailures) {
      self.failed_requests == 0 ? ok("no failed requests")
                                : fail(fmt::format("{} failed request(s)", self.failed_requests));
      continue;
    }
    const auto& mine = self.is_ab ? self.cand : self.tps_user;
    const auto cs = selected(mine, cl.at);
    if (cs.empty()) {
      fail(fmt::format("'{}': no measured concurrency matches {}", cl.text, cl.at.text()));
      continue;
    }
    const StagePoints* ref = nullptr;
    if (cl.kind == Clause::Kind::kDeltaVsStage || cl.kind == Clause::Kind::kEquals) {
      const auto it = others.find(cl.stage);
      if (it == others.end()) {
        fail(fmt::format("'{}': stage {} has no measurements", cl.text, cl.stage));
        continue;
      }
      ref = &it->second;
    }
    for (const int c : cs) {
      const std::string at = fmt::format("c={}", c);
      switch (cl.kind) {
        case Clause::Kind::kParity:
        case Clause::Kind::kBetter:
        case Clause::Kind::kNotWorse:
        case Clause::Kind::kDelta: {
          const auto vit = self.verdicts.find(c);
          if (vit == self.verdicts.end()) {
            fail(fmt::format("{} '{}' judges an A/B verdict, and this stage has none", at, cl.text));
            break;
          }
          const AbPointResult& v = vit->second;
          const std::string what = fmt::format("{} {}: delta {:+.1f}% (band ±{:.1f}%), {}", at, cl.text, v.delta_pct,
                                               v.band_pct, v.verdict_text());
          if (v.anomaly) {
            fail(what + " — repeats disagree: re-run the point; this is not a regression");
            break;
          }
          bool good = false;
          if (cl.kind == Clause::Kind::kParity) good = v.verdict == Verdict::kParity;
          if (cl.kind == Clause::Kind::kBetter) good = v.verdict == Verdict::kBetter;
          if (cl.kind == Clause::Kind::kNotWorse) good = v.verdict != Verdict::kWorse;
          if (cl.kind == Clause::Kind::kDelta) good = compare(v.delta_pct, cl.op, cl.value);
          good ? ok(what) : fail(what);
          break;
        }
        case Clause::Kind::kAbsolute: {
          const double m = median(mine.at(c));
          const std::string what = fmt::format("{} tps/user {:.2f} {} {:g}", at, m, cl.op, cl.value);
          std::isfinite(m) && compare(m, cl.op, cl.value) ? ok(what) : fail(what);
          break;
        }
        case Clause::Kind::kDeltaVsStage:
        case Clause::Kind::kEquals: {
          const auto& rs = ref->series(cl.side);
          const auto rit = rs.find(c);
          if (rit == rs.end() || rit->second.empty()) {
            fail(fmt::format("{} '{}': stage {} did not measure this concurrency", at, cl.text, cl.stage));
            break;
          }
          AbOptions o = ab;
          o.paired = false;
          const AbPointResult v = judge_ab_point({c, rit->second, mine.at(c)}, o);
          const std::string what = fmt::format("{} vs stage {}: {:.2f} vs {:.2f} tps/user, delta {:+.1f}% (band ±{:.1f}%)",
                                               at, cl.stage, v.cand_median, v.base_median, v.delta_pct, v.band_pct);
          if (v.anomaly) {
            fail(what + ", ANOMALY: " + v.anomaly_reason);
          } else if (cl.kind == Clause::Kind::kEquals) {
            v.verdict == Verdict::kParity ? ok(what + ", equal within noise") : fail(what + ", not equal");
          } else {
            compare(v.delta_pct, cl.op, cl.value) ? ok(what) : fail(what + fmt::format(", needs {} {:+g}%", cl.op, cl.value));
          }
          break;
        }
        case Clause::Kind::kNoFailures: break;
      }
    }
  }
  return out;
}

}  // namespace ds::tools
