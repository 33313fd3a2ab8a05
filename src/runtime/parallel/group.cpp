// The command-line parallel spec (group.h): validation shared by every rank process and the tests.
#include "runtime/parallel/group.h"

#include "core/error.h"

namespace ds::parallel {

std::string to_string(Mode m) { return m == Mode::kTep ? "tep" : "dep"; }

ParallelSpec parse_parallel_spec(int tp, int ep, const std::string& mode) {
  ParallelSpec s;
  if (mode == "tep")
    s.mode = Mode::kTep;
  else if (mode == "dep")
    s.mode = Mode::kDep;
  else
    DS_THROW("--mode '{}': expected tep or dep", mode);
  if (tp < 1) DS_THROW("--tp {}: must be >= 1", tp);
  if (ep < 1) DS_THROW("--ep {}: must be >= 1", ep);
  if (s.mode == Mode::kTep) {
    if (ep != tp && ep != 1)
      DS_THROW("--mode tep --tp {} --ep {}: TEP needs --ep equal to --tp (experts split over the same ranks) or 1",
               tp, ep);
    s.tp = tp;
    s.ep = ep;
  } else {
    if (tp != 1) DS_THROW("--mode dep --tp {}: DEP keeps attention whole on every rank; use --tp 1 (or leave it unset)", tp);
    s.tp = 1;
    s.ep = ep;
  }
  return s;
}

}  // namespace ds::parallel
