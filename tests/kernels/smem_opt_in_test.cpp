// PerDeviceOnce (kernels/common/smem_opt_in.h), the once-per-device shared-memory opt-in of the kernels that take
// more than 48 KB: with ranks as threads on several devices, each device's set-up runs exactly once, every caller
// returns only after it, a failure is retried, and a device out of range is refused.
#include "kernels/common/smem_opt_in.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

namespace {

TEST(SmemOptIn, OncePerDeviceUnderConcurrentRanks) {
  ds::PerDeviceOnce once;
  constexpr int kDevices = 4, kThreadsPerDevice = 8, kCalls = 50;
  std::array<std::atomic<int>, kDevices> sets{};
  std::atomic<int> early{0};  // callers that returned before their device's set-up finished
  std::vector<std::thread> ranks;
  for (int d = 0; d < kDevices; ++d)
    for (int t = 0; t < kThreadsPerDevice; ++t)
      ranks.emplace_back([&, d] {
        for (int i = 0; i < kCalls; ++i) {
          const cudaError_t e = once.run(d, [&] {
            std::this_thread::yield();
            sets[d].fetch_add(1);
            return cudaSuccess;
          });
          EXPECT_EQ(e, cudaSuccess);
          if (sets[d].load() == 0) early.fetch_add(1);
        }
      });
  for (auto& r : ranks) r.join();
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(sets[d].load(), 1) << "device " << d;
  EXPECT_EQ(early.load(), 0);
}

TEST(SmemOptIn, FailureIsReturnedAndRetriedAndOtherDevicesStayIndependent) {
  ds::PerDeviceOnce once;
  int calls = 0;
  EXPECT_EQ(once.run(1, [&] { ++calls; return cudaErrorInvalidValue; }), cudaErrorInvalidValue);
  EXPECT_EQ(once.run(1, [&] { ++calls; return cudaSuccess; }), cudaSuccess);
  EXPECT_EQ(once.run(1, [&] { ++calls; return cudaSuccess; }), cudaSuccess);
  EXPECT_EQ(calls, 2);
  // Device 0 never ran its set-up: device 1's success is not device 0's.
  EXPECT_EQ(once.run(0, [&] { ++calls; return cudaSuccess; }), cudaSuccess);
  EXPECT_EQ(calls, 3);
  for (int bad : {-1, ds::PerDeviceOnce::kMaxDevices})
    EXPECT_EQ(once.run(bad, [&] { ++calls; return cudaSuccess; }), cudaErrorInvalidDevice) << bad;
  EXPECT_EQ(calls, 3);
}

}  // namespace
