// Streaming (decode) expert GEMMs, MX formats: MXFP8 (weights and activations) and MXFP4 (weight-only).
#include "kernels/moe/moe_stream.cuh"

DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kMXFP8, ds::moe::ActFormat::kMXFP8)
DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kMXFP4, ds::moe::ActFormat::kBF16)
