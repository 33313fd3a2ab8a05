// Simulated ranks (see simulated_group.h): host barrier, byte exchange, and device collectives between streams
// of one device ordered by events.
#include "runtime/parallel/simulated_group.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "core/error.h"
#include "runtime/parallel/peer_buffers.h"
#include "runtime/parallel/tp_finalize.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace ds::parallel {

namespace {

// What one rank publishes for a device collective.
struct Posted {
  const void* in = nullptr;
  std::vector<size_t> send_bytes, send_offsets;  // all_to_allv
};

struct Shared {
  SimulatedOptions o;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool failed = false;
  std::string failure;
  std::vector<std::string> slots;
  std::vector<Posted> posted;
#ifdef DELTASERVE_WITH_CUDA
  std::vector<cudaEvent_t> ready, done;  // per rank: its data is ready / it finished reading its peers
#endif
  std::vector<std::unique_ptr<PeerBuffers>> peers;
  // Collectives each rank has issued (all_reduce_sum, broadcast, all_gather, all_to_allv): named in errors, so
  // a failure shows whether the ranks' call sequences diverged.
  std::vector<std::array<std::atomic<uint64_t>, 4>> calls;

  explicit Shared(const SimulatedOptions& opt) : o(opt), slots(opt.world), posted(opt.world), calls(opt.world) {}

  std::string call_counts() const {
    std::string out = "collectives issued per rank (all_reduce_sum/broadcast/all_gather/all_to_allv):";
    for (size_t r = 0; r < calls.size(); ++r)
      out += fmt::format(" rank {} {}/{}/{}/{}", r, calls[r][0].load(), calls[r][1].load(), calls[r][2].load(),
                         calls[r][3].load());
    return out;
  }
  ~Shared() {
#ifdef DELTASERVE_WITH_CUDA
    for (auto e : ready) cudaEventDestroy(e);
    for (auto e : done) cudaEventDestroy(e);
#endif
  }

  void barrier(int rank, const char* what) {
    std::unique_lock<std::mutex> lk(mu);
    if (failed) throw Error(failure);
    const uint64_t gen = generation;
    if (++arrived == o.world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const bool ok = cv.wait_for(lk, std::chrono::duration<double>(o.timeout_s),
                                [&] { return generation != gen || failed; });
    if (failed) throw Error(failure);
    if (!ok) {
      failed = true;
      failure = fmt::format("simulated group: rank {} waited {} s at {} for the other ranks (a rank stopped or the "
                            "ranks issued different collectives); {}", rank, o.timeout_s, what, call_counts());
      cv.notify_all();
      throw Error(failure);
    }
  }
};

class SimulatedGroup final : public Group {
 public:
  SimulatedGroup(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {
    if (!s_->peers.empty()) sum_ = std::make_unique<PeerAllReduce>(s_->peers[rank_]->view());
  }
  int rank() const override { return rank_; }
  int world() const override { return s_->o.world; }
  Mode mode() const override { return s_->o.mode; }
  std::string name() const override { return "simulated (one GPU)"; }

  void all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream) override {
    CHECK(sum_, "simulated group: no peer buffers (SimulatedOptions::sum_elems = 0)");
    CHECK(count <= s_->peers[rank_]->view().slot_elems,
          "simulated group: all_reduce_sum of {} elements exceeds the buffers' {} (SimulatedOptions::sum_elems)",
          count, s_->peers[rank_]->view().slot_elems);
    ++s_->calls[rank_][0];
    run_spinning(stream, [&] { sum_->sum(data, count, dtype, stream); });
  }

  void broadcast(void* data, size_t bytes, int root, cudaStream_t stream) override {
    ++s_->calls[rank_][1];
    Posted p;
    p.in = data;
    exchange_device(p, stream, "broadcast", [&](const std::vector<Posted>& all) {
      if (rank_ != root && bytes > 0) copy(data, all[root].in, bytes, stream);
    });
  }

  void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) override {
    ++s_->calls[rank_][2];
    Posted p;
    p.in = in;
    exchange_device(p, stream, "all_gather", [&](const std::vector<Posted>& all) {
      for (int r = 0; r < world(); ++r)
        if (bytes > 0) copy(static_cast<char*>(out) + r * bytes, all[r].in, bytes, stream);
    });
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_offsets,
                   void* out, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets,
                   cudaStream_t stream) override {
    ++s_->calls[rank_][3];
    const size_t W = static_cast<size_t>(world());
    CHECK(send_bytes.size() == W && send_offsets.size() == W && recv_bytes.size() == W && recv_offsets.size() == W,
          "all_to_allv: counts and offsets need one entry per rank ({})", W);
    Posted p;
    p.in = in;
    p.send_bytes = send_bytes;
    p.send_offsets = send_offsets;
    exchange_device(p, stream, "all_to_allv", [&](const std::vector<Posted>& all) {
      for (size_t r = 0; r < W; ++r) {
        const size_t n = all[r].send_bytes[rank_];
        CHECK(n == recv_bytes[r], "all_to_allv: rank {} sends {} bytes to rank {}, which expects {}", r, n, rank_,
              recv_bytes[r]);
        if (n > 0)
          copy(static_cast<char*>(out) + recv_offsets[r], static_cast<const char*>(all[r].in) + all[r].send_offsets[rank_],
               n, stream);
      }
    });
  }

  const allreduce::RankView* peer_view() const override {
    return s_->peers.empty() ? nullptr : &s_->peers[rank_]->view();
  }
  bool peer_access() const override { return !s_->peers.empty() && s_->peers[rank_]->peer_access(); }
  void run_spinning(cudaStream_t stream, const std::function<void()>& launch) override {
#ifdef DELTASERVE_WITH_CUDA
    // Under capture nothing runs yet; every rank captures at the same step, and the graphs replay in step.
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) return launch();
#else
    (void)stream;
#endif
    s_->barrier(rank_, "a spinning all-reduce (before the launch)");
    launch();
    s_->barrier(rank_, "a spinning all-reduce (after the launch)");
  }
  void bind_stream(cudaStream_t stream) override {
    if (!s_->peers.empty()) s_->peers[rank_]->bind_stream(stream);
  }

  std::vector<std::string> exchange(const std::string& mine) override {
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->slots[rank_] = mine;
    }
    s_->barrier(rank_, "exchange");
    std::vector<std::string> all;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      all = s_->slots;
    }
    s_->barrier(rank_, "exchange (read)");  // nobody overwrites a slot before every rank read it
    return all;
  }

  void check() const override {
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      if (s_->failed) throw Error(s_->failure);
    }
    // A one-shot all-reduce that timed out waiting for a peer wrote NaN sums: make it an error, not logits.
    if (s_->peers.empty()) return;
    try {
      s_->peers[rank_]->check();
    } catch (const Error& e) {
      throw Error(fmt::format("{}; {}; {}", e.what(), s_->call_counts(), protocol_states()));
    }
  }

 private:
  // Every rank's protocol state after a failure: equal epochs mean some rank's kernel never ran (or never
  // arrived), different epochs that the ranks' calls fell out of step. Plain and fused calls both count.
  std::string protocol_states() const {
    std::string out = "protocol state per rank (epoch/arrived/error):";
    for (size_t r = 0; r < s_->peers.size(); ++r) {
      try {
        const allreduce::ArState st = allreduce::read_state(s_->peers[r]->view());
        out += fmt::format(" rank {} {}/{}/{:#x}", r, st.epoch, st.arrived, st.error);
      } catch (const Error&) {
        out += fmt::format(" rank {} unreadable", r);
      }
    }
    return out;
  }

  // Publishes p, waits until every rank's data is ready (stream-ordered), runs `reads` on this rank's stream, and
  // keeps this rank's stream from running ahead of the peers still reading its data.
  template <class F>
  void exchange_device(const Posted& p, cudaStream_t stream, const char* what, F&& reads) {
#ifdef DELTASERVE_WITH_CUDA
    CHECK(s_->o.device >= 0, "simulated group: {} on a host-only group", what);
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->posted[rank_] = p;
    }
    CUDA_CHECK(cudaEventRecord(s_->ready[rank_], stream));
    s_->barrier(rank_, what);
    std::vector<Posted> all;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      all = s_->posted;
    }
    for (int r = 0; r < world(); ++r)
      if (r != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream, s_->ready[r], 0));
    reads(all);
    CUDA_CHECK(cudaEventRecord(s_->done[rank_], stream));
    s_->barrier(rank_, what);
    for (int r = 0; r < world(); ++r)
      if (r != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream, s_->done[r], 0));
    // The events are re-recorded by the next collective only after its first barrier, which every rank reaches
    // after its waits above were enqueued (a wait binds to the record that precedes it).
    s_->barrier(rank_, what);
#else
    (void)p, (void)stream, (void)reads;
    DS_THROW("simulated group: {} needs a CUDA build", what);
#endif
  }

  static void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
#ifdef DELTASERVE_WITH_CUDA
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
#else
    (void)dst, (void)src, (void)bytes, (void)stream;
#endif
  }

  std::shared_ptr<Shared> s_;
  int rank_;
  std::unique_ptr<PeerAllReduce> sum_;
};

}  // namespace

std::vector<std::shared_ptr<Group>> create_simulated_groups(const SimulatedOptions& o) {
  CHECK(o.world >= 2, "simulated group: world {} (a group of one is never built: pass nullptr)", o.world);
  auto s = std::make_shared<Shared>(o);
  if (o.device >= 0) {
#ifdef DELTASERVE_WITH_CUDA
    CUDA_CHECK(cudaSetDevice(o.device));
    s->ready.resize(o.world);
    s->done.resize(o.world);
    for (int r = 0; r < o.world; ++r) {
      CUDA_CHECK(cudaEventCreateWithFlags(&s->ready[r], cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&s->done[r], cudaEventDisableTiming));
    }
    if (o.sum_elems > 0) {
      // The protocol sums whole 16-byte vectors: round the capacity up to 8 half elements.
      s->peers = PeerBuffers::create_simulated(o.world, (o.sum_elems + 7) / 8 * 8, o.device);
    }
#else
    DS_THROW("simulated group on device {}: this build has no CUDA support", o.device);
#endif
  }
  std::vector<std::shared_ptr<Group>> out;
  for (int r = 0; r < o.world; ++r) out.push_back(std::make_shared<SimulatedGroup>(s, r));
  return out;
}

}  // namespace ds::parallel
