// Device discovery and the measured copy bandwidth (the ceiling bench-engine's bound divides by).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/test_util.h"
#include "core/device.h"

namespace ds {
namespace {

TEST(Device, CopyBandwidthIsZeroWithoutAGpu) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is present: CopyBandwidthOfTheCardAtHand covers it";
  EXPECT_EQ(cuda_copy_bandwidth(), 0.0);
  EXPECT_EQ(cuda_device_arch(), 0);
}

TEST(Device, CopyBandwidthOfTheCardAtHand) {
  SKIP_WITHOUT_GPU();
  const double bw = cuda_copy_bandwidth(size_t{256} << 20);
  std::printf("%s: device-to-device copy %.0f GB/s (256 MiB, read + write)\n", cuda_device_name().c_str(), bw / 1e9);
  // Every card this engine targets copies at hundreds of GB/s at least and none at 50 TB/s: a zero, a unit slip
  // (bytes vs bits, ms vs s) or an untimed copy lands outside.
  EXPECT_GT(bw, 100e9);
  EXPECT_LT(bw, 50e12);
  EXPECT_EQ(cuda_copy_bandwidth(0), 0.0);
  // Buffers that cannot exist give 0 and leave no error behind for the next CUDA call.
  EXPECT_EQ(cuda_copy_bandwidth(size_t{1} << 52), 0.0);
  EXPECT_GT(cuda_copy_bandwidth(size_t{64} << 20), 0.0);
}

}  // namespace
}  // namespace ds
