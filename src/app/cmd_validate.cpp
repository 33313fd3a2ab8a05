// `deltaserve validate --matrix FILE`: run a release qualification matrix, print the PASS/FAIL table.
#ifdef DELTASERVE_WITH_SERVER

#include <iostream>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/error.h"
#include "tools/json_fields.h"
#include "tools/report.h"
#include "tools/validate.h"

namespace {

using namespace ds::tools;

struct ValidateArgs {
  std::string matrix, out;
  int jobs = 0;
  bool check_only = false;
};

void run(ValidateArgs& a) {
  Matrix m = load_matrix(a.matrix);
  if (a.jobs > 0) m.jobs = a.jobs;
  if (a.check_only) {
    std::cout << fmt::format("{}: {} stages, valid\n", a.matrix, m.stages.size());
    return;
  }
  ValidateOptions opt;
  opt.out_prefix = a.out.empty() ? "validate" : a.out;
  const ValidateReport rep = run_matrix(m, opt);
  write_text_file(opt.out_prefix + ".md", rep.markdown);
  write_text_file(opt.out_prefix + ".json", ds::tools::report_json(rep.json, 1) + "\n");
  std::cout << rep.markdown << std::flush;
  std::cerr << fmt::format("wrote {0}.md, {0}.json (stage logs and reports: {0}.stage*)\n", opt.out_prefix);
  if (rep.any_fail) ds::app::exit_status() = 1;
}

void setup(CLI::App& app) {
  auto a = std::make_shared<ValidateArgs>();
  auto* cmd = app.add_subcommand("validate", "Run a release qualification matrix (tests, GSM8K bands, sweeps, A/B, negative controls)");
  cmd->add_option("--matrix", a->matrix, "Matrix JSON")->required();
  cmd->add_option("--out", a->out, "Output prefix (default validate): PREFIX.md, PREFIX.json, PREFIX.stage<N>.*");
  cmd->add_option("--jobs", a->jobs, "Most stages at the same moment (default: the matrix's, else 4)");
  cmd->add_flag("--check", a->check_only, "Only parse and check the matrix");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DS_REGISTER_COMMAND(60, setup);

#endif  // DELTASERVE_WITH_SERVER
