// Safetensors: header validation, mmap'd reading, sharded index, streaming writer.
// Depends only on core (dtype, error, tensor) and nlohmann_json, so the fuzzer compiles it standalone.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is every target");

namespace ds {

using nlohmann::json;

namespace {

// Product of the shape and its byte count with overflow checks (a hostile header may claim 2^62 x 2^62).
bool checked_bytes(DType t, const std::vector<int64_t>& shape, uint64_t* numel_out, uint64_t* bytes_out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  if (n > static_cast<uint64_t>(INT64_MAX)) return false;
  uint64_t bytes;
  if (t == DType::kF4E2M1) bytes = n / 2 + (n & 1);  // two values per byte
  else if (__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(t)), &bytes)) return false;
  *numel_out = n;
  *bytes_out = bytes;
  return true;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Non-negative JSON integer (rejects floats such as 3.0 and negatives).
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) { *out = v.get<uint64_t>(); return true; }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) { *out = static_cast<uint64_t>(v.get<int64_t>()); return true; }
  return false;
}

[[noreturn]] void entry_error(const std::string& src, const std::string& name, const std::string& what) {
  DS_THROW("{}: tensor '{}': {}", src, name, what);
}

SafetensorsTensorInfo parse_entry(const std::string& src, const std::string& name, const json& e,
                                  uint64_t data_size) {
  auto fail = [&](const std::string& what) { entry_error(src, name, what); };
  SafetensorsTensorInfo ti;
  ti.name = name;
  if (!e.is_object()) fail(fmt::format("entry must be an object, got {}", e.type_name()));

  if (!e.contains("dtype") || !e["dtype"].is_string()) fail("missing or non-string \"dtype\"");
  const auto dt = dtype_from_safetensors(e["dtype"].get_ref<const std::string&>());
  if (!dt) fail(fmt::format("unknown dtype {}", e["dtype"].dump()));
  ti.dtype = *dt;

  if (!e.contains("shape") || !e["shape"].is_array()) fail("missing or non-array \"shape\"");
  for (const json& d : e["shape"]) {
    uint64_t v;
    if (!as_u64(d, &v) || v > static_cast<uint64_t>(INT64_MAX))
      fail(fmt::format("shape element {} is not a non-negative integer", d.dump()));
    ti.shape.push_back(static_cast<int64_t>(v));
  }

  if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
    fail("\"data_offsets\" must be an array [begin, end]");
  if (!as_u64(e["data_offsets"][0], &ti.begin) || !as_u64(e["data_offsets"][1], &ti.end))
    fail(fmt::format("data_offsets {} must be non-negative integers", e["data_offsets"].dump()));
  if (ti.begin > ti.end) fail(fmt::format("data_offsets [{}, {}]: begin > end", ti.begin, ti.end));
  if (ti.end > data_size)
    fail(fmt::format("data_offsets [{}, {}] run past the end of the data section ({} bytes; file truncated?)",
                     ti.begin, ti.end, data_size));

  uint64_t numel, bytes;
  if (!checked_bytes(ti.dtype, ti.shape, &numel, &bytes))
    fail(fmt::format("shape {} overflows", shape_string(ti.shape)));
  if (ti.end - ti.begin != bytes)
    fail(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", shape_string(ti.shape),
                     dtype_safetensors_name(ti.dtype), bytes, ti.begin, ti.end, ti.end - ti.begin));
  return ti;
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& src) {
  if (size < 8) DS_THROW("{}: file is {} bytes, shorter than the 8-byte header length (truncated?)", src, size);
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n < 2) DS_THROW("{}: header length {} is too small (a JSON object needs at least 2 bytes)", src, n);
  if (n > kSafetensorsMaxHeaderBytes)
    DS_THROW("{}: header length {} exceeds the {}-byte limit (corrupt file?)", src, n, kSafetensorsMaxHeaderBytes);
  if (n > size - 8)
    DS_THROW("{}: header length {} runs past the end of the {}-byte file (truncated?)", src, n, size);

  // Valid headers nest at most root object > tensor entry > shape array. The callback rejects deeper nesting
  // (so a hostile header cannot build a deep tree) and duplicate keys (nlohmann would silently keep one).
  std::set<std::string> top_keys, entry_keys;
  auto cb = [&](int depth, json::parse_event_t ev, json& v) {
    using E = json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= 3)
      DS_THROW("{}: header nests deeper than a safetensors header can", src);
    if (ev == E::object_start && depth == 1) entry_keys.clear();
    if (ev == E::key) {
      const std::string& k = v.get_ref<const std::string&>();
      if (depth == 1 && !top_keys.insert(k).second) DS_THROW("{}: tensor '{}': duplicate name in header", src, k);
      if (depth == 2 && !entry_keys.insert(k).second) DS_THROW("{}: duplicate key '{}' in a header entry", src, k);
    }
    return true;
  };
  json j;
  try {
    j = json::parse(data + 8, data + 8 + n, cb);
  } catch (const json::exception& e) {
    DS_THROW("{}: header is not valid JSON: {}", src, e.what());
  }
  if (!j.is_object()) DS_THROW("{}: header must be a JSON object, got {}", src, j.type_name());

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;
  for (const auto& [key, val] : j.items()) {
    if (key == "__metadata__") {
      if (val.is_null()) continue;
      if (!val.is_object()) DS_THROW("{}: __metadata__ must be an object of strings, got {}", src, val.type_name());
      for (const auto& [mk, mv] : val.items()) {
        if (!mv.is_string()) DS_THROW("{}: __metadata__ entry '{}' must be a string, got {}", src, mk, mv.dump());
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(src, key, val, data_size));
  }

  // File order; empty tensors occupy no bytes, so only non-empty ranges can overlap.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin == t.end) continue;
    if (prev && t.begin < prev->end)
      DS_THROW("{}: tensor '{}' bytes [{}, {}) overlap tensor '{}' bytes [{}, {})", src, t.name, t.begin, t.end,
               prev->name, prev->begin, prev->end);
    prev = &t;
  }
  return h;
}

// ------------------------------------------------------------------------------------------ SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DS_THROW("{}: cannot open: {}", path, errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_THROW("{}: not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    DS_THROW("{}: file is {} bytes, shorter than the 8-byte header length (truncated?)", path, size);
  }
  // MAP_PRIVATE + PROT_READ: pages come from the page cache on demand, so opening a 20 GB shard is instant
  // and costs no memory until tensors are touched.
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) DS_THROW("{}: mmap of {} bytes failed: {}", path, size, errno_str());
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->header_ = parse_safetensors_header(f->base_, f->size_, path);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> r;
  r.reserve(index_.size());
  for (const auto& kv : index_) r.push_back(kv.first);
  return r;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) DS_THROW("{}: tensor '{}' not found", path_, name);
  return header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const SafetensorsTensorInfo& ti = info(name);
  if (ti.shape.size() > static_cast<size_t>(kMaxDims))
    DS_THROW("{}: tensor '{}': rank {} exceeds the supported {}", path_, name, ti.shape.size(), kMaxDims);
  // The mapping is read-only; TensorView has no const flavour, so constness is by contract (see header).
  void* p = const_cast<uint8_t*>(base_ + header_.data_offset + ti.begin);
  return TensorView(p, ti.dtype, ti.shape);
}

// ------------------------------------------------------------------------------------------ sharded index

SafetensorsShards open_safetensors_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) DS_THROW("{}: cannot open index", index_path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    DS_THROW("{}: not valid JSON: {}", index_path, e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    DS_THROW("{}: missing \"weight_map\" object", index_path);

  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  SafetensorsShards out;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_shard;
  for (const auto& [name, shard_v] : j["weight_map"].items()) {
    if (!shard_v.is_string()) DS_THROW("{}: tensor '{}': shard name must be a string", index_path, name);
    const std::string shard = shard_v.get<std::string>();
    const std::filesystem::path rel(shard);
    // Shards live beside the index; refuse paths that would read elsewhere.
    if (shard.empty() || rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const auto& part) { return part == ".."; }))
      DS_THROW("{}: tensor '{}': shard '{}' must be a file name inside the checkpoint folder", index_path, name, shard);
    auto it = by_shard.find(shard);
    if (it == by_shard.end()) {
      std::shared_ptr<SafetensorsFile> f;
      try {
        f = SafetensorsFile::open((dir / rel).string());
      } catch (const Error& e) {
        DS_THROW("{}: shard '{}' (listed for tensor '{}'): {}", index_path, shard, name, e.what());
      }
      it = by_shard.emplace(shard, f).first;
      out.files.push_back(f);
    }
    if (!it->second->has(name))
      DS_THROW("{}: tensor '{}' is listed in the index but missing from shard {}", index_path, name,
               it->second->path());
    out.tensor_file[name] = it->second;
  }
  return out;
}

// ------------------------------------------------------------------------------------------ writer

namespace {

// Rank of a dtype in the reference writer's Dtype enum, which is declared in increasing alignment order
// (BOOL, F4, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64).
int reference_dtype_rank(DType t) {
  switch (t) {
    case DType::kBool: return 0;
    case DType::kF4E2M1: return 1;
    case DType::kU8: return 2;
    case DType::kI8: return 3;
    case DType::kF8E5M2: return 4;
    case DType::kF8E4M3: return 5;
    case DType::kE8M0: return 6;
    case DType::kI16: return 7;
    case DType::kF16: return 8;
    case DType::kBF16: return 9;
    case DType::kI32: return 10;
    case DType::kF32: return 11;
    case DType::kF64: return 12;
    case DType::kI64: return 13;
  }
  return 0;
}

class TempFile {
 public:
  explicit TempFile(const std::string& final_path)
      : final_(final_path), tmp_(fmt::format("{}.tmp.{}", final_path, ::getpid())) {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) DS_THROW("{}: cannot create: {}", tmp_, errno_str());
  }
  ~TempFile() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) DS_THROW("{}: write failed: {}", tmp_, errno_str());
  }
  void commit() {
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) DS_THROW("{}: flush failed: {}", tmp_, errno_str());
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) DS_THROW("{}: close failed: {}", tmp_, errno_str());
    if (std::rename(tmp_.c_str(), final_.c_str()) != 0)
      DS_THROW("{}: cannot rename {} into place: {}", final_, tmp_, errno_str());
    committed_ = true;
  }

 private:
  std::string final_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// Writes a (possibly strided) host view in row-major order, gathering through a bounded buffer.
void write_view(TempFile& out, const TensorView& v, const std::string& name) {
  if (v.device != Device::kCPU) DS_THROW("write_safetensors: tensor '{}' is not in host memory", name);
  const size_t bytes = v.nbytes();
  if (bytes == 0) return;
  if (v.is_contiguous()) return out.write(v.data, bytes);
  if (v.dtype == DType::kF4E2M1) DS_THROW("write_safetensors: tensor '{}': strided fp4 cannot be written", name);
  const size_t es = dtype_size(v.dtype);
  const int64_t cols = v.size(-1);
  std::vector<uint8_t> row(static_cast<size_t>(cols) * es);
  std::array<int64_t, kMaxDims> idx{};
  const int64_t rows = v.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < v.ndim - 1; ++d) off += idx[d] * v.strides[d];
    const auto* src = static_cast<const uint8_t*>(v.data) + off * static_cast<int64_t>(es);
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(row.data() + c * es, src + c * v.strides[v.ndim - 1] * static_cast<int64_t>(es), es);
    out.write(row.data(), row.size());
    for (int d = v.ndim - 2; d >= 0 && ++idx[d] == v.shape[d]; --d) idx[d] = 0;
  }
}

}  // namespace

void write_safetensors_streaming(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                 const std::function<TensorView(size_t)>& produce,
                                 const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<uint64_t> nbytes(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.name == "__metadata__") DS_THROW("{}: '__metadata__' is reserved and cannot name a tensor", path);
    if (!seen.insert(e.name).second) DS_THROW("{}: tensor '{}': duplicate name", path, e.name);
    uint64_t numel;
    if (!checked_bytes(e.dtype, e.shape, &numel, &nbytes[i]))
      DS_THROW("{}: tensor '{}': invalid shape {}", path, e.name, shape_string(e.shape));
  }
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ra = reference_dtype_rank(entries[a].dtype), rb = reference_dtype_rank(entries[b].dtype);
    return ra != rb ? ra > rb : entries[a].name < entries[b].name;
  });

  // ordered_json keeps the header in file order, as the reference writes it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (size_t i : order) {
    header[entries[i].name] = {{"dtype", dtype_safetensors_name(entries[i].dtype)},
                               {"shape", entries[i].shape},
                               {"data_offsets", {off, off + nbytes[i]}}};
    off += nbytes[i];
  }
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // data section starts 8-aligned
  const uint64_t n = hs.size();

  TempFile out(path);
  out.write(&n, 8);
  out.write(hs.data(), hs.size());
  for (size_t i : order) {
    const SafetensorsEntry& e = entries[i];
    const TensorView v = produce(i);
    if (v.dtype != e.dtype || v.dims() != e.shape)
      DS_THROW("{}: tensor '{}': produced {} {} but the header says {} {}", path, e.name, dtype_name(v.dtype),
               v.shape_str(), dtype_name(e.dtype), shape_string(e.shape));
    write_view(out, v, e.name);
  }
  out.commit();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, v] : tensors) entries.push_back({name, v.dtype, v.dims()});
  write_safetensors_streaming(path, entries, [&](size_t i) { return tensors[i].second; }, metadata);
}

}  // namespace ds
