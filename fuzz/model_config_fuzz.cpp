// libFuzzer harness: config.json bytes -> parse_config / validate_config. Only ds::Error may escape, and a
// config that validates must survive config_to_json -> (text ->) parse_config unchanged: the checkpoint writer
// (model/weights.cpp) writes config.json with config_to_json().dump(2) and every later load reads it back.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // load_config rejects non-JSON before parse_config sees it
  ds::ModelConfig c;
  try {
    c = ds::parse_config(j, "fuzz");
  } catch (const ds::Error&) {
    return 0;  // rejection is the expected outcome for most inputs
  }
  // Accepted: from here on any exception (ds::Error included) escapes and is reported.
  ds::validate_config(c, "fuzz");
  const nlohmann::json written = ds::config_to_json(c);
  const ds::ModelConfig back = ds::parse_config(written, "fuzz-roundtrip");
  if (!(back == c)) std::abort();
  ds::validate_config(back, "fuzz-roundtrip");
  if (ds::config_to_json(back) != written) std::abort();
  // The file on disk is text: the dumped document must read back the same (floats written shortest-exact).
  if (!(ds::parse_config(nlohmann::json::parse(written.dump(2)), "fuzz-text") == c)) std::abort();
  return 0;
}
