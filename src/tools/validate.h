// Runs a qualification matrix: stages start as soon as their requirements passed and resources (GPUs, the
// exclusive flag, the jobs limit) allow, so independent stages run at the same moment and their comparisons
// are same-moment; criteria are evaluated once every stage has finished. Output: a Markdown PASS/FAIL
// matrix and the JSON behind it.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tools/matrix.h"

namespace ds::tools {

enum class StageStatus { kPass, kFail, kNotRun };
const char* stage_status_name(StageStatus s);

struct StageResult {
  int id = 0;
  StageStatus status = StageStatus::kNotRun;
  bool measured = false;            // perf stages: measurements exist (criterion still to evaluate)
  std::string result;               // one line for the matrix
  std::string detail;               // Markdown below the matrix
  nlohmann::json data = nlohmann::json::object();
  std::optional<StagePoints> points;
  double start_s = -1, end_s = -1;  // seconds since the run started (-1: never ran)
  std::vector<int> gpus;            // GPU ids the stage's servers got
};

struct ValidateOptions {
  std::string out_prefix = "validate";  // logs and per-stage files: <prefix>.stage<N>.*
  bool progress_lines = true;           // one stderr line per pass/stage event
};

struct ValidateReport {
  std::vector<StageResult> results;     // in stage id order
  std::string markdown;
  nlohmann::json json;
  bool any_fail = false;
};

ValidateReport run_matrix(const Matrix& m, const ValidateOptions& opt);

}  // namespace ds::tools
