// NcclGroup (see nccl_group.h).
#include "runtime/parallel/nccl_group.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "runtime/parallel/launcher.h"
#include "runtime/parallel/peer_buffers.h"

namespace ds::parallel {

NcclGroup::NcclGroup(std::shared_ptr<Communicator> comm, Mode mode, size_t peer_slot_elems)
    : comm_(std::move(comm)), mode_(mode) {
  CHECK(comm_ != nullptr, "NcclGroup needs a communicator");
  if (peer_slot_elems > 0) peers_ = PeerBuffers::create_ipc(*comm_, (peer_slot_elems + 7) / 8 * 8);
}

std::shared_ptr<NcclGroup> NcclGroup::from_rank_env(const RankEnv& env, Mode mode, size_t peer_slot_elems,
                                                    CommOptions options) {
  std::shared_ptr<Communicator> comm = Communicator::from_rank_env(env, std::move(options));
  return std::make_shared<NcclGroup>(std::move(comm), mode, peer_slot_elems);
}

NcclGroup::~NcclGroup() = default;

int NcclGroup::rank() const { return comm_->rank(); }
int NcclGroup::world() const { return comm_->world(); }

void NcclGroup::all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream) {
  comm_->all_reduce(data, data, count, dtype, stream);
}
void NcclGroup::broadcast(void* data, size_t bytes, int root, cudaStream_t stream) {
  comm_->broadcast(data, data, bytes, DType::kU8, root, stream);
}
void NcclGroup::all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) {
  comm_->all_gather(in, out, bytes, DType::kU8, stream);
}
void NcclGroup::all_to_allv(const void* in, const std::vector<size_t>& send_bytes,
                            const std::vector<size_t>& send_offsets, void* out, const std::vector<size_t>& recv_bytes,
                            const std::vector<size_t>& recv_offsets, cudaStream_t stream) {
  comm_->all_to_allv(in, send_bytes, send_offsets, out, recv_bytes, recv_offsets, DType::kU8, stream);
}

const allreduce::RankView* NcclGroup::peer_view() const {
  return peers_ && peers_->peer_access() ? &peers_->view() : nullptr;
}
bool NcclGroup::peer_access() const { return peers_ && peers_->peer_access(); }
void NcclGroup::check() const {
  comm_->check();
  if (peers_) peers_->check();
}
void NcclGroup::bind_stream(cudaStream_t stream) {
  if (peers_) peers_->bind_stream(stream);
}

std::vector<std::string> NcclGroup::exchange(const std::string& mine) {
  // all_gather_bytes takes one length on every rank. One round of fixed slots [u64 length | first bytes] carries
  // every message that fits (a step's control frame, nearly always); only when some rank's does not, a second
  // round of the longest length carries them whole.
  constexpr size_t kSlot = 4096, kHead = sizeof(uint64_t), kInline = kSlot - kHead;
  const uint64_t len = mine.size();
  std::string slot(kSlot, '\0');
  std::memcpy(slot.data(), &len, kHead);
  std::memcpy(slot.data() + kHead, mine.data(), std::min<size_t>(len, kInline));
  std::vector<std::string> all = comm_->all_gather_bytes(slot);
  std::vector<uint64_t> n(all.size());
  uint64_t longest = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    std::memcpy(&n[r], all[r].data(), kHead);
    longest = std::max(longest, n[r]);
  }
  if (longest <= kInline) {
    for (size_t r = 0; r < all.size(); ++r) all[r] = all[r].substr(kHead, n[r]);
    return all;
  }
  std::string padded = mine;
  padded.resize(longest, '\0');
  all = comm_->all_gather_bytes(padded);
  for (size_t r = 0; r < all.size(); ++r) all[r].resize(n[r]);
  return all;
}

}  // namespace ds::parallel
