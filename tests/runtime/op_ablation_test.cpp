// bench-engine --ablate: the names it accepts and how names and categories match CudaForward's ops.
#include <gtest/gtest.h>

#include "runtime/op_ablation.h"

namespace ds {
namespace {

TEST(OpAblation, UnknownAndUnsafeNamesAreRefusedWithTheList) {
  EXPECT_EQ(ablation_problem({}), std::nullopt);
  EXPECT_EQ(ablation_problem({"moe", "input_norm", "kda"}), std::nullopt);
  for (const char* bad : {"sample", "embed", "h2d_metadata", "other", "mo", ""}) {
    const auto why = ablation_problem({"moe", bad});
    ASSERT_TRUE(why.has_value()) << bad;
    EXPECT_NE(why->find(std::string("'") + bad + "'"), std::string::npos) << *why;
    EXPECT_NE(why->find("known: "), std::string::npos) << *why;
  }
}

TEST(OpAblation, NamesMatchOpsAndCategoriesMatchTheirOps) {
  const std::vector<std::string> a = {"input_norm", "mla"};
  EXPECT_TRUE(is_ablated(a, "other", "input_norm"));
  EXPECT_FALSE(is_ablated(a, "other", "post_attention_norm"));
  EXPECT_TRUE(is_ablated(a, "mla", "mla.decode"));
  EXPECT_TRUE(is_ablated(a, "mla", "mla.cache_write"));
  EXPECT_FALSE(is_ablated(a, "gemm", "mla.fused_a"));  // a GEMM, not in the mla category
  EXPECT_FALSE(is_ablated({}, "moe", "moe"));
  EXPECT_TRUE(is_ablated({"gemm"}, "gemm", "kda.proj"));
  EXPECT_FALSE(is_ablated({"other"}, "other", "sample"));  // "other" never matches as a category
}

}  // namespace
}  // namespace ds
