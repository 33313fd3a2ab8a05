// Error type and the CHECK / CUDA_CHECK macros: they throw ds::Error carrying file:line and the values.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ds {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_check(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace detail

}  // namespace ds

// CHECK(cond, "fmt {}", args...) — the message is optional.
#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::ds::detail::throw_check(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

#define DS_CHECK_OP_(a, b, op)                                                                          \
  do {                                                                                                  \
    const auto& ds_a_ = (a);                                                                            \
    const auto& ds_b_ = (b);                                                                            \
    if (!(ds_a_ op ds_b_)) [[unlikely]]                                                                 \
      ::ds::detail::throw_check(__FILE__, __LINE__, #a " " #op " " #b,                                  \
                                ::fmt::format("{} vs {}", ds_a_, ds_b_));                               \
  } while (0)
#define CHECK_EQ(a, b) DS_CHECK_OP_(a, b, ==)
#define CHECK_NE(a, b) DS_CHECK_OP_(a, b, !=)
#define CHECK_LT(a, b) DS_CHECK_OP_(a, b, <)
#define CHECK_LE(a, b) DS_CHECK_OP_(a, b, <=)
#define CHECK_GT(a, b) DS_CHECK_OP_(a, b, >)
#define CHECK_GE(a, b) DS_CHECK_OP_(a, b, >=)

// Throws ds::Error with a formatted message (for errors that are not assertion-shaped).
#define DS_THROW(...) throw ::ds::Error(::fmt::format(__VA_ARGS__))
