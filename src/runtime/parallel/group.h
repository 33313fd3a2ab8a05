// One rank's parallel group as the engine sees it (TEP and DEP, docs/parallel.md): who it is, and the collectives
// the forward issues on its stream. Implementations: NCCL across GPUs (one process per rank, Communicator), and
// ranks simulated on one GPU by threads of one process (tests and single-GPU benchmarks). A group of one
// (world 1) is never built: the engine takes nullptr for "not parallel" and runs exactly as before.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

typedef struct CUstream_st* cudaStream_t;

namespace ds::allreduce {
struct RankView;
}

namespace ds::parallel {

// TEP: attention tensor-parallel (KDA and MLA heads split over the ranks), MoE experts split over the ranks,
//      all-reduce after attention and after the FFN; every rank runs the same batch.
// DEP: attention data-parallel (each rank runs its own requests and keeps whole weights for attention), MoE
//      experts split over the ranks, tokens sent to the rank of their experts and back (all-to-all).
enum class Mode { kTep, kDep };

// What `--tp N --ep M --mode tep|dep` asks for. world() ranks in all.
struct ParallelSpec {
  int tp = 1;  // attention tensor-parallel size (TEP); 1 under DEP
  int ep = 1;  // expert-parallel size (MoE experts split over ep ranks)
  Mode mode = Mode::kTep;
  int world() const { return mode == Mode::kTep ? tp : ep; }
};

// Validates and normalises the command-line triple: sizes >= 1; TEP needs ep == tp or ep == 1 (the default,
// normalised to tp: the experts are split over the tp ranks); DEP needs tp == 1 (or unset) and ep >= 1;
// mode "tep" | "dep". Throws ds::Error naming the flag and the accepted values.
ParallelSpec parse_parallel_spec(int tp, int ep, const std::string& mode);
std::string to_string(Mode m);

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual Mode mode() const = 0;
  virtual std::string name() const = 0;  // "NCCL", "simulated (one GPU)"

  // ---- stream-ordered device collectives (no host sync; capturable in a CUDA graph unless noted)
  // In place: data [count] becomes the sum over every rank; identical bits on every rank.
  virtual void all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream) = 0;
  // bytes from root's data to every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root, cudaStream_t stream) = 0;
  // out [world, bytes] gets every rank's in [bytes], in rank order.
  virtual void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) = 0;
  // Uneven blocks (DEP dispatch / combine), byte counts and offsets per peer rank; not capturable.
  virtual void all_to_allv(const void* in, const std::vector<size_t>& send_bytes,
                           const std::vector<size_t>& send_offsets, void* out,
                           const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets,
                           cudaStream_t stream) = 0;

  // ---- the fused MoE finalize + all-reduce + RMSNorm (TpFinalizeNorm); nullptr: never fused
  virtual const allreduce::RankView* peer_view() const { return nullptr; }
  virtual bool peer_access() const { return false; }  // agreed by every rank
  // Binds the peer buffers' protocol to the engine's stream (the one stream allowed to run it).
  virtual void bind_stream(cudaStream_t) {}
  // Runs `launch`, which enqueues a kernel that spins until every rank's matching kernel has run (the one-shot
  // all-reduce, fused or plain). Ranks with a device each: just runs it. Ranks sharing a device (simulated):
  // outside graph capture, every rank enters before any enqueues and leaves after all have enqueued, so no
  // rank's kernel spins while another rank's host thread blocks in a device-wide synchronisation (a first
  // cuBLASLt call, cudaFree, module loading) on its way to, or right after, its own launch: that wait would
  // include the spinning kernel, a deadlock until the protocol's timeout.
  virtual void run_spinning(cudaStream_t, const std::function<void()>& launch) { launch(); }

  // ---- host-side control (synchronous; the engine loops use these between steps, never inside a graph)
  // Every rank's bytes in rank order (lengths may differ per rank).
  virtual std::vector<std::string> exchange(const std::string& mine) = 0;
  // Throws the recorded failure of a collective (peer died, timeout), if any.
  virtual void check() const {}
};

}  // namespace ds::parallel
