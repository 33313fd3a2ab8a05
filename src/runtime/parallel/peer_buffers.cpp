// Peer buffer sets: allocation and address exchange (see peer_buffers.h).
#include "runtime/parallel/peer_buffers.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "runtime/parallel/communicator.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace ds::parallel {

#ifdef DELTASERVE_WITH_CUDA

namespace {

void* alloc_set(int device, int world, size_t slot_elems) {
  CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  const size_t bytes = allreduce::buffer_bytes(world, slot_elems);
  CUDA_CHECK(cudaMalloc(&p, bytes));
  allreduce::init_buffers(p, world, slot_elems, nullptr);
  CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return p;
}

}  // namespace

std::vector<std::unique_ptr<PeerBuffers>> PeerBuffers::create_simulated(int world, size_t slot_elems, int device) {
  std::vector<std::unique_ptr<PeerBuffers>> sets;
  std::vector<void*> bases;
  for (int r = 0; r < world; ++r) {
    sets.push_back(std::unique_ptr<PeerBuffers>(new PeerBuffers()));
    sets.back()->device_ = device;
    sets.back()->own_ = alloc_set(device, world, slot_elems);
    bases.push_back(sets.back()->own_);
  }
  const int resident = allreduce::device_resident_blocks(device);
  for (int r = 0; r < world; ++r) {
    sets[r]->view_ = allreduce::make_rank_view(bases.data(), r, world, slot_elems);
    sets[r]->view_.co_resident_ranks = world;
    sets[r]->view_.resident_blocks = resident;
    sets[r]->peer_access_ = true;  // one device: every "peer" buffer is local memory
  }
  return sets;
}

std::vector<std::unique_ptr<PeerBuffers>> PeerBuffers::create_multi_device(const std::vector<int>& devices,
                                                                           size_t slot_elems) {
  const int world = static_cast<int>(devices.size());
  int saved = 0;
  CUDA_CHECK(cudaGetDevice(&saved));
  bool access = true;
  for (int a = 0; a < world; ++a) {
    CUDA_CHECK(cudaSetDevice(devices[a]));
    for (int b = 0; b < world; ++b) {
      if (a == b || devices[a] == devices[b]) continue;
      int can = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[a], devices[b]));
      if (!can) {
        access = false;
        continue;
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[b], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clear the sticky-free error state of this call
      } else if (e != cudaSuccess) {
        cudaGetLastError();
        access = false;
      }
    }
  }
  std::vector<std::unique_ptr<PeerBuffers>> sets;
  std::vector<void*> bases;
  for (int r = 0; r < world; ++r) {
    sets.push_back(std::unique_ptr<PeerBuffers>(new PeerBuffers()));
    sets.back()->device_ = devices[r];
    sets.back()->own_ = alloc_set(devices[r], world, slot_elems);
    bases.push_back(sets.back()->own_);
  }
  for (int r = 0; r < world; ++r) {
    int sharing = 0;
    for (int d : devices) sharing += d == devices[r];
    sets[r]->view_ = allreduce::make_rank_view(bases.data(), r, world, slot_elems);
    sets[r]->view_.co_resident_ranks = sharing;
    sets[r]->view_.resident_blocks = allreduce::device_resident_blocks(devices[r]);
    sets[r]->peer_access_ = access;
  }
  CUDA_CHECK(cudaSetDevice(saved));
  return sets;
}

std::unique_ptr<PeerBuffers> PeerBuffers::create_ipc(Communicator& comm, size_t slot_elems) {
  const int world = comm.world(), me = comm.rank();
  std::unique_ptr<PeerBuffers> set(new PeerBuffers());
  set->device_ = comm.device();
  set->own_ = alloc_set(set->device_, world, slot_elems);
  cudaIpcMemHandle_t handle;
  CUDA_CHECK(cudaIpcGetMemHandle(&handle, set->own_));
  std::string mine(reinterpret_cast<const char*>(&handle), sizeof handle);
  const int32_t dev = set->device_;
  mine.append(reinterpret_cast<const char*>(&dev), sizeof dev);
  const auto all = comm.all_gather_bytes(mine);

  bool ok = true;
  std::vector<void*> bases(world, nullptr);
  bases[me] = set->own_;
  for (int r = 0; r < world && ok; ++r) {
    if (r == me) continue;
    cudaIpcMemHandle_t h;
    int32_t peer_dev = 0;
    std::memcpy(&h, all[r].data(), sizeof h);
    std::memcpy(&peer_dev, all[r].data() + sizeof h, sizeof peer_dev);
    if (peer_dev != set->device_) {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, set->device_, peer_dev) != cudaSuccess || !can) {
        cudaGetLastError();
        ok = false;
        break;
      }
    }
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      cudaGetLastError();
      ok = false;
      break;
    }
    set->ipc_opened_.push_back(p);
    bases[r] = p;
  }
  // Agree: the fused path must be taken by every rank or by none.
  const auto verdicts = comm.all_gather_bytes(ok ? "1" : "0");
  for (const auto& v : verdicts) ok = ok && v == "1";
  set->peer_access_ = ok;
  if (ok) {
    set->view_ = allreduce::make_rank_view(bases.data(), me, world, slot_elems);
    set->view_.resident_blocks = allreduce::device_resident_blocks(set->device_);
  }
  return set;
}

PeerBuffers::~PeerBuffers() {
  for (void* p : ipc_opened_) cudaIpcCloseMemHandle(p);
  if (own_) cudaFree(own_);
}

void PeerBuffers::check() const {
  const uint32_t e = allreduce::read_error(view_);
  if (e != 0)
    DS_THROW("one-shot all-reduce of rank {}/{} failed: {}; the buffer set is unusable", view_.rank, view_.world,
             allreduce::describe_error(e));
}

#else  // no CUDA

std::vector<std::unique_ptr<PeerBuffers>> PeerBuffers::create_simulated(int, size_t, int) {
  DS_THROW("PeerBuffers: deltaserve was built without CUDA");
}
std::vector<std::unique_ptr<PeerBuffers>> PeerBuffers::create_multi_device(const std::vector<int>&, size_t) {
  DS_THROW("PeerBuffers: deltaserve was built without CUDA");
}
std::unique_ptr<PeerBuffers> PeerBuffers::create_ipc(Communicator&, size_t) {
  DS_THROW("PeerBuffers: deltaserve was built without CUDA");
}
PeerBuffers::~PeerBuffers() = default;
void PeerBuffers::check() const {}

#endif

}  // namespace ds::parallel
