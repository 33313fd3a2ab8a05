// CUDA error checks and RAII wrappers (device buffers, streams, events). Include only from CUDA builds.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "core/error.h"

#define CUDA_CHECK(expr)                                                                                \
  do {                                                                                                  \
    cudaError_t ds_e_ = (expr);                                                                         \
    if (ds_e_ != cudaSuccess) [[unlikely]]                                                              \
      ::ds::detail::throw_check(__FILE__, __LINE__, #expr,                                              \
                                ::fmt::format("{}: {}", cudaGetErrorName(ds_e_), cudaGetErrorString(ds_e_))); \
  } while (0)

// After every kernel launch: catches bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace ds {

// Owning device allocation (cudaMalloc; never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reset(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  void reset(size_t bytes) {
    release();
    if (bytes) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  void release() noexcept {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void> T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaStream {
 public:
  CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() { if (s_) cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreate(&e_)); }
  ~CudaEvent() { if (e_) cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
  // Milliseconds between `start` and this event.
  float elapsed_since(const CudaEvent& start) const {
    CUDA_CHECK(cudaEventSynchronize(e_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

// A new device buffer holding a copy of `bytes` host bytes. At least 16 bytes are allocated, so a kernel's 16-byte
// vector load of a tiny or empty array stays in bounds (bytes() says 16 then); an empty copy is skipped.
inline DeviceBuffer upload(const void* p, size_t bytes) {
  DeviceBuffer b(std::max<size_t>(bytes, 16));
  if (bytes) CUDA_CHECK(cudaMemcpy(b.get(), p, bytes, cudaMemcpyHostToDevice));
  return b;
}
template <class T>
DeviceBuffer upload(const std::vector<T>& v) { return upload(v.data(), v.size() * sizeof(T)); }

// `n` elements of T copied back from device memory (synchronous).
template <class T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n) CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t n) { return download<T>(b.get(), n); }

}  // namespace ds
