// bench-engine's driver on the CPU engine (tiny model): every request is timed, the steady decode phase found.
#include <gtest/gtest.h>

#include <memory>

#include "model/cpu_model.h"
#include "model/embedded.h"
#include "runtime/cpu_engine.h"
#include "runtime/engine_bench.h"

namespace ds {
namespace {

TEST(EngineBench, TimesEveryRequestOnTheCpuEngine) {
  const EmbeddedModel m = embedded_model();
  auto model = std::make_shared<const CpuModel>(m.config, m.weights);
  CpuEngineOptions eo;
  eo.max_seqs = 4;
  eo.max_prefill_tokens = 64;
  CpuEngine engine(model, eo);
  EngineBenchOptions o;
  o.concurrency = {1, 3};
  o.input_len = 12;
  o.output_len = 6;
  o.warmup_steps = 2;
  int calls = 0;
  const auto rows = run_engine_bench(engine, o, [&] {
    ++calls;
    return CategoryMs{{"other", 0.5}};
  });
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.requests, r.concurrency);
    EXPECT_GT(r.ttft_ms_median, 0.0);
    EXPECT_GE(r.ttft_ms_max, r.ttft_ms_median);
    EXPECT_GT(r.tpot_ms_median, 0.0);
    EXPECT_NEAR(r.tps_user, 1000.0 / r.tpot_ms_median, 1e-9);
    // 6 tokens: the first comes with the prefill, then 5 decode steps of which the last finishes everything.
    EXPECT_EQ(r.decode_steps, 5);
    EXPECT_GT(r.bound_ms, 0.0);
    EXPECT_DOUBLE_EQ(r.breakdown_ms.at("other"), 0.5);
  }
  EXPECT_GT(calls, 0);
  EXPECT_FALSE(engine.has_work());
  EXPECT_EQ(engine.stats().slots_in_use, 0);
  const std::string md = engine_bench_markdown(rows);
  EXPECT_NE(md.find("| 3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("other ms"), std::string::npos) << md;
  EXPECT_NE(engine_bench_json(rows, "cpu").find("\"tps_user\""), std::string::npos);
}

TEST(EngineBench, RefusesBadLengths) {
  const EmbeddedModel m = embedded_model();
  auto model = std::make_shared<const CpuModel>(m.config, m.weights);
  CpuEngine engine(model, {});
  EngineBenchOptions o;
  o.input_len = 0;
  EXPECT_THROW(run_engine_bench(engine, o), Error);
}

}  // namespace
}  // namespace ds
