// Out-of-line part of the CHECK machinery (keeps the throw path out of hot inline code).
#include "core/error.h"

namespace ds::detail {

void throw_check(const char* file, int line, const char* expr, const std::string& msg) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  if (msg.empty()) throw Error(fmt::format("{}:{}: check failed: {}", base, line, expr));
  throw Error(fmt::format("{}:{}: check failed: {} ({})", base, line, expr, msg));
}

}  // namespace ds::detail
