// The tensor-parallel layer boundary's choice between the fused kernel and the unfused path, on the CPU: the
// pure gate, the knob read at construction (a non-integer stops start-up, out-of-range values clamp).
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "runtime/parallel/tp_finalize.h"

namespace ds::parallel {
namespace {

class NullAllReduce : public AllReduce {
 public:
  void sum(void*, size_t, DType, cudaStream_t) override {}
  std::string name() const override { return "null"; }
};

struct Fixture {
  allreduce::RankView view;
  NullAllReduce ar;
  TpFinalizeNormSetup setup;
  Fixture() {
    view.world = 8;
    view.slot_elems = 16 * 2304;
    view.co_resident_ranks = 1;
    view.resident_blocks = 1056;
    setup.rank = 3;
    setup.world = 8;
    setup.D = 2304;
    setup.TOPK = 8;
    setup.peer = &view;
    setup.peer_access = true;
    setup.fallback = &ar;
  }
};

TEST(ParallelTpGate, FusedUpToTheKnobThenUnfused) {
  Fixture f;
  for (int T : {0, 1, 2}) EXPECT_FALSE(tp_fused_unsupported(f.setup, 2, T, true)) << T;
  const auto why = tp_fused_unsupported(f.setup, 2, 3, true);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("T = 3"), std::string::npos) << *why;
  EXPECT_FALSE(tp_fused_unsupported(f.setup, 16, 16, true));
}

TEST(ParallelTpGate, EveryStaticReasonFallsBack) {
  {
    Fixture f;
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 0, 1, true));  // knob 0 disables
  }
  {
    Fixture f;
    f.setup.peer = nullptr;
    const auto why = tp_fused_unsupported(f.setup, 2, 1, true);
    ASSERT_TRUE(why);
    EXPECT_NE(why->find("no peer buffers"), std::string::npos) << *why;
  }
  {
    Fixture f;
    f.setup.peer_access = false;
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 2, 1, true));
  }
  {
    Fixture f;
    f.setup.world = 6;
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 2, 1, true));
  }
  {
    Fixture f;
    f.setup.dtype = DType::kF32;
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 2, 1, true));
  }
  {
    Fixture f;
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 2, 1, false));  // misaligned operands
  }
  {
    Fixture f;
    f.view.slot_elems = 2304;  // room for one token, the knob allows two
    EXPECT_TRUE(tp_fused_unsupported(f.setup, 2, 1, true));
  }
}

TEST(ParallelTpGate, KnobReadAtConstruction) {
  Fixture f;
  const char* name = "DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS";
  ::unsetenv(name);
  EXPECT_EQ(TpFinalizeNorm(f.setup).fused_max_tokens(), 2);
  ::setenv(name, "40", 1);
  EXPECT_EQ(TpFinalizeNorm(f.setup).fused_max_tokens(), 16);
  ::setenv(name, "0", 1);
  {
    TpFinalizeNorm t(f.setup);
    EXPECT_EQ(t.fused_max_tokens(), 0);
    EXPECT_TRUE(t.fused_unsupported(1));
  }
  ::setenv(name, "two", 1);
  try {
    TpFinalizeNorm t(f.setup);
    ADD_FAILURE() << "a non-integer knob was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
  ::unsetenv(name);
  f.setup.fused_max_tokens = 5;  // explicit value (tests, benchmarks): the environment is not read
  ::setenv(name, "two", 1);
  EXPECT_EQ(TpFinalizeNorm(f.setup).fused_max_tokens(), 5);
  ::unsetenv(name);
}

TEST(ParallelTpGate, BadCallsAreRefusedAtTheBoundary) {
  Fixture f;
  f.setup.fused_max_tokens = 2;
  TpFinalizeNorm t(f.setup);
  TpFinalizeNormCall c;
  c.T = 1;
  alignas(16) static char mem[1 << 16];
  c.expert_out = moe::MoeTensor(mem, DType::kF32, 1, 8, 2304);  // fp32 where bf16 belongs
  c.expanded_to_permuted = moe::MoeTensor(mem, DType::kI32, 8);
  c.topk_weights = moe::MoeTensor(mem, DType::kF32, 1, 8);
  c.residual = mem;
  c.norm_w = mem;
  c.y = mem + 4096;
  EXPECT_THROW(t.run(c), Error);
  c.expert_out = moe::MoeTensor(mem, DType::kBF16, 1, 8, 2304);
  c.topk_weights = moe::MoeTensor(mem, DType::kBF16, 1, 8);  // bf16 weights where fp32 belongs
  EXPECT_THROW(t.run(c), Error);
  c.topk_weights = moe::MoeTensor(mem, DType::kF32, 8);  // flat where [T, TOPK] belongs
  EXPECT_THROW(t.run(c), Error);
}

}  // namespace
}  // namespace ds::parallel
