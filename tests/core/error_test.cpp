// CHECK macros carry file:line, the expression and the values.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace ds {
namespace {

TEST(Error, CheckCarriesLocationAndValues) {
  try {
    int a = 3, b = 4;
    CHECK_EQ(a, b);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("error_test.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("a == b"), std::string::npos) << m;
    EXPECT_NE(m.find("3 vs 4"), std::string::npos) << m;
  }
  try {
    CHECK(1 > 2, "value {}", 42);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("value 42"), std::string::npos);
  }
}

TEST(Tensor, ViewStridesAndSlices) {
  float buf[24];
  TensorView v(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_TRUE(v.is_contiguous());
  TensorView s = v.slice_last(1, 2);
  EXPECT_EQ(s.size(-1), 2);
  EXPECT_EQ(s.ptr<float>(), buf + 1);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_THROW(v.slice_last(3, 2), Error);
  EXPECT_EQ(v.shape_str(), "[2, 3, 4]");
}

}  // namespace
}  // namespace ds
