// Model weights: the expected tensor list of a config (names, shapes, dtypes), an owning/mmap-backed
// weight set, checkpoint load/save, random initialisation and FP8 block-scale dequantisation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace ds {

struct TensorSpec {
  std::string name;            // HF name, e.g. "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"
  std::vector<int64_t> shape;
  DType dtype;                 // dtype written by make-model / expected by default (bf16 or f32)
};

// Every tensor of spec section 2 for this config, in a stable order.
std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& c);

class SafetensorsFile;  // model/safetensors.h

// A named set of tensors. Tensors are host memory: owned buffers or views into mmap'd safetensors files.
// An FP8 block-scaled weight "X.weight" (e4m3) comes with "X.weight_scale_inv" (f32, one per 128x128 block).
// Views into files are read-only (the mapping is PROT_READ): copy a tensor before modifying it.
class WeightSet {
 public:
  WeightSet();
  ~WeightSet();
  WeightSet(WeightSet&&) noexcept;
  WeightSet& operator=(WeightSet&&) noexcept;

  bool has(const std::string& name) const;
  // Throws ds::Error naming the tensor when it is missing.
  const TensorView& get(const std::string& name) const;
  void put(const std::string& name, HostTensor t);  // takes ownership
  void put_view(const std::string& name, const TensorView& v);  // caller keeps the memory alive
  std::vector<std::string> names() const;
  // Keeps mmap'd files alive as long as the views into them are.
  void keep_alive(std::shared_ptr<SafetensorsFile> f);

  // fp32 copy of a weight: bf16/f16/f32 converted, e4m3 + weight_scale_inv dequantised per 128x128 block.
  std::vector<float> get_f32(const std::string& name) const;

 private:
  std::map<std::string, TensorView> views_;
  std::map<std::string, HostTensor> owned_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
};

// Checks every expected tensor is present with the right shape (and a supported dtype); throws naming the
// first missing or mis-shaped tensor.
void validate_weights(const ModelConfig& c, const WeightSet& w);

// Random weights for any config from a fixed seed, with an init that keeps activations finite
// (norm weights 1, A_log/dt_bias in their trained ranges, projections ~ N(0, 1/sqrt(fan_in)) scaled).
WeightSet random_weights(const ModelConfig& c, uint64_t seed);
// One tensor of random_weights(c, seed), alone (each tensor has its own random stream): lets a caller build
// a model tensor by tensor, e.g. the 48B preset (~98 GB in bf16) layer by layer.
HostTensor random_tensor(const ModelConfig& c, const TensorSpec& spec, uint64_t seed);

// Loads config.json + *.safetensors (single file or sharded through model.safetensors.index.json) from `dir`,
// validates config and tensors. Errors name the file and tensor.
struct Checkpoint {
  ModelConfig config;
  WeightSet weights;
};
Checkpoint load_checkpoint(const std::string& dir);

// Writes config.json and model.safetensors (weights) into `dir` (created if needed).
void save_checkpoint(const std::string& dir, const ModelConfig& c, const WeightSet& w);
// Writes the checkpoint of random_weights(c, seed) one tensor at a time (memory: the largest tensor), so any
// size can be produced; the files are byte-identical to save_checkpoint(dir, c, random_weights(c, seed)).
void save_random_checkpoint(const std::string& dir, const ModelConfig& c, uint64_t seed);

// Dequantises an FP8 block-scaled weight [N, K] e4m3 with scale_inv [ceil(N/128), ceil(K/128)] f32.
std::vector<float> dequant_fp8_block(const TensorView& w, const TensorView& scale_inv);
// Quantises a fp32 [N, K] weight into e4m3 + per-128x128-block scale_inv (scale = amax / 448).
void quant_fp8_block(const float* w, int64_t n, int64_t k, HostTensor* out_w, HostTensor* out_scale_inv);

}  // namespace ds
