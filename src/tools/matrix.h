// Release qualification matrices (`deltaserve validate --matrix FILE`): numbered stages, each with a mode,
// extra environment, concurrencies and a pass criterion. This file parses and checks them; validate.h runs them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tools/criterion.h"
#include "tools/gsm8k.h"
#include "tools/recipe.h"

namespace ds::tools {

enum class StageMode { kTests, kGsm8k, kSweep, kAb, kNegativeControl };
const char* stage_mode_name(StageMode m);

struct Stage {
  int id = 0;
  std::string name;
  StageMode mode = StageMode::kTests;
  std::map<std::string, std::string> env;   // the stage's own knobs (also applied to its servers)
  std::vector<int> requires_ids;            // stages that must PASS first (otherwise this one is NOT RUN)
  bool exclusive = false;                   // runs with no other stage at the same moment
  // tests
  std::vector<std::string> command;
  double timeout_s = 3600;
  int expect_exit = 0;
  // servers: named in the matrix, resolved here with the stage env merged over theirs
  std::string server_name, base_name, cand_name;
  std::optional<ServerLaunch> server, base, cand;
  BenchSection bench;                       // the matrix's "bench" with the stage's overrides
  Criterion criterion;
  // gsm8k
  EvalOptions eval;                         // base_url is filled when the server is up
  std::optional<Band> band;

  int gpus() const;                         // both A/B servers run at once, so their GPUs add up
  std::string concurrencies_text() const;   // "1,2,4", or the eval concurrency, or "-"
  std::string env_text() const;             // "server=baseline; DELTASERVE_X=1"
  std::string criterion_text() const;
};

struct Matrix {
  std::string name, description, source;
  int gpus = 0;                             // GPUs to share between stages (0: no GPU accounting)
  int jobs = 4;                             // most stages at the same moment
  std::vector<Stage> stages;                // in id order
  nlohmann::json raw;
};

// Throws ds::Error naming the file, the stage and the field for anything wrong: unknown keys or modes,
// duplicate ids, missing criteria, references to unknown or non-performance stages, requires cycles,
// stages needing more GPUs than the matrix has.
Matrix parse_matrix(const nlohmann::json& doc, const std::string& source);
Matrix load_matrix(const std::string& path);

}  // namespace ds::tools
