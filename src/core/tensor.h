// Non-owning tensor view (dtype, shape, strides in elements, device) and a small owning host tensor.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ds {

enum class Device : uint8_t { kCPU, kCUDA };

inline constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int device_index = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  TensorView() = default;
  // Dense row-major view.
  TensorView(void* p, DType t, std::initializer_list<int64_t> dims, Device dev = Device::kCPU, int dev_index = 0)
      : TensorView(p, t, std::vector<int64_t>(dims), dev, dev_index) {}
  TensorView(void* p, DType t, const std::vector<int64_t>& dims, Device dev = Device::kCPU, int dev_index = 0)
      : data(p), dtype(t), device(dev), device_index(dev_index), ndim(static_cast<int>(dims.size())) {
    CHECK_LE(ndim, kMaxDims);
    for (int i = 0; i < ndim; ++i) shape[i] = dims[i];
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) { strides[i] = s; s *= shape[i]; }
  }

  int64_t size(int i) const { return shape[i < 0 ? i + ndim : i]; }
  int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return dtype_bytes_for(dtype, static_cast<size_t>(numel())); }
  bool is_contiguous() const {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
  std::vector<int64_t> dims() const { return std::vector<int64_t>(shape.begin(), shape.begin() + ndim); }
  template <class T> T* ptr() const { return static_cast<T*>(data); }
  std::string shape_str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
  // A view of columns [c0, c0 + n) of the last dim (a strided slice; no copy).
  TensorView slice_last(int64_t c0, int64_t n) const {
    CHECK(ndim >= 1 && c0 >= 0 && c0 + n <= shape[ndim - 1], "slice [{}, {}) of {}", c0, c0 + n, shape_str());
    CHECK(dtype != DType::kF4E2M1, "cannot slice packed fp4");
    TensorView v = *this;
    v.data = static_cast<char*>(data) + c0 * strides[ndim - 1] * static_cast<int64_t>(dtype_size(dtype));
    v.shape[ndim - 1] = n;
    return v;
  }
};

// Owning, dense, host-side tensor (checkpoint I/O, CPU reference engine, tests).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType t, std::vector<int64_t> dims) : dtype_(t), dims_(std::move(dims)) {
    int64_t n = 1;
    for (auto d : dims_) n *= d;
    buf_.assign(dtype_bytes_for(t, static_cast<size_t>(n)), 0);
  }
  TensorView view() { return TensorView(buf_.data(), dtype_, dims_); }
  TensorView view() const { return TensorView(const_cast<uint8_t*>(buf_.data()), dtype_, dims_); }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  size_t nbytes() const { return buf_.size(); }
  uint8_t* bytes() { return buf_.data(); }
  const uint8_t* bytes() const { return buf_.data(); }
  template <class T> T* ptr() { return reinterpret_cast<T*>(buf_.data()); }
  template <class T> const T* ptr() const { return reinterpret_cast<const T*>(buf_.data()); }
  float get_f32(size_t i) const { return load_as_f32(buf_.data(), dtype_, i); }
  void set_f32(size_t i, float v) { store_from_f32(buf_.data(), dtype_, i, v); }

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> dims_;
  std::vector<uint8_t> buf_;
};

}  // namespace ds
