// Recipe file parsing and command placeholder expansion (see recipe.h).
#include "tools/recipe.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/process.h"
#include "tools/report.h"

namespace ds::tools {

ServerLaunch parse_server_launch(const nlohmann::json& j, const std::string& where, const ServerLaunch* inherit) {
  JsonFields f(j, where);
  ServerLaunch s = inherit ? *inherit : ServerLaunch{};
  if (f.has("command") || !inherit) {
    s.command = f.str_list("command", {});
    CHECK(!s.command.empty(), "{}: \"command\" must be a non-empty array of strings", where);
  }
  for (const auto& [k, v] : f.str_map("env")) s.env[k] = v;
  s.host = f.str("host", s.host);
  s.port = f.int32("port", s.port);
  CHECK(s.port >= 0 && s.port < 65536, "{}: port {} out of range", where, s.port);
  s.health_timeout_s = f.num("health_timeout_s", s.health_timeout_s);
  CHECK(s.health_timeout_s > 0, "{}: health_timeout_s must be positive", where);
  s.stop_grace_s = f.num("stop_grace_s", s.stop_grace_s);
  CHECK(s.stop_grace_s >= 0, "{}: stop_grace_s must be >= 0", where);
  s.gpus = f.int32("gpus", s.gpus);
  CHECK(s.gpus >= 0 && s.gpus <= 4096, "{}: gpus must be in [0, 4096]", where);  // a stage sums three
  f.finish();
  return s;
}

void parse_bench_section(const nlohmann::json& j, const std::string& where, BenchSection& into) {
  JsonFields f(j, where);
  BenchConfig& b = into.bench;
  if (f.has("endpoint")) b.endpoint = parse_endpoint_kind(f.str("endpoint"));
  b.concurrencies = f.int_list("concurrency", b.concurrencies);
  if (auto v = f.str_or_int("input_len")) b.dataset.input_len = parse_len_range(*v, (where + ": input_len").c_str());
  if (auto v = f.str_or_int("output_len")) b.dataset.output_len = parse_len_range(*v, (where + ": output_len").c_str());
  b.dataset.path = f.str("dataset", b.dataset.path);
  b.dataset.seed = static_cast<uint64_t>(f.integer("seed", static_cast<int64_t>(b.dataset.seed)));
  if (f.has("prompt_mode")) b.dataset.prompt_mode = parse_prompt_mode(f.str("prompt_mode"));
  b.dataset.token_id_min = f.integer("token_id_min", b.dataset.token_id_min);
  b.dataset.token_id_max = f.integer("token_id_max", b.dataset.token_id_max);
  CHECK(b.dataset.token_id_min >= 0 && b.dataset.token_id_min < b.dataset.token_id_max, "{}: token id range is empty", where);
  b.requests_per_user = f.int32("requests_per_user", b.requests_per_user);
  CHECK(b.requests_per_user >= 0, "{}: requests_per_user must be >= 0 (0 = 5, or 3 at c >= 256)", where);
  b.warmup = f.boolean("warmup", b.warmup);
  b.timeout_s = f.num("timeout_s", b.timeout_s);
  b.request.model = f.str("model", b.request.model);
  b.request.ignore_eos = f.boolean("ignore_eos", b.request.ignore_eos);
  b.request.temperature = f.num("temperature", b.request.temperature);
  into.repeats = f.int32("repeats", into.repeats);
  CHECK(into.repeats >= 1, "{}: repeats must be >= 1", where);
  into.ab.noise_floor_pct = f.num("noise_floor_pct", into.ab.noise_floor_pct);
  into.ab.max_noise_pct = f.num("max_noise_pct", into.ab.max_noise_pct);
  f.finish();
}

Recipe parse_recipe(const std::string& name, const nlohmann::json& j, const std::string& source) {
  const std::string where = fmt::format("{}: recipe '{}'", source, name);
  JsonFields f(j, where);
  Recipe r;
  r.name = name;
  r.source = j;
  r.description = f.str("description", "");
  if (f.has("server")) r.server = parse_server_launch(f.raw("server"), where + ".server");
  if (f.has("ab")) {
    JsonFields ab(f.raw("ab"), where + ".ab");
    const ServerLaunch* inherit = r.server ? &*r.server : nullptr;
    r.base = parse_server_launch(ab.raw("base"), where + ".ab.base", inherit);
    r.cand = parse_server_launch(ab.raw("cand"), where + ".ab.cand", inherit);
    ab.finish();
  }
  CHECK(r.server || r.base, "{}: needs \"server\" or \"ab\"", where);
  if (f.has("bench")) parse_bench_section(f.raw("bench"), where + ".bench", r.bench);
  f.finish();
  return r;
}

std::map<std::string, Recipe> parse_recipes(const nlohmann::json& doc, const std::string& source) {
  JsonFields top(doc, source);
  const auto& all = top.raw("recipes");
  CHECK(all.is_object() && !all.empty(), "{}: \"recipes\" must be a non-empty object of named recipes", source);
  top.str("description", "");
  top.finish();
  std::map<std::string, Recipe> out;
  for (const auto& [name, j] : all.items()) out.emplace(name, parse_recipe(name, j, source));
  return out;
}

std::map<std::string, Recipe> load_recipes(const std::string& path) {
  const std::string text = read_text_file(path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    DS_THROW("{}: invalid JSON: {}", path, e.what());
  }
  return parse_recipes(doc, path);
}

const Recipe& find_recipe(const std::map<std::string, Recipe>& recipes, const std::string& name,
                          const std::string& source) {
  const auto it = recipes.find(name);
  if (it == recipes.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : recipes) names.push_back(k);
    DS_THROW("no recipe '{}' in {} (available: {})", name, source, fmt::join(names, ", "));
  }
  return it->second;
}

std::string expand_placeholders(const std::string& s, const std::string& host, int port) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '{') {
      out += s[i++];
      continue;
    }
    const auto close = s.find('}', i);
    CHECK(close != std::string::npos, "unclosed placeholder in '{}'", s);
    const std::string key = s.substr(i + 1, close - i - 1);
    if (key == "deltaserve") {
      out += self_exe();
    } else if (key == "host") {
      out += host;
    } else if (key == "port") {
      out += std::to_string(port);
    } else if (key.rfind("env:", 0) == 0) {
      const char* v = std::getenv(key.substr(4).c_str());
      CHECK(v && *v, "'{}' needs the environment variable {} (e.g. the checkpoint path)", s, key.substr(4));
      out += v;
    } else {
      DS_THROW("unknown placeholder {{{}}} in '{}' (known: {{deltaserve}}, {{host}}, {{port}}, {{env:NAME}})", key, s);
    }
    i = close + 1;
  }
  return out;
}

std::vector<std::string> expand_command(const ServerLaunch& s, int port) {
  std::vector<std::string> out;
  for (const auto& a : s.command) out.push_back(expand_placeholders(a, s.host, port));
  return out;
}

std::string default_recipes_path() {
  namespace fs = std::filesystem;
  if (fs::exists("recipes/recipes.json")) return "recipes/recipes.json";
  // build/src/deltaserve -> <repo>/recipes/recipes.json
  const fs::path beside = fs::path(self_exe()).parent_path() / ".." / ".." / "recipes" / "recipes.json";
  if (fs::exists(beside)) return fs::weakly_canonical(beside).string();
  DS_THROW("no recipes/recipes.json in the working directory or the source tree; pass --recipes FILE");
}

}  // namespace ds::tools
