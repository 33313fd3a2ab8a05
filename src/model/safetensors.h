// Safetensors reader (mmap, fully validated header), sharded-index loader and streaming writer.
//
// File layout: u64 little-endian N | N bytes of JSON header | data. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to the start of the data, plus an
// optional "__metadata__" string->string map. Every malformed or truncated file is a ds::Error that names the
// file (and the tensor, where there is one); nothing here reads outside the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ds {

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range [begin, end) relative to the start of the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<SafetensorsTensorInfo> tensors;   // sorted by begin offset (file order)
  uint64_t data_offset = 0;                     // 8 + header length: where the data section starts
};

// Limits a header must respect (the reference implementation uses the same 100 MB cap).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Parses and validates the header of a complete file held in [data, data + size). Pure (no I/O); `source`
// names the file in errors. Checks: header length in [2, 100 MB] and within the file; a JSON object without
// duplicate keys; optional "__metadata__" string map; per tensor a known dtype, non-negative integer shape,
// data_offsets [begin, end] with begin <= end <= data size and end - begin == bytes of the shape; no overlaps.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& source);

// A read-only memory-mapped safetensors file. Views point into the mapping and stay valid while the object
// lives (WeightSet::keep_alive holds it); the memory is mapped PROT_READ, so writing through a view faults.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted by name
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws ds::Error naming the file and the tensor when it is absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  TensorView view(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// A sharded checkpoint: model.safetensors.index.json's "weight_map" (tensor name -> shard file name, relative
// to the index's folder). Each shard is opened once; a missing shard, or a tensor listed in the index but
// absent from its shard, is an error naming the index, the shard and the tensor. Tensors present in a shard
// but not listed are ignored (the index is authoritative, as in transformers).
struct SafetensorsShards {
  std::vector<std::shared_ptr<SafetensorsFile>> files;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> tensor_file;  // name -> the shard holding it
};
SafetensorsShards open_safetensors_index(const std::string& index_path);

// Writing. Tensors are laid out the way the reference writer (huggingface/safetensors `serialize`) lays them
// out: sorted by element size, largest first (fp4 last), then by name, so every tensor starts at an offset
// aligned to its element size; the header is padded with spaces to a multiple of 8 bytes so the data section
// is 8-aligned too. The file is written to "<path>.tmp.<pid>" and renamed into place, so a crash never leaves
// a half-written file under the final name.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Streaming form (for checkpoints larger than memory): `produce(i)` is called once per entry, in file order,
// and returns a host view of entries[i]'s dtype and shape that must stay valid until the next call.
void write_safetensors_streaming(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                 const std::function<TensorView(size_t)>& produce,
                                 const std::map<std::string, std::string>& metadata = {});

// All tensors already in memory (views may be strided, except fp4 which must be contiguous).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ds
