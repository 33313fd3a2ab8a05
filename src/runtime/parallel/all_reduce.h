// The all-reduce the unfused tensor-parallel path calls: NCCL (Communicator) across GPUs, or the one-shot peer
// all-reduce over the fused kernel's buffers (PeerAllReduce in tp_finalize.h; simulated ranks on one GPU).
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"

typedef struct CUstream_st* cudaStream_t;

namespace ds::parallel {

class AllReduce {
 public:
  virtual ~AllReduce() = default;
  // In place: data [count] of `dtype` becomes the sum over every rank (stream-ordered, no host sync).
  virtual void sum(void* data, size_t count, DType dtype, cudaStream_t stream) = 0;
  virtual std::string name() const = 0;
};

}  // namespace ds::parallel
