// NCCL communicator of one rank: non-blocking initialisation from a unique id, all-reduce, all-gather,
// all-to-all (grouped send/recv), and a watchdog that aborts the communicator with a clear error when a
// collective does not finish in time or NCCL reports a failure (a dead or hung peer), never a silent hang.
// NCCL is optional at build time: without it every constructor throws and nccl_available() is false.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "runtime/parallel/all_reduce.h"

namespace ds::parallel {

struct RankEnv;

bool nccl_available();
// A fresh NCCL unique id as 256 hex digits (the text the rendezvous file carries). The calling process hosts
// NCCL's bootstrap root for it: call it in the rank that publishes it (global rank 0).
std::string nccl_unique_id_hex();

struct CommOptions {
  double init_timeout_s = 300;  // every rank must have joined by then
  double timeout_s = 600;       // a watched collective must complete by then (first-step compilation included)
  double poll_s = 0.1;          // watchdog period
  // Called once, from the thread that detected the failure (usually the watchdog), after the communicator was
  // aborted. Default: log the error. A rank
  // process may end itself here (the launcher then stops the other ranks).
  std::function<void(const std::string&)> on_failure;
};

class Communicator : public AllReduce {
 public:
  // Joins communicator `id_hex` as `rank` of `world` on `device` (one device per rank).
  Communicator(const std::string& id_hex, int rank, int world, int device, CommOptions options = {});
  // Rank of a launched process: global rank 0 creates the id and publishes it to env.rendezvous, the others
  // wait for it (rendezvous_timeout_s).
  static std::unique_ptr<Communicator> from_rank_env(const RankEnv& env, CommOptions options = {},
                                                     double rendezvous_timeout_s = 300);
  // One process driving several devices: rank i on devices[i]. Collectives of such a group must be issued
  // inside one Communicator::group() call (NCCL's rule for several ranks in one thread).
  static std::vector<std::unique_ptr<Communicator>> create_local(const std::vector<int>& devices,
                                                                 CommOptions options = {});
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world() const;
  int device() const;

  // Sum over ranks, in place allowed (in == out). Stream-ordered; the watchdog watches it.
  void all_reduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream);
  // count elements from root's in to every rank's out (in place allowed).
  void broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream);
  // out [world, count] gets every rank's in [count].
  void all_gather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream);
  // in/out [world, count]: block p of in goes to rank p, block p of out comes from rank p (grouped send/recv).
  void all_to_all(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream);
  // Uneven blocks (DEP dispatch/combine): send_counts[p] elements from in + send_offsets[p] go to rank p,
  // recv_counts[p] elements from rank p land at out + recv_offsets[p] (element offsets, one entry per rank).
  void all_to_allv(const void* in, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_offsets,
                   void* out, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_offsets,
                   DType dtype, cudaStream_t stream);
  // Bootstrap helper (synchronous): every rank's bytes, in rank order; every rank passes the same length.
  std::vector<std::string> all_gather_bytes(const std::string& mine);

  // AllReduce (the unfused tensor-parallel path).
  void sum(void* data, size_t count, DType dtype, cudaStream_t stream) override;
  std::string name() const override { return "NCCL"; }

  // Asks the watchdog to see `stream` reach this point within timeout_s (collectives do it themselves; call it
  // after replaying a CUDA graph that contains collectives). Ignored while the stream is being captured.
  void watch(cudaStream_t stream, const std::string& what);
  // Throws the recorded failure, if any.
  void check() const;
  bool failed() const;
  // Aborts the communicator (unblocks every pending collective) and records `why`.
  void abort(const std::string& why);

  // Runs fn (collective calls of several communicators of this process) inside ncclGroupStart/End and waits
  // until every communicator has enqueued its part.
  static void group(const std::vector<Communicator*>& comms, const std::function<void()>& fn);

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Hex text <-> bytes (NCCL ids in rendezvous files, IPC handles in all_gather_bytes).
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex);

}  // namespace ds::parallel
