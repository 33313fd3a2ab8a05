// libFuzzer harness: recipe files and qualification matrices on arbitrary JSON. Byte 0 bit 0: matrix or recipes.
// Only ds::Error may escape (recipe.h / matrix.h: every error names the file and field). Whatever is accepted
// must hold the checks the parsers promise (ranges, references, no requires cycle, GPU budget) and keep the
// integers as written (no silent narrowing of an int64 into an int).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "tools/matrix.h"
#include "tools/recipe.h"

namespace {

using namespace ds::tools;
using nlohmann::json;

void check(bool ok) {
  if (!ok) std::abort();
}

// raw, when present, is the integer v (nlohmann's own == casts unsigned to signed, so compare here).
void check_same_int(const json& obj, const char* key, int64_t v) {
  if (!obj.is_object() || !obj.contains(key)) return;
  const json& raw = obj.at(key);
  if (raw.is_number_unsigned()) check(v >= 0 && raw.get<uint64_t>() == static_cast<uint64_t>(v));
  else check(raw.get<int64_t>() == v);
}

void check_launch(const ServerLaunch& s, const json& src) {
  check(!s.command.empty() && s.port >= 0 && s.port < 65536 && s.health_timeout_s > 0 && s.stop_grace_s >= 0 &&
        s.gpus >= 0);
  check_same_int(src, "port", s.port);
  check_same_int(src, "gpus", s.gpus);
  try {
    (void)expand_command(s, 8000);  // unknown placeholders and unset {env:NAME} throw ds::Error
  } catch (const ds::Error&) {
  }
}

void check_bench(const BenchSection& b) {
  check(!b.bench.concurrencies.empty() && b.repeats >= 1 && b.bench.requests_per_user >= 0);
  for (int c : b.bench.concurrencies) check(c >= 1 && c <= 1000000);
  check(b.bench.dataset.token_id_min >= 0 && b.bench.dataset.token_id_min < b.bench.dataset.token_id_max);
}

void fuzz_recipes(const json& doc) {
  std::map<std::string, Recipe> recipes;
  try {
    recipes = parse_recipes(doc, "fuzz");
  } catch (const ds::Error&) {
    return;
  }
  check(!recipes.empty());
  for (const auto& [name, r] : recipes) {
    check(&find_recipe(recipes, name, "fuzz") == &r && r.name == name);
    check(r.server.has_value() || (r.base.has_value() && r.cand.has_value()));
    check(r.base.has_value() == r.cand.has_value());
    if (r.server) check_launch(*r.server, r.source.value("server", json()));
    const json ab = r.source.value("ab", json());
    if (r.base) check_launch(*r.base, ab.is_object() ? ab.value("base", json()) : json());
    if (r.cand) check_launch(*r.cand, ab.is_object() ? ab.value("cand", json()) : json());
    check_bench(r.bench);
  }
}

void fuzz_matrix(const json& doc) {
  Matrix m;
  try {
    m = parse_matrix(doc, "fuzz");
  } catch (const ds::Error&) {
    return;
  }
  check(m.jobs >= 1 && m.gpus >= 0 && !m.stages.empty());
  check_same_int(doc, "jobs", m.jobs);
  check_same_int(doc.value("resources", json()), "gpus", m.gpus);
  std::map<int, const Stage*> by_id;
  std::multiset<int64_t> written_ids;
  for (const json& s : doc.at("stages")) written_ids.insert(s.at("id").get<int64_t>());
  std::multiset<int64_t> ids;
  for (const Stage& s : m.stages) {
    check(s.id >= 1 && by_id.emplace(s.id, &s).second);
    ids.insert(s.id);
  }
  check(ids == written_ids);  // stage ids as written (a 2^32 + 1 read as 1 would alias stage 1)
  check(std::is_sorted(m.stages.begin(), m.stages.end(), [](const Stage& a, const Stage& b) { return a.id < b.id; }));
  auto is_perf = [](StageMode md) {
    return md == StageMode::kSweep || md == StageMode::kAb || md == StageMode::kNegativeControl;
  };
  for (const Stage& s : m.stages) {
    for (int r : s.requires_ids) check(by_id.count(r) && r != s.id);
    for (const Clause& c : s.criterion.clauses) {
      const bool ab_clause = c.kind == Clause::Kind::kParity || c.kind == Clause::Kind::kBetter ||
                             c.kind == Clause::Kind::kNotWorse || c.kind == Clause::Kind::kDelta;
      check(!ab_clause || s.mode == StageMode::kAb);
      if (c.kind == Clause::Kind::kDeltaVsStage || c.kind == Clause::Kind::kEquals)
        check(by_id.count(c.stage) && c.stage != s.id && is_perf(by_id.at(c.stage)->mode));
    }
    switch (s.mode) {
      case StageMode::kTests: check(!s.command.empty() && s.criterion.empty()); break;
      case StageMode::kGsm8k:
        check(s.server && s.band && s.criterion.empty());
        check(s.band->center >= 0 && s.band->center <= 100 && s.band->tolerance >= 0);
        break;
      case StageMode::kSweep:
      case StageMode::kNegativeControl: check(s.server && !s.criterion.empty()); break;
      case StageMode::kAb: check(s.base && s.cand && !s.criterion.empty()); break;
    }
    for (const auto* l : {&s.server, &s.base, &s.cand})
      if (*l) check(!(*l)->command.empty() && (*l)->gpus >= 0);
    check_bench(s.bench);
    if (m.gpus > 0) check(s.gpus() >= 0 && s.gpus() <= m.gpus);  // validate.cpp adds them up only then
    (void)s.concurrencies_text();
    (void)s.env_text();
    (void)s.criterion_text();
  }
  // "requires" is acyclic: Kahn's algorithm consumes every stage.
  std::map<int, int> indeg;
  std::map<int, std::vector<int>> users;
  for (const Stage& s : m.stages) {
    indeg[s.id] += 0;
    for (int r : s.requires_ids) {
      ++indeg[s.id];
      users[r].push_back(s.id);
    }
  }
  std::vector<int> ready;
  for (const auto& [id, d] : indeg)
    if (d == 0) ready.push_back(id);
  size_t done = 0;
  while (!ready.empty()) {
    const int id = ready.back();
    ready.pop_back();
    ++done;
    for (int u : users[id])
      if (--indeg[u] == 0) ready.push_back(u);
  }
  check(done == m.stages.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto doc = json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;  // load_recipes / load_matrix reject it with ds::Error first
  if (data[0] & 1) fuzz_matrix(doc);
  else fuzz_recipes(doc);
  return 0;
}
