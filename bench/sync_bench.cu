// What one dependency between two decode ops costs on this GPU, three ways: a plain kernel boundary, a boundary
// under programmatic dependent launch (the engine's decode graphs), and a grid barrier inside one persistent
// kernel (what a persistent "megakernel" decode would pay instead). docs/perf-engine.md puts ~27 us of a
// ~60 us KDA + MoE decode layer in latency rather than bytes; whether a persistent kernel can recover part of it
// depends first on this number.
//
// Every op is the same small dependent step: each of B blocks x 256 threads reads 4 values of the previous op's
// output spread over every producer block (a full dependency, like an RMSNorm over a whole row), and writes its
// own 256. The ops run N = 1 and N = 64 times in a row, each sequence captured once in a CUDA graph and replayed
// (warm-up, CUDA events, median of 30 samples of 10 replays); the table gives (t(64) - t(1)) / 63 per op, the
// cost of one op plus one boundary. The three modes compute the same floats in the same order: their outputs are
// compared bitwise and the run fails if they differ.
//
//   sync_bench [--blocks-per-sm 1,4] [--ops 64]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "core/device.h"
#include "kernels/common/pdl.cuh"

using namespace ds;

namespace {

constexpr int kThreads = 256;
constexpr int kWarmup = 20, kSamples = 30, kReplays = 10;

struct Bufs {
  float* a = nullptr;
  float* b = nullptr;
  unsigned* count = nullptr;  // grid barrier: arrivals of the current phase
  unsigned* gen = nullptr;    // grid barrier: phases completed
  int n = 0;                  // floats per buffer = blocks * kThreads
};

// One op of block `blk` of `nblk`: out[own 256] from 4 values of `in` spread over every producer block. L2 loads:
// in the persistent mode other blocks of the same grid wrote `in` (L1 is not coherent across SMs).
__device__ __forceinline__ void op(const float* in, float* out, int n, int blk, int step) {
  const int t = threadIdx.x;
  float v = static_cast<float>(step);
#pragma unroll
  for (int k = 0; k < 4; ++k) v += __ldcg(in + (t * 131 + blk * 7 + k * 4099) % n);
  out[blk * kThreads + t] = v * 0.5f + 1.0f;
}

// Modes 1 and 2: one kernel per op (ping-pong buffers by parity). With PDL the next op's blocks are scheduled while
// this one drains and wait in griddepcontrol.wait (the engine's pattern: trigger early, wait before the first read).
__global__ void __launch_bounds__(kThreads) op_kernel(Bufs b, int step) {
  ds::pdl::launch_dependents();
  ds::pdl::wait();
  const float* in = step % 2 == 0 ? b.a : b.b;
  float* out = step % 2 == 0 ? b.b : b.a;
  op(in, out, b.n, blockIdx.x, step);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Mode 3: one persistent kernel, the ops separated by a grid barrier (every block co-resident: the grid is sized
// by the occupancy calculator). Arrive: fence, count; the last block resets the count and releases the phase.
__global__ void __launch_bounds__(kThreads) persistent_kernel(Bufs b, int first_step, int ops) {
  __shared__ unsigned phase;
  if (threadIdx.x == 0) phase = ld_acquire(b.gen);
  __syncthreads();
  for (int i = 0; i < ops; ++i) {
    const int step = first_step + i;
    const float* in = step % 2 == 0 ? b.a : b.b;
    float* out = step % 2 == 0 ? b.b : b.a;
    op(in, out, b.n, blockIdx.x, step);
    if (i + 1 == ops) break;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned g = phase;
      __threadfence();
      if (atomicAdd(b.count, 1u) == gridDim.x - 1) {
        atomicExch(b.count, 0u);
        __threadfence();
        atomicExch(b.gen, g + 1u);
      } else {
        while (ld_acquire(b.gen) == g) {
        }
      }
      phase = g + 1u;
    }
    __syncthreads();
  }
}

enum class Mode { kPlain, kPdl, kPersistent };
const char* mode_name(Mode m) {
  return m == Mode::kPlain ? "kernel per op" : m == Mode::kPdl ? "kernel per op, PDL" : "persistent, grid barrier";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Captures `ops` ops of `mode` as one graph.
cudaGraphExec_t capture(Mode mode, const Bufs& b, int blocks, int ops, cudaStream_t s) {
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  if (mode == Mode::kPersistent) {
    CUDA_CHECK(pdl::launch(false, persistent_kernel, dim3(blocks), dim3(kThreads), 0, s, b, 0, ops));
  } else {
    for (int i = 0; i < ops; ++i)
      CUDA_CHECK(pdl::launch(mode == Mode::kPdl, op_kernel, dim3(blocks), dim3(kThreads), 0, s, b, i));
  }
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}

// Median us per replay of `e`.
double time_graph(cudaGraphExec_t e, cudaStream_t s) {
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < kWarmup; ++i) CUDA_CHECK(cudaGraphLaunch(e, s));
  std::vector<double> us;
  for (int k = 0; k < kSamples; ++k) {
    CUDA_CHECK(cudaEventRecord(t0, s));
    for (int i = 0; i < kReplays; ++i) CUDA_CHECK(cudaGraphLaunch(e, s));
    CUDA_CHECK(cudaEventRecord(t1, s));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    us.push_back(1000.0 * ms / kReplays);
  }
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return median(us);
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::string str(s);
  size_t pos = 0;
  while (pos <= str.size()) {
    const size_t c = str.find(',', pos);
    const std::string tok = str.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    const int x = std::atoi(tok.c_str());
    if (x <= 0) {
      std::fprintf(stderr, "sync_bench: '%s' is not a list of positive integers\n", s);
      std::exit(2);
    }
    v.push_back(x);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> per_sm = {1, 4};
  int ops = 64;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--blocks-per-sm") && i + 1 < argc) {
      per_sm = parse_list(argv[++i]);
    } else if (!std::strcmp(argv[i], "--ops") && i + 1 < argc) {
      ops = std::max(2, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: sync_bench [--blocks-per-sm 1,4] [--ops 64]\n");
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("sync_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  int dev = 0, sms = 0, resident = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_kernel, kThreads, 0));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("| blocks | mode | us per op + boundary | us for %d ops | us for 1 op |\n|---:|---|---:|---:|---:|\n", ops);
  bool all_equal = true;
  for (int k : per_sm) {
    const int blocks = sms * std::min(k, resident);  // the persistent grid must be co-resident
    Bufs b;
    b.n = blocks * kThreads;
    CUDA_CHECK(cudaMalloc(&b.a, sizeof(float) * b.n));
    CUDA_CHECK(cudaMalloc(&b.b, sizeof(float) * b.n));
    CUDA_CHECK(cudaMalloc(&b.count, 2 * sizeof(unsigned)));
    b.gen = b.count + 1;
    std::vector<float> init(b.n);
    for (int i = 0; i < b.n; ++i) init[i] = static_cast<float>(i % 97) * 0.01f;
    std::vector<std::vector<float>> finals;
    for (Mode m : {Mode::kPlain, Mode::kPdl, Mode::kPersistent}) {
      double t[2] = {0.0, 0.0};
      const int counts[2] = {1, ops};
      for (int j = 0; j < 2; ++j) {
        cudaGraphExec_t e = capture(m, b, blocks, counts[j], s);
        t[j] = time_graph(e, s);
        // One clean run from the same start for the cross-mode check.
        CUDA_CHECK(cudaMemcpyAsync(b.a, init.data(), sizeof(float) * b.n, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaMemsetAsync(b.b, 0xff, sizeof(float) * b.n, s));
        CUDA_CHECK(cudaMemsetAsync(b.count, 0, 2 * sizeof(unsigned), s));
        CUDA_CHECK(cudaGraphLaunch(e, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaGraphExecDestroy(e));
        if (j == 1) {
          std::vector<float> out(b.n);
          CUDA_CHECK(cudaMemcpy(out.data(), ops % 2 == 0 ? b.a : b.b, sizeof(float) * b.n, cudaMemcpyDeviceToHost));
          finals.push_back(out);
        }
      }
      std::printf("| %d (%d per SM) | %s | %.2f | %.1f | %.2f |\n", blocks, blocks / sms, mode_name(m),
                  (t[1] - t[0]) / (ops - 1), t[1], t[0]);
    }
    for (size_t i = 1; i < finals.size(); ++i)
      if (std::memcmp(finals[i].data(), finals[0].data(), sizeof(float) * b.n) != 0) {
        std::printf("ERROR: %s gives other values than %s at %d blocks\n", mode_name(static_cast<Mode>(i)),
                    mode_name(Mode::kPlain), blocks);
        all_equal = false;
      }
    CUDA_CHECK(cudaFree(b.a));
    CUDA_CHECK(cudaFree(b.b));
    CUDA_CHECK(cudaFree(b.count));
  }
  CUDA_CHECK(cudaStreamDestroy(s));
  if (!all_equal) return 1;
  std::printf("the three modes' outputs are bitwise equal\n");
  return 0;
}
