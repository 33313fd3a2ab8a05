// The device model's memory plan: every device tensor (dtype, [rows, cols], byte offset in one arena), the
// checkpoint tensors packed into it at which rows, and where its pointers go in DeviceModel. One plan serves
// device_model_bytes (its size), upload_model and random_device_model (what to copy or generate where), so the
// three cannot disagree. Internal to runtime/cuda_model*.cpp and its tests; no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/weights.h"
#include "runtime/cuda_model.h"

namespace ds::devmodel {

inline constexpr int64_t kBlock = 128;       // FP8 scale block edge (gemm::kFp8Block)
inline constexpr size_t kAlign = 256;        // every device tensor starts 256-byte aligned
inline constexpr int64_t kProjRowPad = 16;   // packed KDA projection rows: a multiple of 16 (16-byte output rows)

enum class Kind : uint8_t {
  kBF16,  // bf16 [rows, cols]
  kF32,   // f32  [rows, cols]
  kFP8,   // e4m3 [rows, cols] + f32 scales [ceil(rows/128), scale_pitch] (128x128 blocks, K-blocks contiguous)
};

// One checkpoint tensor (or a block of it: a rank's slice) placed into a device tensor, filling rows
// [row0, row0 + rows). The source block is rows [src_row0, src_row0 + rows) and columns
// [src_col0, src_col0 + dest cols) of the checkpoint tensor seen as [numel / src_cols, src_cols]; the whole
// tensor is src_row0 = src_col0 = 0, src_cols = dest cols, rows = numel / dest cols.
struct Piece {
  TensorSpec spec;
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t src_row0 = 0, src_col0 = 0;
  int64_t src_cols = 0;  // 0: the dest cols (whole rows)
  int64_t numel() const;
  // True when the piece is a strict block of its tensor (generated / read whole, then the block copied).
  bool sliced(int64_t dest_cols) const;
};

struct Dest {
  std::string what;  // "layer 3 KDA proj": for error messages
  Kind kind = Kind::kBF16;
  int64_t rows = 0, cols = 0;
  size_t offset = 0;        // data, bytes from the arena base
  size_t scale_offset = 0;  // FP8 scales, bytes from the arena base
  int64_t scale_pitch = 0;  // FP8: floats per scale row — gemm::w_scale_cols(cols) for cuBLASLt weights (rows padded
                            // to 16 bytes), cols/128 for the MoE kernels' experts
  std::vector<Piece> pieces;
  // Writes the DeviceModel fields of this tensor (data, scale: device pointers; scale null unless kFP8).
  std::function<void(void* data, void* scale, int device)> bind;

  size_t data_bytes() const;
  size_t scale_bytes() const;  // 0 unless kFP8
  int64_t covered_rows() const;  // rows written by pieces; the rest (pad rows) must be zero
};

struct Plan {
  std::vector<Dest> dests;
  size_t bytes = 0;               // arena size (what device_model_bytes reports)
  size_t quant_scratch_bytes = 0; // bf16 bytes of the largest piece of an FP8 tensor (quantised through scratch)
  size_t slice_scratch_bytes = 0; // bytes of the largest whole tensor a sliced piece comes from (random weights)
};

// Which checkpoint tensors are e4m3 (FP8 checkpoint). Empty: a bf16 checkpoint, or random weights.
using IsFp8 = std::function<bool(const std::string& name)>;

// Builds the plan for a validated, supported config and points `m`'s fields into it once bind() runs (m->layers
// is sized here). Format rules (cuda_model.h): a GEMM weight is FP8 when the options ask for it or any of its
// checkpoint pieces is e4m3, and every piece starts on a 128-row block edge with cols % 128 == 0 (else bf16;
// e4m3 pieces are then dequantised). f_b, g_b, kv_b, router, embedding and lm_head are always bf16.
Plan plan_device_model(const ModelConfig& c, const DeviceModelOptions& o, const IsFp8& is_fp8, DeviceModel* m);

// Points every DeviceModel field at `base` + offsets (device `device`).
void bind_plan(const Plan& p, char* base, int device);

}  // namespace ds::devmodel
