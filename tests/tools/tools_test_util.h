// Helpers shared by the tools tests: where the deltaserve binary and the source tree are, scratch files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ds::test {

// The repository root (DS_SOURCE_DIR, set by CMake for every test binary).
inline std::filesystem::path source_root() { return std::filesystem::path(DS_SOURCE_DIR); }

// build/src/deltaserve beside build/tests/tools_tests, or $DELTASERVE_BIN. The sweep tests start it as a
// child (`deltaserve fake-server`), so the full build (`ninja`) must have built it.
inline std::string deltaserve_bin() {
  if (const char* e = std::getenv("DELTASERVE_BIN")) return e;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  const auto p = std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path().parent_path() / "src" / "deltaserve";
  return p.string();
}

#define REQUIRE_DELTASERVE_BIN()                                                                        \
  do {                                                                                                  \
    ASSERT_TRUE(std::filesystem::exists(::ds::test::deltaserve_bin()))                                  \
        << "the deltaserve binary is needed (build the full tree, or set DELTASERVE_BIN): "             \
        << ::ds::test::deltaserve_bin();                                                                \
  } while (0)

// A fresh scratch directory per test.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("deltaserve-tools-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Timing checks on a shared CI machine: collect complaints instead of failing at once, so a run spoiled by
// a scheduling hiccup can be measured again. A formula error fails every attempt, so the test still fails.
struct Complaints {
  std::vector<std::string> list;
  void check(bool ok, const std::string& what) {
    if (!ok) list.push_back(what);
  }
  void near(double v, double expect, double tol, const std::string& what) {
    check(std::abs(v - expect) <= tol, what + ": " + std::to_string(v) + " not within " + std::to_string(tol) + " of " +
                                           std::to_string(expect));
  }
  void in(double v, double lo, double hi, const std::string& what) {
    check(v >= lo && v <= hi, what + ": " + std::to_string(v) + " not in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
};

inline void with_retry(int attempts, const std::function<void(Complaints&)>& attempt) {
  for (int i = 1; i <= attempts; ++i) {
    Complaints c;
    attempt(c);
    if (c.list.empty()) return;
    if (i == attempts) {
      for (const auto& m : c.list) ADD_FAILURE() << m << " (attempt " << i << " of " << attempts << ")";
    } else {
      std::fprintf(stderr, "timing check missed on attempt %d (%s); measuring again\n", i, c.list.front().c_str());
    }
  }
}

}  // namespace ds::test
