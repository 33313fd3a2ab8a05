// Streaming (decode) expert GEMMs, FP8 block-scaled weights (128x128) and activations (1x128), e4m3 mma.
#include "kernels/moe/moe_stream.cuh"

DS_MOE_STREAM_INSTANTIATE(ds::moe::WeightFormat::kFP8Block, ds::moe::ActFormat::kFP8Block)
