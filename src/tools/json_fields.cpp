// Strict JSON field reader (see json_fields.h).
#include "tools/json_fields.h"

#include <climits>
#include <cstdint>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace ds::tools {

std::string report_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

JsonFields::JsonFields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
  CHECK(j_.is_object(), "{}: expected a JSON object, got {}", where_, j_.type_name());
}

bool JsonFields::has(const std::string& key) const { return j_.contains(key); }

const nlohmann::json* JsonFields::get(const std::string& key) {
  used_.insert(key);
  const auto it = j_.find(key);
  return it == j_.end() ? nullptr : &*it;
}

const nlohmann::json& JsonFields::raw(const std::string& key) {
  const auto* v = get(key);
  CHECK(v, "{}: missing \"{}\"", where_, key);
  return *v;
}

std::string JsonFields::str(const std::string& key) {
  const auto& v = raw(key);
  CHECK(v.is_string(), "{}: \"{}\" must be a string", where_, key);
  return v.get<std::string>();
}

std::string JsonFields::str(const std::string& key, const std::string& def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_string(), "{}: \"{}\" must be a string", where_, key);
  return v->get<std::string>();
}

double JsonFields::num(const std::string& key, double def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_number(), "{}: \"{}\" must be a number", where_, key);
  return v->get<double>();
}

int64_t JsonFields::integer(const std::string& key, int64_t def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_number_integer(), "{}: \"{}\" must be an integer", where_, key);
  CHECK(!v->is_number_unsigned() || v->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
        "{}: \"{}\" = {} is out of range", where_, key, v->get<uint64_t>());
  return v->get<int64_t>();
}

int JsonFields::int32(const std::string& key, int def) {
  const int64_t x = integer(key, def);  // def when absent, which fits
  CHECK(x >= INT_MIN && x <= INT_MAX, "{}: \"{}\" = {} is out of range", where_, key, x);
  return static_cast<int>(x);
}

bool JsonFields::boolean(const std::string& key, bool def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_boolean(), "{}: \"{}\" must be true or false", where_, key);
  return v->get<bool>();
}

std::vector<int> JsonFields::int_list(const std::string& key, std::vector<int> def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_array() && !v->empty(), "{}: \"{}\" must be a non-empty array of positive integers", where_, key);
  std::vector<int> out;
  for (const auto& x : *v) {
    CHECK(x.is_number_integer() && x.get<int64_t>() >= 1 && x.get<int64_t>() <= 1000000,
          "{}: \"{}\" must hold positive integers, got {}", where_, key, x.dump());
    out.push_back(x.get<int>());
  }
  return out;
}

std::vector<std::string> JsonFields::str_list(const std::string& key, std::vector<std::string> def) {
  const auto* v = get(key);
  if (!v) return def;
  CHECK(v->is_array(), "{}: \"{}\" must be an array of strings", where_, key);
  std::vector<std::string> out;
  for (const auto& x : *v) {
    CHECK(x.is_string(), "{}: \"{}\" must hold strings, got {}", where_, key, x.dump());
    out.push_back(x.get<std::string>());
  }
  return out;
}

std::map<std::string, std::string> JsonFields::str_map(const std::string& key) {
  const auto* v = get(key);
  std::map<std::string, std::string> out;
  if (!v) return out;
  CHECK(v->is_object(), "{}: \"{}\" must be an object of strings", where_, key);
  for (const auto& [k, x] : v->items()) {
    // Numbers are accepted for knobs ("DELTASERVE_X": 2) because people write them that way.
    CHECK(x.is_string() || x.is_number_integer(), "{}: \"{}\".\"{}\" must be a string", where_, key, k);
    out[k] = x.is_string() ? x.get<std::string>() : std::to_string(x.get<int64_t>());
  }
  return out;
}

std::optional<std::string> JsonFields::str_or_int(const std::string& key) {
  const auto* v = get(key);
  if (!v) return std::nullopt;
  CHECK(v->is_string() || v->is_number_integer(), "{}: \"{}\" must be a string or an integer", where_, key);
  return v->is_string() ? v->get<std::string>() : std::to_string(v->get<int64_t>());
}

void JsonFields::finish() const {
  std::vector<std::string> unknown;
  for (const auto& [k, v] : j_.items()) {
    if (!used_.count(k) && k.rfind("_comment", 0) != 0) unknown.push_back(k);
  }
  CHECK(unknown.empty(), "{}: unknown key(s) {} (typo?)", where_, fmt::format("\"{}\"", fmt::join(unknown, "\", \"")));
}

std::vector<JsonlLine> read_jsonl(const std::string& path) {
  std::ifstream f(path);
  CHECK(f.good(), "cannot open {}", path);
  std::vector<JsonlLine> out;
  std::string line;
  for (int lineno = 1; std::getline(f, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    CHECK(!j.is_discarded() && j.is_object(), "{}:{}: not a JSON object", path, lineno);
    out.push_back({lineno, std::move(j)});
  }
  return out;
}

}  // namespace ds::tools
