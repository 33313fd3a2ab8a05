// make_engine: the CUDA engine when a GPU is present (or asked for), the CPU reference engine otherwise, both
// behind the Engine interface, from one set of options.
#pragma once

#include <memory>
#include <string>

#include "model/config.h"
#include "model/weights.h"
#include "runtime/cpu_engine.h"
#include "runtime/cuda_engine.h"

namespace ds {

enum class EngineDevice { kAuto, kCpu, kCuda };
// "auto" | "cpu" | "cuda"; throws ds::Error naming the accepted words otherwise.
EngineDevice parse_engine_device(const std::string& s);

struct EngineFactoryOptions {
  EngineDevice device = EngineDevice::kAuto;  // auto: CUDA when cuda_device_available()
  // Shared by both engines (the CPU engine's prefill budget is max_batch_tokens).
  int max_seqs = 64;
  int max_batch_tokens = kDefaultMaxBatchTokens;
  int64_t max_model_len = 0;
  std::vector<int32_t> eos_token_ids;
  uint64_t seed = 0;
  // CUDA engine only: page size, memory fraction, graphs, profile (its shared fields are overwritten above),
  // and how the weights go to the device (--quantize fp8, DELTASERVE_FP8_KDA_PROJ).
  CudaEngineOptions cuda;
  DeviceModelOptions device_model;
};

struct MadeEngine {
  std::unique_ptr<Engine> engine;
  EngineDevice device = EngineDevice::kCpu;  // what was built
  CudaEngine* cuda = nullptr;                // the same engine when it is the CUDA one (profile, pages)
};

// Builds the engine for config + weights (uploaded to the GPU, or converted to fp32 for the CPU engine).
MadeEngine make_engine(const ModelConfig& config, const WeightSet& weights, const EngineFactoryOptions& options);
// The same with random weights of `config` (any preset's size): generated in GPU memory for the CUDA engine
// (random_device_model, no host copy), random_weights for the CPU engine.
MadeEngine make_random_engine(const ModelConfig& config, uint64_t weight_seed, const EngineFactoryOptions& options);

}  // namespace ds
