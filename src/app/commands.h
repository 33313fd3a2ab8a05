// Subcommand registry: each src/app/cmd_*.cpp registers one `deltaserve <cmd>` without editing main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace ds::app {

struct Command {
  int order;                             // position in `deltaserve --help`
  std::function<void(CLI::App&)> setup;  // adds the subcommand, its flags and its callback
};

std::vector<Command>& command_registry();

inline bool register_command(int order, std::function<void(CLI::App&)> setup) {
  command_registry().push_back({order, std::move(setup)});
  return true;
}

// Exit status a subcommand callback sets (0 unless it says otherwise, e.g. a failed eval band).
int& exit_status();

// This process's command line as main() received it (the parallel launcher re-executes it for every rank).
std::vector<std::string>& process_args();

}  // namespace ds::app

#define DS_REGISTER_COMMAND(order, fn) \
  static const bool ds_registered_##fn = ::ds::app::register_command(order, fn)
