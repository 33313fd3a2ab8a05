// `deltaserve sweep --recipe NAME`: launch a recipe's server(s), sweep (or A/B), stop them, write one report.
#ifdef DELTASERVE_WITH_SERVER

#include <iostream>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/error.h"
#include "tools/bench.h"
#include "tools/sweep.h"

namespace {

using namespace ds::tools;

struct SweepArgs {
  std::string recipe, recipes, out, concurrency;
  int repeats = 0;
  bool no_ab = false, list = false;
};

void run(SweepArgs& a) {
  const std::string path = a.recipes.empty() ? default_recipes_path() : a.recipes;
  const auto recipes = load_recipes(path);
  if (a.list || a.recipe.empty()) {
    std::cout << "Recipes in " << path << ":\n";
    for (const auto& [name, r] : recipes) {
      std::cout << fmt::format("  {:<16} {}{}\n", name, r.base ? "[A/B] " : "", r.description);
    }
    if (!a.list) {
      std::cerr << "error: pass --recipe NAME\n";
      ds::app::exit_status() = 2;
    }
    return;
  }
  Recipe recipe = find_recipe(recipes, a.recipe, path);
  if (!a.concurrency.empty()) recipe.bench.bench.concurrencies = parse_concurrency_list(a.concurrency);
  if (a.repeats > 0) recipe.bench.repeats = a.repeats;
  const std::string prefix = a.out.empty() ? "sweep-" + recipe.name : a.out;
  Progress progress(stderr);
  SweepOptions opt;
  opt.run_ab = !a.no_ab;
  opt.log_prefix = prefix;
  const BenchReport rep = run_recipe(recipe, opt, progress);
  std::cout << render_markdown(rep) << std::flush;
  write_report_files(rep, prefix + ".md", prefix + ".json", prefix + ".svg");
  progress.message(fmt::format("wrote {0}.md, {0}.json, {0}.svg (server logs: {0}.*.log)", prefix));
}

void setup(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  auto* cmd = app.add_subcommand("sweep", "Run a named recipe: start the server(s), sweep or A/B, stop them, write the report");
  cmd->add_option("--recipe", a->recipe, "Recipe name (see --list)");
  cmd->add_option("--recipes", a->recipes, "Recipe file (default: recipes/recipes.json)");
  cmd->add_option("--out", a->out, "Output prefix: PREFIX.md, PREFIX.json, PREFIX.svg, PREFIX.<server>.log (default sweep-NAME)");
  cmd->add_option("--concurrency", a->concurrency, "Override the recipe's concurrencies, e.g. 1,2,4");
  cmd->add_option("--repeats", a->repeats, "Override the recipe's A/B repeats");
  cmd->add_flag("--no-ab", a->no_ab, "Run the recipe's single-server sweep even when it has an A/B pair");
  cmd->add_flag("--list", a->list, "List the recipes and exit");
  cmd->callback([a] { run(*a); });
}

}  // namespace

DS_REGISTER_COMMAND(40, setup);

#endif  // DELTASERVE_WITH_SERVER
