// DeviceModel: upload of a checkpoint (copy, pack, FP8 quantise/stack) and random models generated on the GPU,
// both driven by the plan of cuda_model_plan.h. Config checks run before any CUDA call (also in CPU builds).
#include "runtime/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "runtime/cuda_model_plan.h"

#if defined(DELTASERVE_WITH_CUDA)
#include <cuda_runtime.h>

#include "core/cuda_utils.h"
#include "kernels/gemm/gemm.h"
#endif

namespace ds {

using devmodel::Dest;
using devmodel::Kind;
using devmodel::Piece;
using devmodel::Plan;

struct DeviceModel::Storage {
#if defined(DELTASERVE_WITH_CUDA)
  DeviceBuffer arena;  // every tensor of the plan
#endif
};

DeviceModel::DeviceModel() = default;
DeviceModel::~DeviceModel() = default;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_config(const ModelConfig& c, const DeviceModelOptions& o, const char* who) {
  validate_config(c, who);
  if (auto why = device_model_unsupported(c, o)) DS_THROW("{}: the CUDA engine cannot run this config: {}", who, *why);
  if (auto why = device_shard_unsupported(c, o)) DS_THROW("{}: cannot split this config: {}", who, *why);
}

}  // namespace

util::FillParams random_fill_params(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
  // The init rules of random_tensor() (model/weights.cpp), the same order of name tests.
  util::FillParams f;
  f.seed = splitmix64(seed ^ splitmix64(fnv1a(spec.name)));
  const std::string& n = spec.name;
  const double out_scale = 0.5 / std::sqrt(2.0 * c.num_hidden_layers);
  auto normal = [&](double sd) {
    f.dist = util::FillDist::kNormal;
    f.a = 0.0f;
    f.b = static_cast<float>(sd);
  };
  if (ends_with(n, "norm.weight")) {
    f.dist = util::FillDist::kConst;
    f.a = 1.0f;
  } else if (ends_with(n, "_conv1d.weight")) {
    normal(0.5);
  } else if (ends_with(n, "A_log")) {  // exp(A_log) in [1, 16)
    f.dist = util::FillDist::kUniform;
    f.a = 0.0f;
    f.b = 1.0f;
    f.map = util::FillMap::kLog1p15;
  } else if (ends_with(n, "dt_bias")) {  // softplus(dt_bias) in [0.001, 0.1)
    f.dist = util::FillDist::kUniform;
    f.a = 0.001f;
    f.b = 0.1f;
    f.map = util::FillMap::kInvSoftplus;
  } else if (ends_with(n, "e_score_correction_bias")) {
    normal(0.01);
  } else if (n == "model.embed_tokens.weight") {
    normal(1.0);
  } else if (spec.shape.size() == 2) {
    const bool out_proj = ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight") || ends_with(n, "w2.weight");
    normal((out_proj ? out_scale : 1.0) / std::sqrt(static_cast<double>(spec.shape[1])));
  } else {
    DS_THROW("random_fill_params: no init rule for tensor '{}'", n);
  }
  return f;
}

#if defined(DELTASERVE_WITH_CUDA)

namespace {

constexpr double kGB = 1e9;

// Refuses before allocating when weights + load-time scratch do not fit in the device's free memory.
void check_device_memory(const char* who, const DeviceModelOptions& o, const Plan& plan) {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = plan.bytes + plan.quant_scratch_bytes + plan.slice_scratch_bytes;
  if (need > free_b)
    DS_THROW("{}: the model needs {:.2f} GB of GPU memory ({:.2f} GB weights + {:.2f} GB load-time scratch) but "
             "{} has only {:.2f} GB free of {:.2f} GB{}",
             who, need / kGB, plan.bytes / kGB, (plan.quant_scratch_bytes + plan.slice_scratch_bytes) / kGB, cuda_device_name(), free_b / kGB,
             total_b / kGB, o.fp8 ? "" : " (FP8 weights, --quantize fp8, need about half)");
}

int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

struct PinnedDeleter {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
using PinnedPtr = std::unique_ptr<void, PinnedDeleter>;

// memcpy split over threads: the source is often an mmap'd checkpoint, and one thread reads it at ~2 GB/s.
void parallel_memcpy(void* dst, const void* src, size_t n) {
  constexpr size_t kMinPerThread = size_t{4} << 20;
  const size_t threads = std::min<size_t>({8, std::max(1u, std::thread::hardware_concurrency()), n / kMinPerThread});
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t part = (n + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t b = t * part, e = std::min(n, b + part);
    if (b < e)
      pool.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b); });
  }
  for (auto& th : pool) th.join();
}

// Host -> device copies through a ring of pinned chunks: the CPU fills chunk i + 1 while chunk i is in flight.
class Stager {
 public:
  Stager(cudaStream_t s, size_t chunk) : s_(s), chunk_(chunk) {
    for (int i = 0; i < kSlots; ++i) {
      void* p = nullptr;
      CUDA_CHECK(cudaMallocHost(&p, chunk_));
      buf_[i].reset(p);
    }
  }
  ~Stager() { cudaStreamSynchronize(s_); }  // no DMA may read a freed pinned buffer, even after an error
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  void copy(void* dst, const void* src, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(chunk_, bytes - done);
      const int slot = next_;
      next_ = (next_ + 1) % kSlots;
      CUDA_CHECK(cudaEventSynchronize(ev_[slot].get()));  // the previous copy out of this chunk has finished
      parallel_memcpy(buf_[slot].get(), static_cast<const char*>(src) + done, n);
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, buf_[slot].get(), n, cudaMemcpyHostToDevice, s_));
      ev_[slot].record(s_);
      done += n;
    }
  }

 private:
  static constexpr int kSlots = 3;
  cudaStream_t s_;
  size_t chunk_;
  PinnedPtr buf_[kSlots];
  CudaEvent ev_[kSlots];
  int next_ = 0;
};

// Allocates the arena for `plan`, binds m's fields and zeroes the tensors with pad rows.
void allocate(const Plan& plan, DeviceModel* m, cudaStream_t s) {
  m->storage = std::make_unique<DeviceModel::Storage>();
  m->storage->arena.reset(plan.bytes);
  char* base = m->storage->arena.get<char>();
  devmodel::bind_plan(plan, base, current_device());
  for (const Dest& d : plan.dests) {
    CHECK(d.covered_rows() <= d.rows, "device model plan: {} has {} piece rows for {} rows", d.what, d.covered_rows(),
          d.rows);
    // Scales always start zeroed: pad rows and the pad columns of 16-byte scale rows stay defined.
    if (d.kind == Kind::kFP8) CUDA_CHECK(cudaMemsetAsync(base + d.scale_offset, 0, d.scale_bytes(), s));
    if (d.covered_rows() == d.rows) continue;
    CUDA_CHECK(cudaMemsetAsync(base + d.offset, 0, d.data_bytes(), s));
  }
}

size_t elem_bytes(Kind k) { return k == Kind::kF32 ? 4 : k == Kind::kBF16 ? 2 : 1; }

// Where a piece's data and (FP8) scales start.
char* piece_data(char* base, const Dest& d, const Piece& p) {
  return base + d.offset + static_cast<size_t>(p.row0 * d.cols) * elem_bytes(d.kind);
}
float* piece_scale(char* base, const Dest& d, const Piece& p) {
  return reinterpret_cast<float*>(base + d.scale_offset) + (p.row0 / devmodel::kBlock) * d.scale_pitch;
}

void quantize_into(const bf16_t* scratch, char* base, const Dest& d, const Piece& p, cudaStream_t s) {
  gemm::QuantWeightParams q;
  q.w = scratch;
  q.q = reinterpret_cast<uint8_t*>(piece_data(base, d, p));
  q.scale = piece_scale(base, d, p);
  q.N = static_cast<int>(p.rows);
  q.K = static_cast<int>(d.cols);
  q.scale_pitch = d.scale_pitch;
  gemm::quantize_weight_fp8(q, s);
}

const TensorView& contiguous(const WeightSet& w, const std::string& name) {
  const TensorView& v = w.get(name);
  if (!v.is_contiguous()) DS_THROW("upload_model: tensor '{}' {} is not contiguous", name, v.shape_str());
  return v;
}

// The bf16 bytes of a checkpoint tensor: the tensor itself when bf16, else converted (f16/f32) or dequantised
// (e4m3 + weight_scale_inv) into *tmp.
const void* host_bf16(const WeightSet& w, const std::string& name, std::vector<uint16_t>* tmp) {
  const TensorView& v = w.get(name);
  if (v.dtype == DType::kBF16) return contiguous(w, name).data;
  const std::vector<float> f = w.get_f32(name);
  tmp->resize(f.size());
  for (size_t i = 0; i < f.size(); ++i) (*tmp)[i] = f32_to_bf16(f[i]);
  return tmp->data();
}

// The block of `src` (the whole tensor, rows of p.src_cols elements of T) a sliced piece takes, contiguous.
template <class T>
std::vector<T> host_block(const T* src, const Dest& d, const Piece& p) {
  std::vector<T> out(static_cast<size_t>(p.rows * d.cols));
  for (int64_t r = 0; r < p.rows; ++r)
    std::memcpy(out.data() + r * d.cols, src + (p.src_row0 + r) * p.src_cols + p.src_col0, d.cols * sizeof(T));
  return out;
}

// A rank's slice of a checkpoint tensor: cut on the host (e4m3 tensors dequantised first; an FP8 destination
// re-quantises the block on the GPU, which gives back the stored codes when the block edges are 128-aligned).
void upload_sliced_piece(const WeightSet& w, const Dest& d, const Piece& p, char* base, bf16_t* scratch, Stager& st,
                         cudaStream_t s) {
  const std::string& name = p.spec.name;
  const size_t n = static_cast<size_t>(p.rows * d.cols);
  if (d.kind == Kind::kF32) {
    const std::vector<float> f = w.get_f32(name);
    const std::vector<float> blk = host_block(f.data(), d, p);
    st.copy(piece_data(base, d, p), blk.data(), n * 4);
    return;
  }
  std::vector<uint16_t> tmp;
  const auto* whole = static_cast<const uint16_t*>(host_bf16(w, name, &tmp));
  const std::vector<uint16_t> blk = host_block(whole, d, p);
  if (d.kind == Kind::kBF16) {
    st.copy(piece_data(base, d, p), blk.data(), n * 2);
  } else {
    st.copy(scratch, blk.data(), n * 2);
    quantize_into(scratch, base, d, p, s);
  }
}

void upload_piece(const WeightSet& w, const Dest& d, const Piece& p, char* base, bf16_t* scratch, Stager& st,
                  cudaStream_t s) {
  if (p.sliced(d.cols)) return upload_sliced_piece(w, d, p, base, scratch, st, s);
  const std::string& name = p.spec.name;
  const size_t n = static_cast<size_t>(p.rows * d.cols);
  std::vector<uint16_t> tmp;
  switch (d.kind) {
    case Kind::kF32: {
      const std::vector<float> f = w.get_f32(name);
      st.copy(piece_data(base, d, p), f.data(), n * 4);
      break;
    }
    case Kind::kBF16:
      st.copy(piece_data(base, d, p), host_bf16(w, name, &tmp), n * 2);
      break;
    case Kind::kFP8:
      if (w.get(name).dtype == DType::kF8E4M3) {  // as stored: codes and this piece's rows of block scales
        const TensorView& sc = contiguous(w, name + "_scale_inv");
        st.copy(piece_data(base, d, p), contiguous(w, name).data, n);
        const int64_t kb = d.cols / devmodel::kBlock;
        if (d.scale_pitch == kb) {
          st.copy(piece_scale(base, d, p), sc.data, sc.nbytes());
        } else {  // checkpoint rows of K/128 scales into 16-byte padded rows, one row at a time
          const int64_t rows = sc.numel() / kb;
          for (int64_t r = 0; r < rows; ++r)
            st.copy(piece_scale(base, d, p) + r * d.scale_pitch, static_cast<const float*>(sc.data) + r * kb, kb * 4);
        }
      } else {
        st.copy(scratch, host_bf16(w, name, &tmp), n * 2);
        quantize_into(scratch, base, d, p, s);
      }
      break;
  }
  // Stager::copy() has copied the host bytes into pinned memory when it returns: f and tmp may go now.
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Waits for the loading work, surfaces any asynchronous error, and logs what was loaded.
std::unique_ptr<DeviceModel> finish(std::unique_ptr<DeviceModel> m, CudaStream& stream, const char* who, double t0) {
  stream.sync();
  CUDA_CHECK(cudaGetLastError());
  const DeviceShard& sh = m->shard;
  const std::string slice = sh.tp_size > 1   ? fmt::format(" (TEP rank {} of {})", sh.tp_rank, sh.tp_size)
                            : sh.ep_size > 1 ? fmt::format(" (DEP rank {} of {})", sh.ep_rank, sh.ep_size)
                                             : std::string();
  LOG_INFO("{}: {:.2f} GB of weights{} on {} in {:.1f} s{}", who, m->bytes / kGB, slice, cuda_device_name(),
           now_s() - t0, m->options.fp8 ? " (FP8)" : "");
  return m;
}

}  // namespace

std::unique_ptr<DeviceModel> upload_model(const ModelConfig& c, const WeightSet& w, const DeviceModelOptions& o) {
  check_config(c, o, "upload_model");
  validate_weights(c, w);
  if (!cuda_device_available()) DS_THROW("upload_model: no CUDA device");
  const double t0 = now_s();
  auto m = std::make_unique<DeviceModel>();
  const Plan plan = devmodel::plan_device_model(
      c, o, [&w](const std::string& name) { return w.get(name).dtype == DType::kF8E4M3; }, m.get());
  check_device_memory("upload_model", o, plan);
  CudaStream stream;
  allocate(plan, m.get(), stream.get());
  DeviceBuffer scratch(plan.quant_scratch_bytes);
  char* base = m->storage->arena.get<char>();
  {
    Stager st(stream.get(), std::clamp<size_t>(plan.bytes, size_t{1} << 20, size_t{64} << 20));
    for (const Dest& d : plan.dests)
      for (const Piece& p : d.pieces) upload_piece(w, d, p, base, scratch.get<bf16_t>(), st, stream.get());
  }
  return finish(std::move(m), stream, "upload_model", t0);
}

std::unique_ptr<DeviceModel> random_device_model(const ModelConfig& c, uint64_t seed, const DeviceModelOptions& o) {
  check_config(c, o, "random_device_model");
  if (!cuda_device_available()) DS_THROW("random_device_model: no CUDA device");
  const double t0 = now_s();
  auto m = std::make_unique<DeviceModel>();
  const Plan plan = devmodel::plan_device_model(c, o, {}, m.get());
  check_device_memory("random_device_model", o, plan);
  CudaStream stream;
  allocate(plan, m.get(), stream.get());
  DeviceBuffer scratch(plan.quant_scratch_bytes);  // bf16 of one piece, quantised into place
  DeviceBuffer whole(plan.slice_scratch_bytes);    // a sliced piece's whole tensor
  char* base = m->storage->arena.get<char>();
  for (const Dest& d : plan.dests)
    for (const Piece& p : d.pieces) {
      util::FillParams f = random_fill_params(c, p.spec, seed);
      f.n = p.rows * d.cols;
      if (p.sliced(d.cols)) {  // the whole tensor's values, then this rank's block (TP = N equals TP = 1)
        const size_t es = d.kind == Kind::kF32 ? 4 : 2;
        f.n = p.numel();
        f.out = whole.get();
        f.dtype = d.kind == Kind::kF32 ? DType::kF32 : DType::kBF16;
        util::fill_random(f, stream.get());
        void* dst = d.kind == Kind::kFP8 ? scratch.get() : piece_data(base, d, p);
        const char* src = whole.get<char>() + static_cast<size_t>(p.src_row0 * p.src_cols + p.src_col0) * es;
        CUDA_CHECK(cudaMemcpy2DAsync(dst, d.cols * es, src, p.src_cols * es, d.cols * es, p.rows,
                                     cudaMemcpyDeviceToDevice, stream.get()));
        if (d.kind == Kind::kFP8) quantize_into(scratch.get<bf16_t>(), base, d, p, stream.get());
        continue;
      }
      if (d.kind == Kind::kFP8) {
        f.out = scratch.get();
        f.dtype = DType::kBF16;
        util::fill_random(f, stream.get());
        quantize_into(scratch.get<bf16_t>(), base, d, p, stream.get());
      } else {
        f.out = piece_data(base, d, p);
        f.dtype = d.kind == Kind::kF32 ? DType::kF32 : DType::kBF16;
        util::fill_random(f, stream.get());
      }
    }
  return finish(std::move(m), stream, "random_device_model", t0);
}

#else  // CPU-only build: the checks run (CI tests them), then a clear refusal.

std::unique_ptr<DeviceModel> upload_model(const ModelConfig& c, const WeightSet& w, const DeviceModelOptions& o) {
  check_config(c, o, "upload_model");
  validate_weights(c, w);
  DS_THROW("upload_model: this build has no CUDA support");
}

std::unique_ptr<DeviceModel> random_device_model(const ModelConfig& c, uint64_t seed, const DeviceModelOptions& o) {
  (void)seed;
  check_config(c, o, "random_device_model");
  DS_THROW("random_device_model: this build has no CUDA support");
}

#endif

}  // namespace ds
