// Qualification matrix parsing and static checks (see matrix.h).
#include "tools/matrix.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/report.h"

namespace ds::tools {

const char* stage_mode_name(StageMode m) {
  switch (m) {
    case StageMode::kTests: return "tests";
    case StageMode::kGsm8k: return "gsm8k";
    case StageMode::kSweep: return "sweep";
    case StageMode::kAb: return "ab";
    case StageMode::kNegativeControl: return "negative-control";
  }
  return "?";
}

namespace {
StageMode parse_mode(const std::string& s, const std::string& where) {
  for (const auto m : {StageMode::kTests, StageMode::kGsm8k, StageMode::kSweep, StageMode::kAb, StageMode::kNegativeControl}) {
    if (s == stage_mode_name(m)) return m;
  }
  DS_THROW("{}: unknown mode '{}' (expected tests, gsm8k, sweep, ab or negative-control)", where, s);
}

bool is_perf(StageMode m) { return m == StageMode::kSweep || m == StageMode::kAb || m == StageMode::kNegativeControl; }

ServerLaunch resolve_server(const std::map<std::string, ServerLaunch>& servers, const std::string& name,
                            const std::map<std::string, std::string>& env, const std::string& where) {
  const auto it = servers.find(name);
  CHECK(it != servers.end(), "{}: unknown server '{}' (define it under \"servers\")", where, name);
  ServerLaunch s = it->second;
  for (const auto& [k, v] : env) s.env[k] = v;
  return s;
}

Stage parse_stage(const nlohmann::json& j, const std::string& source, const std::map<std::string, ServerLaunch>& servers,
                  const BenchSection& defaults, size_t position) {
  JsonFields f(j, fmt::format("{}: stages[{}]", source, position));
  Stage s;
  s.id = f.int32("id", -1);
  CHECK(s.id >= 1, "{}: every stage needs a positive integer \"id\"", f.where());
  const std::string where = fmt::format("{}: stage {}", source, s.id);
  s.name = f.str("name", "");
  s.mode = parse_mode(f.str("mode"), where);
  s.env = f.str_map("env");
  for (const int r : f.int_list("requires", {})) s.requires_ids.push_back(r);
  s.exclusive = f.boolean("exclusive", s.mode == StageMode::kTests);  // tests load the machine: alone by default
  s.bench = defaults;
  if (f.has("bench")) parse_bench_section(f.raw("bench"), where + ".bench", s.bench);
  if (f.has("concurrency")) s.bench.bench.concurrencies = f.int_list("concurrency", {});
  if (f.has("repeats")) s.bench.repeats = f.int32("repeats", 1);
  CHECK(s.bench.repeats >= 1, "{}: repeats must be >= 1", where);
  const std::string crit = f.str("criterion", "");
  if (!crit.empty()) s.criterion = parse_criterion(crit);

  switch (s.mode) {
    case StageMode::kTests:
      s.command = f.str_list("command", {});
      CHECK(!s.command.empty(), "{}: a tests stage needs a non-empty \"command\"", where);
      s.timeout_s = f.num("timeout_s", s.timeout_s);
      s.expect_exit = f.int32("expect_exit", 0);
      CHECK(s.criterion.empty(), "{}: a tests stage passes on its exit code; drop \"criterion\"", where);
      break;
    case StageMode::kGsm8k: {
      s.server_name = f.str("server");
      s.server = resolve_server(servers, s.server_name, s.env, where);
      s.eval.dataset_path = f.str("dataset");
      s.eval.fewshot_path = f.str("fewshot", "");
      s.eval.num_fewshot = f.int32("num_fewshot", 5);
      s.eval.limit = f.int32("limit", 0);
      s.eval.max_tokens = f.int32("max_tokens", 256);
      s.eval.concurrency = f.int32("eval_concurrency", 8);
      s.eval.model = f.str("model", "");
      if (f.has("endpoint")) s.eval.endpoint = parse_endpoint_kind(f.str("endpoint"));
      s.band = parse_band(f.str("band"), f.str("metric", "flexible-extract"));
      CHECK(s.criterion.empty(), "{}: a gsm8k stage passes on its \"band\"; drop \"criterion\"", where);
      break;
    }
    case StageMode::kSweep:
    case StageMode::kNegativeControl:
      s.server_name = f.str("server");
      s.server = resolve_server(servers, s.server_name, s.env, where);
      if (s.criterion.empty()) {
        CHECK(s.mode == StageMode::kSweep, "{}: a negative-control stage needs a criterion (e.g. \"equals stage 6 at c>=3\")", where);
        s.criterion = parse_criterion("no failures");
      }
      break;
    case StageMode::kAb:
      s.base_name = f.str("base");
      s.cand_name = f.str("cand");
      s.base = resolve_server(servers, s.base_name, s.env, where);
      s.cand = resolve_server(servers, s.cand_name, s.env, where);
      CHECK(!s.criterion.empty(), "{}: an ab stage needs a criterion (e.g. \"parity at c>=3\")", where);
      break;
  }
  f.finish();
  return s;
}

void check_references(const Matrix& m) {
  std::map<int, const Stage*> by_id;
  for (const auto& s : m.stages) {
    CHECK(by_id.emplace(s.id, &s).second, "{}: stage id {} is used twice", m.source, s.id);
  }
  for (const auto& s : m.stages) {
    const std::string where = fmt::format("{}: stage {}", m.source, s.id);
    for (const int r : s.requires_ids) {
      CHECK(by_id.count(r), "{}: requires unknown stage {}", where, r);
      CHECK(r != s.id, "{}: requires itself", where);
    }
    for (const auto& cl : s.criterion.clauses) {
      const bool ab_clause = cl.kind == Clause::Kind::kParity || cl.kind == Clause::Kind::kBetter ||
                             cl.kind == Clause::Kind::kNotWorse || cl.kind == Clause::Kind::kDelta;
      CHECK(!ab_clause || s.mode == StageMode::kAb, "{}: '{}' judges an A/B verdict; use it in an ab stage", where, cl.text);
      if (cl.kind != Clause::Kind::kDeltaVsStage && cl.kind != Clause::Kind::kEquals) continue;
      const auto it = by_id.find(cl.stage);
      CHECK(it != by_id.end(), "{}: criterion '{}' refers to unknown stage {}", where, cl.text, cl.stage);
      CHECK(cl.stage != s.id, "{}: criterion '{}' refers to its own stage", where, cl.text);
      CHECK(is_perf(it->second->mode), "{}: criterion '{}': stage {} is a {} stage, which has no tps/user", where, cl.text,
            cl.stage, stage_mode_name(it->second->mode));
      CHECK(it->second->mode != StageMode::kAb || !cl.side.empty(),
            "{}: criterion '{}': stage {} is an A/B; say which side ('stage {} base' or 'stage {} cand')", where, cl.text,
            cl.stage, cl.stage, cl.stage);
    }
    if (m.gpus > 0) {
      CHECK(s.gpus() <= m.gpus, "{}: needs {} GPUs, the matrix has {}", where, s.gpus(), m.gpus);
    }
  }
  // A requires-cycle would leave stages waiting forever: reject it here.
  std::map<int, int> state;  // 0 new, 1 on stack, 2 done
  std::function<void(int)> visit = [&](int id) {
    CHECK(state[id] != 1, "{}: stages' \"requires\" form a cycle through stage {}", m.source, id);
    if (state[id] == 2) return;
    state[id] = 1;
    for (const int r : by_id.at(id)->requires_ids) visit(r);
    state[id] = 2;
  };
  for (const auto& s : m.stages) visit(s.id);
}
}  // namespace

int Stage::gpus() const {
  int n = 0;
  for (const auto* s : {&server, &base, &cand}) {
    if (*s) n += (*s)->gpus;
  }
  return n;
}

std::string Stage::concurrencies_text() const {
  if (mode == StageMode::kTests) return "-";
  if (mode == StageMode::kGsm8k) return fmt::format("{} (eval)", eval.concurrency);
  return fmt::format("{}", fmt::join(bench.bench.concurrencies, ","));
}

std::string Stage::env_text() const {
  std::string s;
  if (!server_name.empty()) s = "server=" + server_name;
  if (!base_name.empty()) s = "base=" + base_name + ", cand=" + cand_name;
  for (const auto& [k, v] : env) s += (s.empty() ? "" : "; ") + k + "=" + v;
  return s.empty() ? "-" : s;
}

std::string Stage::criterion_text() const {
  switch (mode) {
    case StageMode::kTests: return fmt::format("exit code {}", expect_exit);
    case StageMode::kGsm8k: return fmt::format("{} in {:g}±{:g}%", band->metric, band->center, band->tolerance);
    default: return criterion.text;
  }
}

Matrix parse_matrix(const nlohmann::json& doc, const std::string& source) {
  JsonFields f(doc, source);
  Matrix m;
  m.source = source;
  m.raw = doc;
  m.name = f.str("name", "qualification");
  m.description = f.str("description", "");
  m.jobs = f.int32("jobs", m.jobs);
  CHECK(m.jobs >= 1, "{}: jobs must be >= 1", source);
  if (f.has("resources")) {
    JsonFields r(f.raw("resources"), source + ": resources");
    m.gpus = r.int32("gpus", 0);
    CHECK(m.gpus >= 0, "{}: resources.gpus must be >= 0", source);
    r.finish();
  }
  std::map<std::string, ServerLaunch> servers;
  if (f.has("servers")) {
    const auto& sv = f.raw("servers");
    CHECK(sv.is_object(), "{}: \"servers\" must be an object of named launches", source);
    for (const auto& [name, j] : sv.items()) servers.emplace(name, parse_server_launch(j, fmt::format("{}: servers.{}", source, name)));
  }
  BenchSection defaults;
  if (f.has("bench")) parse_bench_section(f.raw("bench"), source + ": bench", defaults);
  const auto& stages = f.raw("stages");
  CHECK(stages.is_array() && !stages.empty(), "{}: \"stages\" must be a non-empty array", source);
  for (size_t i = 0; i < stages.size(); ++i) m.stages.push_back(parse_stage(stages[i], source, servers, defaults, i));
  f.finish();
  std::sort(m.stages.begin(), m.stages.end(), [](const Stage& a, const Stage& b) { return a.id < b.id; });
  check_references(m);
  return m;
}

Matrix load_matrix(const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    DS_THROW("{}: invalid JSON: {}", path, e.what());
  }
  return parse_matrix(doc, path);
}

}  // namespace ds::tools
