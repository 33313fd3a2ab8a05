// PerDeviceOnce and PerDeviceValue (kernels/common/per_device.h), behind the once-per-device shared-memory opt-in
// of the kernels that take more than 48 KB and the per-device SM counts and occupancies: with ranks as threads on
// several devices, each device's set-up runs exactly once, every caller returns only after it, a failure is
// retried, and a device out of range is refused.
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

// A per-device cache (SM counts, occupancies) gives each device its own value, computed once, even with ranks
// asking concurrently; a failed computation leaves the caller's value alone and is tried again.
TEST(PerDeviceValue, EachDeviceGetsItsOwnValueOnce) {
  ds::PerDeviceValue<int> cache;
  constexpr int kDevices = 4, kThreadsPerDevice = 8, kCalls = 50;
  std::array<std::atomic<int>, kDevices> computes{};
  std::atomic<int> wrong{0};
  std::vector<std::thread> ranks;
  for (int d = 0; d < kDevices; ++d)
    for (int t = 0; t < kThreadsPerDevice; ++t)
      ranks.emplace_back([&, d] {
        for (int i = 0; i < kCalls; ++i) {
          int v = -1;
          const cudaError_t e = cache.get(d, v, [&](int dev, int& out) {
            std::this_thread::yield();
            computes[d].fetch_add(1);
            if (dev != d) wrong.fetch_add(1);
            out = 100 + 2 * d;  // a mixed host: each device its own SM count
            return cudaSuccess;
          });
          if (e != cudaSuccess || v != 100 + 2 * d) wrong.fetch_add(1);
        }
      });
  for (auto& r : ranks) r.join();
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(computes[d].load(), 1) << "device " << d;
  EXPECT_EQ(wrong.load(), 0);

  int v = 7;
  EXPECT_EQ(cache.get(kDevices, v, [](int, int& out) { out = 1; return cudaErrorInvalidValue; }),
            cudaErrorInvalidValue);
  EXPECT_EQ(v, 7);
  EXPECT_EQ(cache.get(kDevices, v, [](int, int& out) { out = 132; return cudaSuccess; }), cudaSuccess);
  EXPECT_EQ(v, 132);
  EXPECT_EQ(cache.get(ds::PerDeviceOnce::kMaxDevices, v, [](int, int& out) { out = 1; return cudaSuccess; }),
            cudaErrorInvalidDevice);
  EXPECT_EQ(v, 132);
}

}  // namespace
