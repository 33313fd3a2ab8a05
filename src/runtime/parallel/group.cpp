// The command-line triple `--tp N --ep M --mode tep|dep` (group.h): validation and the mode's name.
#include "runtime/parallel/group.h"

#include "core/error.h"

namespace ds::parallel {

std::string to_string(Mode m) { return m == Mode::kTep ? "tep" : "dep"; }

ParallelSpec parse_parallel_spec(int tp, int ep, const std::string& mode) {
  ParallelSpec s;
  if (mode == "tep") {
    s.mode = Mode::kTep;
  } else if (mode == "dep") {
    s.mode = Mode::kDep;
  } else {
    DS_THROW("--mode '{}' is not a parallel mode (expected tep: attention tensor-parallel + MoE expert-parallel, "
             "or dep: attention data-parallel + MoE expert-parallel)",
             mode);
  }
  if (tp < 1) DS_THROW("--tp {} is not a rank count (expected an integer >= 1)", tp);
  if (ep < 1) DS_THROW("--ep {} is not a rank count (expected an integer >= 1)", ep);
  if (s.mode == Mode::kTep) {
    // The experts are split over the same tp ranks (the one TEP layout the engine has). --ep 1, the flag's
    // default, means "not given" and takes that layout too, so `--tp 8` alone is a working TEP recipe.
    if (ep != tp && ep != 1)
      DS_THROW("--ep {} does not fit --tp {} under --mode tep: --ep must equal --tp (experts split over the {} "
               "ranks) or be left at 1 (the same)",
               ep, tp, tp);
    s.tp = tp;
    s.ep = tp;
  } else {
    // DEP: attention is data-parallel, so there is nothing to split it over: one rank per --ep.
    if (tp != 1)
      DS_THROW("--tp {} with --mode dep: attention is data-parallel under dep (each rank runs its own "
               "requests), so --tp must be 1; the rank count is --ep",
               tp);
    s.tp = 1;
    s.ep = ep;
  }
  return s;
}

}  // namespace ds::parallel
