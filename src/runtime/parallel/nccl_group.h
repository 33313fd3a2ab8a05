// One rank process's Group over NCCL (one GPU per rank): the sums, broadcast, gathers and all-to-all on the
// Communicator, the host exchange over its all-gather, and (optionally) CUDA-IPC peer buffers for the fused MoE
// finalize + all-reduce + RMSNorm (TpFinalizeNorm). NCCL is optional at build time: without it the constructor
// throws (the Communicator does).
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/parallel/communicator.h"
#include "runtime/parallel/group.h"

namespace ds::parallel {

class PeerBuffers;
struct RankEnv;

class NcclGroup final : public Group {
 public:
  // peer_slot_elems > 0: creates the IPC peer buffers (collective over comm; every rank must pass the same
  // value, e.g. 16 * hidden_size for the fused path's at most 16 tokens); 0: never fused.
  NcclGroup(std::shared_ptr<Communicator> comm, Mode mode, size_t peer_slot_elems);
  // A launched rank: Communicator::from_rank_env, then the group.
  static std::shared_ptr<NcclGroup> from_rank_env(const RankEnv& env, Mode mode, size_t peer_slot_elems,
                                                  CommOptions options = {});
  ~NcclGroup() override;

  int rank() const override;
  int world() const override;
  Mode mode() const override { return mode_; }
  std::string name() const override { return "NCCL"; }

  void all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream) override;
  void broadcast(void* data, size_t bytes, int root, cudaStream_t stream) override;
  void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_offsets,
                   void* out, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets,
                   cudaStream_t stream) override;

  const allreduce::RankView* peer_view() const override;
  bool peer_access() const override;
  void bind_stream(cudaStream_t stream) override;

  std::vector<std::string> exchange(const std::string& mine) override;
  // The communicator's recorded failure, then the one-shot all-reduce's (a timed-out peer leaves NaN sums).
  void check() const override;

  Communicator& communicator() { return *comm_; }

 private:
  std::shared_ptr<Communicator> comm_;
  Mode mode_;
  std::unique_ptr<PeerBuffers> peers_;
};

}  // namespace ds::parallel
