// deltaserve: one binary, many subcommands (see `deltaserve --help`).
#include <algorithm>
#include <cstdio>

#include "app/commands.h"
#include "core/error.h"

namespace ds::app {
std::vector<Command>& command_registry() {
  static std::vector<Command> r;
  return r;
}
int& exit_status() {
  static int s = 0;
  return s;
}
std::vector<std::string>& process_args() {
  static std::vector<std::string> a;
  return a;
}
}  // namespace ds::app

int main(int argc, char** argv) {
  ds::app::process_args().assign(argv, argv + argc);
  CLI::App app{
      "deltaserve — inference engine and OpenAI-compatible server for Kimi-Linear-family models\n"
      "(Kimi Delta Attention + MLA + MoE), with benchmark and accuracy tools.\n"
      "Without --model, commands use the embedded tiny default model (runs on CPU when there is no GPU)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  auto& reg = ds::app::command_registry();
  std::stable_sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& c : reg) c.setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return ds::app::exit_status();
}
