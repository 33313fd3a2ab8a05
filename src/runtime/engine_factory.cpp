// make_engine: CUDA or CPU engine behind Engine.
#include "runtime/engine_factory.h"

#include "core/device.h"
#include "core/env.h"
#include "core/error.h"

namespace ds {

EngineDevice parse_engine_device(const std::string& s) {
  if (s == "auto") return EngineDevice::kAuto;
  if (s == "cpu") return EngineDevice::kCpu;
  if (s == "cuda" || s == "gpu") return EngineDevice::kCuda;
  DS_THROW("unknown engine device '{}' (expected auto, cpu or cuda)", s);
}

namespace {
bool want_gpu(const EngineFactoryOptions& o) {
  const bool gpu = o.device == EngineDevice::kCuda || (o.device == EngineDevice::kAuto && cuda_device_available());
  if (gpu && !cuda_device_available()) DS_THROW("the CUDA engine was asked for, but no CUDA GPU is available");
  return gpu;
}
MadeEngine cuda_engine(std::shared_ptr<const DeviceModel> dev, const EngineFactoryOptions& o) {
  CudaEngineOptions co = o.cuda;
  co.max_seqs = o.max_seqs;
  co.max_batch_tokens = o.max_batch_tokens;
  co.max_model_len = o.max_model_len;
  co.eos_token_ids = o.eos_token_ids;
  co.seed = o.seed;
  MadeEngine m;
  auto e = std::make_unique<CudaEngine>(std::move(dev), co);
  m.cuda = e.get();
  m.engine = std::move(e);
  m.device = EngineDevice::kCuda;
  return m;
}
MadeEngine cpu_engine(const ModelConfig& config, const WeightSet& weights, const EngineFactoryOptions& o) {
  CpuEngineOptions co;
  co.max_seqs = o.max_seqs;
  co.max_prefill_tokens = o.max_batch_tokens;
  co.max_model_len = o.max_model_len;
  co.eos_token_ids = o.eos_token_ids;
  co.seed = o.seed;
  MadeEngine m;
  auto model = std::make_shared<const CpuModel>(config, weights, CpuModelOptions::from_env());
  m.engine = std::make_unique<CpuEngine>(std::move(model), co);
  m.device = EngineDevice::kCpu;
  return m;
}
}  // namespace

MadeEngine make_engine(const ModelConfig& config, const WeightSet& weights, const EngineFactoryOptions& o) {
  if (want_gpu(o)) return cuda_engine(upload_model(config, weights, o.device_model), o);
  return cpu_engine(config, weights, o);
}

MadeEngine make_random_engine(const ModelConfig& config, uint64_t weight_seed, const EngineFactoryOptions& o) {
  if (want_gpu(o)) return cuda_engine(random_device_model(config, weight_seed, o.device_model), o);
  return cpu_engine(config, random_weights(config, weight_seed), o);
}

}  // namespace ds
