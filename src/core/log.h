// Leveled logging to stderr; the level comes from DELTASERVE_LOG_LEVEL (debug|info|warn|error|off).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace ds {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view msg);
// Logs msg only the first time this key is seen in the process (fallback reasons, clamp warnings).
void log_once(LogLevel level, const std::string& key, std::string_view msg);

}  // namespace ds

#define DS_LOG(level, ...)                                                      \
  do {                                                                          \
    if (static_cast<int>(level) >= static_cast<int>(::ds::log_level()))         \
      ::ds::log_write(level, ::fmt::format(__VA_ARGS__));                       \
  } while (0)
#define LOG_DEBUG(...) DS_LOG(::ds::LogLevel::kDebug, __VA_ARGS__)
#define LOG_INFO(...) DS_LOG(::ds::LogLevel::kInfo, __VA_ARGS__)
#define LOG_WARN(...) DS_LOG(::ds::LogLevel::kWarn, __VA_ARGS__)
#define LOG_ERROR(...) DS_LOG(::ds::LogLevel::kError, __VA_ARGS__)
