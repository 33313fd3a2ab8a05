// Streaming (decode) expert GEMMs, bf16 weights and activations.
#include "kernels/moe/moe_stream.cuh"

DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kBF16, ds::moe::ActFormat::kBF16)
