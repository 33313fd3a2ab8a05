// Strict reading of JSON config objects (recipes, matrices): typed getters, and unknown keys are errors, so a
// typo ("concurency") stops the run instead of silently using a default. Every error names the path. Also the
// one way reports are serialised (report_json).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ds::tools {

// JSON text of a report (bench, eval, validate). Reports hold what servers sent: error bodies, model output (a
// byte-level model emits any bytes), snippets cut mid-character; json::dump throws on invalid UTF-8, which lost
// whole runs' results (fuzz finding), so bad bytes are written as U+FFFD instead.
std::string report_json(const nlohmann::json& j, int indent = -1);

class JsonFields {
 public:
  // Throws unless j is an object. `where` prefixes every error ("recipes.json: recipe 'tep8'").
  JsonFields(const nlohmann::json& j, std::string where);

  bool has(const std::string& key) const;
  const nlohmann::json& raw(const std::string& key);  // marks it used; throws if absent
  std::string str(const std::string& key);             // required
  std::string str(const std::string& key, const std::string& def);
  double num(const std::string& key, double def);
  int64_t integer(const std::string& key, int64_t def);
  // An integer that must fit an int: a larger one is an error, never silently narrowed (a port of 4294967376
  // read as 80 was a fuzz finding). Range rules beyond that stay with the caller.
  int int32(const std::string& key, int def);
  bool boolean(const std::string& key, bool def);
  std::vector<int> int_list(const std::string& key, std::vector<int> def);
  std::vector<std::string> str_list(const std::string& key, std::vector<std::string> def);
  std::map<std::string, std::string> str_map(const std::string& key);  // absent -> empty
  // A string or an integer, as text ("input_len": 128 or "64:256").
  std::optional<std::string> str_or_int(const std::string& key);
  // Throws naming every key that no getter asked for.
  void finish() const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json* get(const std::string& key);
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> used_;
};

// One JSON object per non-blank line of a JSONL file, with its 1-based line number (for error messages).
struct JsonlLine {
  int lineno = 0;
  nlohmann::json value;
};
// Throws ds::Error naming the file (cannot open) or the file and line (not a JSON object).
std::vector<JsonlLine> read_jsonl(const std::string& path);

}  // namespace ds::tools
