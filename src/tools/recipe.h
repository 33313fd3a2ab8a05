// Recipes: named sweeps in a JSON file (recipes/recipes.json). A recipe says how to launch the server(s)
// (command with placeholders, environment knobs) and what to measure (concurrencies, lengths, repeats),
// optionally as an A/B pair. The "bench" section is shared with qualification matrices.
//
// Command placeholders: {deltaserve} (this binary), {host}, {port} (chosen per server), {env:NAME} (the
// value of an environment variable, an error when unset: e.g. the checkpoint path).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/ab.h"
#include "tools/bench.h"
#include "tools/json_fields.h"

namespace ds::tools {

struct ServerLaunch {
  std::vector<std::string> command;          // argv with placeholders
  std::map<std::string, std::string> env;    // environment knobs for this server
  std::string host = "127.0.0.1";
  int port = 0;                              // 0 = a free port picked at launch
  double health_timeout_s = 600;             // a full-size model loads for minutes
  double stop_grace_s = 30;                  // SIGTERM -> SIGKILL delay (a server drains its streams)
  int gpus = 0;                              // GPUs it needs (matrix scheduling; CUDA_VISIBLE_DEVICES)
};

// A recipe's or stage's measurement settings.
struct BenchSection {
  BenchConfig bench;
  int repeats = 3;   // A/B repeats per point
  AbOptions ab;
};

struct Recipe {
  std::string name, description;
  std::optional<ServerLaunch> server;   // single-server sweep
  std::optional<ServerLaunch> base, cand;  // A/B pair (both or neither)
  BenchSection bench;
  nlohmann::json source;                // the recipe as written (stored in reports)
};

// Reads a server launch: {"command": [...], "env": {...}, "host", "port", "health_timeout_s", "gpus"}.
// `inherit` fills command and env (merged under this one's) for A/B sides that only change knobs.
ServerLaunch parse_server_launch(const nlohmann::json& j, const std::string& where,
                                 const ServerLaunch* inherit = nullptr);
// Reads a "bench" object into `into` (only keys present change it).
void parse_bench_section(const nlohmann::json& j, const std::string& where, BenchSection& into);

Recipe parse_recipe(const std::string& name, const nlohmann::json& j, const std::string& source);
// The whole file: {"recipes": {"name": {...}, ...}}.
std::map<std::string, Recipe> load_recipes(const std::string& path);
std::map<std::string, Recipe> parse_recipes(const nlohmann::json& doc, const std::string& source);
const Recipe& find_recipe(const std::map<std::string, Recipe>& recipes, const std::string& name,
                          const std::string& source);

// Replaces the placeholders; throws on an unknown placeholder or an unset {env:NAME}.
std::string expand_placeholders(const std::string& s, const std::string& host, int port);
std::vector<std::string> expand_command(const ServerLaunch& s, int port);

// recipes/recipes.json in the working directory, else beside the source tree of this binary.
std::string default_recipes_path();

}  // namespace ds::tools
