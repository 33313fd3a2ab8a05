// One rank's buffer set of the one-shot all-reduce (the fused finalize + all-reduce + RMSNorm and PeerAllReduce):
// allocation, exchange of the addresses between ranks (peer pointers in one process, CUDA IPC across
// processes), and the view the kernels take.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/allreduce/allreduce.h"

namespace ds::parallel {

class Communicator;

class PeerBuffers {
 public:
  // R ranks simulated on one device (tests, benchmarks): R sets on `device`, each view with
  // co_resident_ranks = R so launch shapes keep every rank's blocks resident at once.
  static std::vector<std::unique_ptr<PeerBuffers>> create_simulated(int world, size_t slot_elems, int device);
  // One process driving several devices, rank i on devices[i]: peer access enabled between every pair;
  // peer_access() is false on every set when a pair has none.
  static std::vector<std::unique_ptr<PeerBuffers>> create_multi_device(const std::vector<int>& devices,
                                                                       size_t slot_elems);
  // One process per rank (collective over comm): the CUDA IPC handles are all-gathered and opened; every rank
  // ends with the same peer_access() (a rank that could not open a peer's buffer makes it false everywhere,
  // so all ranks take the same path).
  static std::unique_ptr<PeerBuffers> create_ipc(Communicator& comm, size_t slot_elems);

  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  const allreduce::RankView& view() const { return view_; }
  bool peer_access() const { return peer_access_; }
  int device() const { return device_; }
  // The one stream allowed to run ops on this set (the protocol is single-in-flight per set).
  void bind_stream(cudaStream_t s) { view_.owner_stream = s; }
  void set_timeout(double seconds) { view_.timeout_ns = static_cast<uint64_t>(seconds * 1e9); }
  // Throws ds::Error naming the failure when the protocol recorded one (reads device memory: synchronise the
  // owner stream first).
  void check() const;

 private:
  PeerBuffers() = default;
  int device_ = 0;
  void* own_ = nullptr;               // this rank's allocation
  std::vector<void*> ipc_opened_;     // peers' allocations mapped through CUDA IPC (closed on destruction)
  bool peer_access_ = false;
  allreduce::RankView view_;
};

}  // namespace ds::parallel
