// Logging implementation: one mutex so lines from worker threads never interleave.
#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace ds {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("DELTASERVE_LOG_LEVEL");
  if (!v || !*v) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "info")) return LogLevel::kInfo;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "off")) return LogLevel::kOff;
  std::fprintf(stderr, "[warn] DELTASERVE_LOG_LEVEL='%s' is not one of debug|info|warn|error|off; using info\n", v);
  return LogLevel::kInfo;
}

std::atomic<int> g_level{static_cast<int>(level_from_env())};
std::mutex g_mu;

const char* name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    default: return "log";
  }
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void log_write(LogLevel level, std::string_view msg) {
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "[%s] %.*s\n", name(level), static_cast<int>(msg.size()), msg.data());
}

void log_once(LogLevel level, const std::string& key, std::string_view msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!seen.insert(key).second) return;
  }
  if (static_cast<int>(level) >= static_cast<int>(log_level())) log_write(level, msg);
}

}  // namespace ds
