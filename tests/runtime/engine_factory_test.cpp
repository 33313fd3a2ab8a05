// make_engine: device choice, option forwarding, parse errors; the CPU engine it builds generates (no GPU needed).
#include <gtest/gtest.h>

#include "core/device.h"
#include "core/error.h"
#include "model/embedded.h"
#include "runtime/engine_factory.h"

namespace ds {
namespace {

TEST(EngineFactory, ParsesDeviceNames) {
  EXPECT_EQ(parse_engine_device("auto"), EngineDevice::kAuto);
  EXPECT_EQ(parse_engine_device("cpu"), EngineDevice::kCpu);
  EXPECT_EQ(parse_engine_device("cuda"), EngineDevice::kCuda);
  EXPECT_THROW(parse_engine_device("tpu"), Error);
}

TEST(EngineFactory, CpuEngineGenerates) {
  const EmbeddedModel m = embedded_model();
  EngineFactoryOptions o;
  o.device = EngineDevice::kCpu;
  o.max_seqs = 2;
  o.max_batch_tokens = 16;
  MadeEngine e = make_engine(m.config, m.weights, o);
  EXPECT_EQ(e.device, EngineDevice::kCpu);
  EXPECT_EQ(e.cuda, nullptr);
  Request r;
  r.prompt = {1, 2, 3, 4, 5};
  r.sampling.max_tokens = 3;
  r.sampling.ignore_eos = true;
  e.engine->add_request(r);
  int tokens = 0;
  while (e.engine->has_work())
    for (const auto& out : e.engine->step()) tokens += static_cast<int>(out.new_tokens.size());
  EXPECT_EQ(tokens, 3);
  EXPECT_EQ(e.engine->stats().max_seqs, 2);
}

TEST(EngineFactory, CudaWithoutGpuIsAClearError) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is present";
  const EmbeddedModel m = embedded_model();
  EngineFactoryOptions o;
  o.device = EngineDevice::kCuda;
  EXPECT_THROW(make_engine(m.config, m.weights, o), Error);
  o.device = EngineDevice::kAuto;  // no GPU: the CPU engine
  EXPECT_EQ(make_engine(m.config, m.weights, o).device, EngineDevice::kCpu);
}

}  // namespace
}  // namespace ds
