// libFuzzer harness: parse_safetensors_header must reject any byte string with ds::Error, never crash or read
// outside the buffer (ASan + UBSan watch for that).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const ds::SafetensorsHeader h = ds::parse_safetensors_header(data, size, "fuzz");
    // Accepted headers must describe ranges inside the input (the parser's main promise).
    for (const auto& t : h.tensors)
      if (t.begin > t.end || h.data_offset + t.end > size) __builtin_trap();
  } catch (const ds::Error&) {
    // Rejection is the expected outcome for most inputs; any other exception type escapes and is reported.
  }
  return 0;
}
