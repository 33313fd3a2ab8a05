// The parallel spec parser and the simulated group's host side (CPU: ranks as threads): exchange with varying
// lengths, repeated; a rank that never joins fails the others with a clear error instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/parallel/group.h"
#include "runtime/parallel/simulated_group.h"

namespace ds::parallel {
namespace {

// parse_parallel_spec: tests/runtime/parallel_serve_test.cpp (ParallelSpec.*).

TEST(ParallelSimulatedGroup, ExchangeInRankOrderWithVaryingLengths) {
  for (int W : {2, 3, 4}) {
    SimulatedOptions o;
    o.world = W;
    o.device = -1;
    o.mode = Mode::kDep;
    const auto groups = create_simulated_groups(o);
    std::atomic<int> bad{0};
    std::vector<std::thread> th;
    for (int r = 0; r < W; ++r)
      th.emplace_back([&, r] {
        EXPECT_EQ(groups[r]->rank(), r);
        EXPECT_EQ(groups[r]->world(), W);
        for (int it = 0; it < 200; ++it) {
          const std::string mine(static_cast<size_t>((r * 7 + it) % 5), static_cast<char>('a' + r));
          const auto all = groups[r]->exchange(mine);
          for (int p = 0; p < W; ++p)
            if (all[p] != std::string(static_cast<size_t>((p * 7 + it) % 5), static_cast<char>('a' + p))) ++bad;
        }
      });
    for (auto& t : th) t.join();
    EXPECT_EQ(bad.load(), 0) << "W = " << W;
  }
}

TEST(ParallelSimulatedGroup, MissingRankFailsEveryWaiterWithAReason) {
  SimulatedOptions o;
  o.world = 3;
  o.device = -1;
  o.timeout_s = 0.3;
  const auto groups = create_simulated_groups(o);
  std::atomic<int> errors{0};
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)  // rank 2 never joins
    th.emplace_back([&, r] {
      try {
        groups[r]->exchange("x");
      } catch (const Error& e) {
        ++errors;
        EXPECT_NE(std::string(e.what()).find("waited"), std::string::npos) << e.what();
      }
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(errors.load(), 2);
  EXPECT_THROW(groups[2]->check(), Error);
  EXPECT_THROW(groups[0]->all_gather(nullptr, nullptr, 0, nullptr), Error);  // host-only group
}

}  // namespace
}  // namespace ds::parallel
