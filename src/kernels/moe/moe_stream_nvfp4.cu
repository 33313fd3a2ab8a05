// Streaming (decode) expert GEMMs, NVFP4 weights with bf16 activations (W4A16) or FP8 1x128 ones (W4A8).
#include "kernels/moe/moe_stream.cuh"

DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kNVFP4, ds::moe::ActFormat::kBF16)
DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kNVFP4, ds::moe::ActFormat::kFP8Block)
