// NCCL communicator with a watchdog (see communicator.h). Every NCCL call on the communicator happens under
// one mutex, so the watchdog can abort it while the engine thread is between calls; the communicator is
// non-blocking, so no call holds that mutex for long.
#include "runtime/parallel/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "runtime/parallel/launcher.h"

#ifdef DELTASERVE_WITH_NCCL
#include <nccl.h>

#include "core/cuda_utils.h"
#endif

namespace ds::parallel {

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  return s;
}

std::string from_hex(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    DS_THROW("from_hex: '{}' is not a hex digit", c);
  };
  CHECK(hex.size() % 2 == 0, "from_hex: odd length {}", hex.size());
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return out;
}

#ifdef DELTASERVE_WITH_NCCL

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kI8: return ncclInt8;
    case DType::kU8: return ncclUint8;
    default: DS_THROW("NCCL: dtype {} has no NCCL type", dtype_name(t));
  }
}

// Restores the calling thread's current device on scope exit.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    CUDA_CHECK(cudaGetDevice(&saved_));
    if (saved_ != device) CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(saved_); }

 private:
  int saved_ = 0;
};

ncclConfig_t nonblocking_config() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

}  // namespace

bool nccl_available() { return true; }

std::string nccl_unique_id_hex() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) DS_THROW("ncclGetUniqueId failed: {} ({})", ncclGetErrorString(r), ncclGetLastError(nullptr));
  return to_hex(std::string(id.internal, sizeof id.internal));
}

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 0, device = 0;
  CommOptions opt;

  std::mutex comm_mu;  // every NCCL call on comm, and abort
  std::mutex mu;       // pending, free_events, failure
  struct Pending {
    cudaEvent_t event;
    Clock::time_point deadline;
    std::string what;
  };
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> free_events;
  std::string failure;
  std::atomic<bool> failed{false};

  // all_gather_bytes' stream and device buffer, kept between calls: a serving group exchanges every step.
  std::mutex bytes_mu;
  std::unique_ptr<CudaStream> bytes_stream;
  DeviceBuffer bytes_buf;

  std::thread watchdog;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;

  std::string where() const { return fmt::format("rank {}/{} (device {})", rank, world, device); }

  // Records the failure (the first one wins), aborts the communicator and tells the owner.
  void trip(const std::string& why) {
    if (failed.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      failure = fmt::format("NCCL communicator of {} aborted: {}", where(), why);
    }
    {
      std::lock_guard<std::mutex> lk(comm_mu);
      if (comm) ncclCommAbort(comm);
      comm = nullptr;
    }
    const std::string msg = failure_text();
    if (opt.on_failure)
      opt.on_failure(msg);
    else
      LOG_ERROR("{}", msg);
  }
  std::string failure_text() {
    std::lock_guard<std::mutex> lk(mu);
    return failure;
  }
  [[noreturn]] void throw_failure() { throw Error(failure_text()); }

  // Polls the communicator until it leaves ncclInProgress (bounded): after a non-blocking init, group end or
  // an enqueue that returned ncclInProgress.
  void wait_ready(const char* what, double timeout_s) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    for (int spin = 0;; ++spin) {
      ncclResult_t st = ncclSuccess;
      {
        std::lock_guard<std::mutex> lk(comm_mu);
        if (!comm) throw_failure();
        const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) st = r;
      }
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        trip(fmt::format("{} failed: {} ({})", what, ncclGetErrorString(st), ncclGetLastError(nullptr)));
        throw_failure();
      }
      if (Clock::now() > deadline) {
        trip(fmt::format("{} did not complete within {} s (did every rank start and join?)", what, timeout_s));
        throw_failure();
      }
      if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Runs one NCCL call under the mutex; ncclInProgress means "being enqueued": wait until it is.
  template <class F>
  void call(const char* what, F&& f) {
    if (failed) throw_failure();
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lk(comm_mu);
      if (!comm) throw_failure();
      r = f(comm);
    }
    if (r == ncclInProgress) {
      wait_ready(what, opt.timeout_s);
    } else if (r != ncclSuccess) {
      trip(fmt::format("{} failed: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
      throw_failure();
    }
  }

  void watch(cudaStream_t stream, const std::string& what) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return;  // a graph node, not a point in time
    DeviceScope scope(device);
    cudaEvent_t ev;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (free_events.empty()) {
        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      } else {
        ev = free_events.back();
        free_events.pop_back();
      }
    }
    CUDA_CHECK(cudaEventRecord(ev, stream));
    std::lock_guard<std::mutex> lk(mu);
    pending.push_back(Pending{ev, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(opt.timeout_s)),
                              what});
  }

  void watchdog_loop() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> sl(stop_mu);
    while (!stop_cv.wait_for(sl, std::chrono::duration<double>(opt.poll_s), [&] { return stop; })) {
      if (failed) continue;
      ncclResult_t st = ncclSuccess;
      {
        std::lock_guard<std::mutex> lk(comm_mu);
        if (comm && ncclCommGetAsyncError(comm, &st) != ncclSuccess) st = ncclInternalError;
      }
      if (st != ncclSuccess && st != ncclInProgress) {
        trip(fmt::format("NCCL reported an asynchronous error: {} ({}); a peer rank probably died",
                         ncclGetErrorString(st), ncclGetLastError(nullptr)));
        continue;
      }
      std::string late;
      {
        std::lock_guard<std::mutex> lk(mu);
        const auto now = Clock::now();
        for (size_t i = 0; i < pending.size();) {
          const cudaError_t q = cudaEventQuery(pending[i].event);
          if (q == cudaSuccess) {
            free_events.push_back(pending[i].event);
            pending[i] = pending.back();
            pending.pop_back();
            continue;
          }
          if (q != cudaErrorNotReady) {
            late = fmt::format("CUDA error while waiting for {}: {}", pending[i].what, cudaGetErrorString(q));
            break;
          }
          if (now > pending[i].deadline) {
            late = fmt::format("{} did not complete within {} s (a peer rank died or hung, or the ranks issued "
                               "different collectives)", pending[i].what, opt.timeout_s);
            break;
          }
          ++i;
        }
      }
      if (!late.empty()) trip(late);
    }
  }

  void start_watchdog() { watchdog = std::thread([this] { watchdog_loop(); }); }

  ~Impl() {
    if (watchdog.joinable()) {
      {
        std::lock_guard<std::mutex> lk(stop_mu);
        stop = true;
      }
      stop_cv.notify_all();
      watchdog.join();
    }
    std::lock_guard<std::mutex> lk(comm_mu);
    if (comm) {
      // Finalize flushes outstanding work; bounded, then abort (never hang in a destructor).
      ncclResult_t st = ncclCommFinalize(comm);
      if (st == ncclSuccess || st == ncclInProgress) {
        const auto deadline = Clock::now() + std::chrono::seconds(30);
        do {
          if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) st = ncclInternalError;
          if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        } while (st == ncclInProgress && Clock::now() < deadline);
      }
      if (st == ncclSuccess)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
      comm = nullptr;
    }
    for (auto& p : pending) cudaEventDestroy(p.event);
    for (auto e : free_events) cudaEventDestroy(e);
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::Communicator(const std::string& id_hex, int rank, int world, int device, CommOptions options)
    : impl_(std::make_unique<Impl>()) {
  CHECK(world >= 1 && rank >= 0 && rank < world, "Communicator: rank {} of {}", rank, world);
  const std::string id_bytes = from_hex(id_hex);
  ncclUniqueId id;
  CHECK(id_bytes.size() == sizeof id.internal, "Communicator: NCCL id of {} bytes, expected {}", id_bytes.size(),
        sizeof id.internal);
  std::copy(id_bytes.begin(), id_bytes.end(), id.internal);
  Impl& m = *impl_;
  m.rank = rank;
  m.world = world;
  m.device = device;
  m.opt = std::move(options);
  CUDA_CHECK(cudaSetDevice(device));
  ncclConfig_t cfg = nonblocking_config();
  const ncclResult_t r = ncclCommInitRankConfig(&m.comm, world, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    DS_THROW("ncclCommInitRankConfig failed on {}: {} ({})", m.where(), ncclGetErrorString(r), ncclGetLastError(nullptr));
  m.wait_ready("NCCL initialisation", m.opt.init_timeout_s);
  m.start_watchdog();
}

std::unique_ptr<Communicator> Communicator::from_rank_env(const RankEnv& env, CommOptions options,
                                                          double rendezvous_timeout_s) {
  CHECK(!env.rendezvous.empty(), "Communicator: the rank environment names no rendezvous file");
  std::string id;
  if (env.rank == 0) {
    id = nccl_unique_id_hex();
    publish_rendezvous(env.rendezvous, id);
  } else {
    id = wait_rendezvous(env.rendezvous, rendezvous_timeout_s);
  }
  return std::make_unique<Communicator>(id, env.rank, env.world, env.device, std::move(options));
}

std::vector<std::unique_ptr<Communicator>> Communicator::create_local(const std::vector<int>& devices,
                                                                      CommOptions options) {
  const int n = static_cast<int>(devices.size());
  CHECK(n >= 1, "Communicator::create_local: no devices");
  ncclUniqueId id;
  const ncclResult_t rid = ncclGetUniqueId(&id);
  if (rid != ncclSuccess) DS_THROW("ncclGetUniqueId failed: {}", ncclGetErrorString(rid));
  std::vector<std::unique_ptr<Impl>> impls;
  for (int i = 0; i < n; ++i) {
    auto m = std::make_unique<Impl>();
    m->rank = i;
    m->world = n;
    m->device = devices[i];
    m->opt = options;
    impls.push_back(std::move(m));
  }
  int saved = 0;
  CUDA_CHECK(cudaGetDevice(&saved));
  ncclGroupStart();
  for (int i = 0; i < n; ++i) {
    CUDA_CHECK(cudaSetDevice(devices[i]));
    ncclConfig_t cfg = nonblocking_config();
    const ncclResult_t r = ncclCommInitRankConfig(&impls[i]->comm, n, id, i, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      DS_THROW("ncclCommInitRankConfig failed for device {}: {}", devices[i], ncclGetErrorString(r));
    }
  }
  const ncclResult_t rg = ncclGroupEnd();
  CUDA_CHECK(cudaSetDevice(saved));
  if (rg != ncclSuccess && rg != ncclInProgress) DS_THROW("NCCL group initialisation failed: {}", ncclGetErrorString(rg));
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& m : impls) {
    m->wait_ready("NCCL initialisation", options.init_timeout_s);
    m->start_watchdog();
    out.push_back(std::unique_ptr<Communicator>(new Communicator(std::move(m))));
  }
  return out;
}

Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::world() const { return impl_->world; }
int Communicator::device() const { return impl_->device; }

void Communicator::all_reduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  const ncclDataType_t t = nccl_type(dtype);
  impl_->call("ncclAllReduce", [&](ncclComm_t c) { return ncclAllReduce(in, out, count, t, ncclSum, c, stream); });
  impl_->watch(stream, fmt::format("all-reduce of {} x {}", count, dtype_name(dtype)));
}

void Communicator::broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) {
  CHECK(root >= 0 && root < impl_->world, "broadcast: root {} of {} ranks", root, impl_->world);
  const ncclDataType_t t = nccl_type(dtype);
  impl_->call("ncclBroadcast", [&](ncclComm_t c) { return ncclBroadcast(in, out, count, t, root, c, stream); });
  impl_->watch(stream, fmt::format("broadcast of {} x {} from rank {}", count, dtype_name(dtype), root));
}

void Communicator::all_gather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  const ncclDataType_t t = nccl_type(dtype);
  impl_->call("ncclAllGather", [&](ncclComm_t c) { return ncclAllGather(in, out, count, t, c, stream); });
  impl_->watch(stream, fmt::format("all-gather of {} x {}", count, dtype_name(dtype)));
}

void Communicator::all_to_all(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  std::vector<size_t> counts(impl_->world, count), offsets(impl_->world);
  for (int p = 0; p < impl_->world; ++p) offsets[p] = p * count;
  all_to_allv(in, counts, offsets, out, counts, offsets, dtype, stream);
}

void Communicator::all_to_allv(const void* in, const std::vector<size_t>& send_counts,
                               const std::vector<size_t>& send_offsets, void* out,
                               const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_offsets,
                               DType dtype, cudaStream_t stream) {
  const size_t W = static_cast<size_t>(impl_->world);
  CHECK(send_counts.size() == W && send_offsets.size() == W && recv_counts.size() == W && recv_offsets.size() == W,
        "all_to_allv: counts and offsets need one entry per rank ({})", W);
  const ncclDataType_t t = nccl_type(dtype);
  const size_t es = dtype_size(dtype);
  impl_->call("all-to-all (grouped send/recv)", [&](ncclComm_t c) {
    ncclResult_t r = ncclGroupStart();
    for (size_t p = 0; p < W && r == ncclSuccess; ++p) {
      if (send_counts[p])
        r = ncclSend(static_cast<const char*>(in) + send_offsets[p] * es, send_counts[p], t, static_cast<int>(p), c, stream);
      if (r == ncclSuccess && recv_counts[p])
        r = ncclRecv(static_cast<char*>(out) + recv_offsets[p] * es, recv_counts[p], t, static_cast<int>(p), c, stream);
    }
    const ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
  });
  impl_->watch(stream, fmt::format("all-to-all of {}", dtype_name(dtype)));
}

std::vector<std::string> Communicator::all_gather_bytes(const std::string& mine) {
  const size_t n = mine.size();
  const int W = impl_->world;
  DeviceScope scope(impl_->device);
  std::lock_guard<std::mutex> lk(impl_->bytes_mu);
  if (!impl_->bytes_stream) impl_->bytes_stream = std::make_unique<CudaStream>();
  if (impl_->bytes_buf.bytes() < n * (W + 1)) impl_->bytes_buf.reset(std::max<size_t>(n * (W + 1), 64 << 10));
  const CudaStream& s = *impl_->bytes_stream;
  char* buf = impl_->bytes_buf.get<char>();
  CUDA_CHECK(cudaMemcpyAsync(buf + n * W, mine.data(), n, cudaMemcpyHostToDevice, s.get()));
  all_gather(buf + n * W, buf, n, DType::kU8, s.get());
  std::string all(n * W, '\0');
  CUDA_CHECK(cudaMemcpyAsync(all.data(), buf, n * W, cudaMemcpyDeviceToHost, s.get()));
  s.sync();  // bounded: the watchdog aborts the communicator (and so the all-gather) after timeout_s
  check();
  std::vector<std::string> out;
  for (int r = 0; r < W; ++r) out.push_back(all.substr(r * n, n));
  return out;
}

void Communicator::sum(void* data, size_t count, DType dtype, cudaStream_t stream) {
  all_reduce(data, data, count, dtype, stream);
}

void Communicator::watch(cudaStream_t stream, const std::string& what) { impl_->watch(stream, what); }

void Communicator::check() const {
  if (impl_->failed) throw Error(impl_->failure_text());
}
bool Communicator::failed() const { return impl_->failed; }
void Communicator::abort(const std::string& why) { impl_->trip(why); }

void Communicator::group(const std::vector<Communicator*>& comms, const std::function<void()>& fn) {
  const ncclResult_t r0 = ncclGroupStart();
  if (r0 != ncclSuccess) DS_THROW("ncclGroupStart failed: {}", ncclGetErrorString(r0));
  try {
    fn();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  const ncclResult_t r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) DS_THROW("ncclGroupEnd failed: {}", ncclGetErrorString(r));
  for (auto* c : comms) c->impl_->wait_ready("grouped collectives", c->impl_->opt.timeout_s);
}

#else  // built without NCCL

bool nccl_available() { return false; }
std::string nccl_unique_id_hex() { DS_THROW("deltaserve was built without NCCL (DELTASERVE_NCCL=OFF)"); }

struct Communicator::Impl {};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::Communicator(const std::string&, int, int, int, CommOptions) {
  DS_THROW("Communicator: deltaserve was built without NCCL (DELTASERVE_NCCL=OFF)");
}
std::unique_ptr<Communicator> Communicator::from_rank_env(const RankEnv&, CommOptions, double) {
  DS_THROW("Communicator: deltaserve was built without NCCL (DELTASERVE_NCCL=OFF)");
}
std::vector<std::unique_ptr<Communicator>> Communicator::create_local(const std::vector<int>&, CommOptions) {
  DS_THROW("Communicator: deltaserve was built without NCCL (DELTASERVE_NCCL=OFF)");
}
Communicator::~Communicator() = default;
int Communicator::rank() const { return 0; }
int Communicator::world() const { return 1; }
int Communicator::device() const { return 0; }
void Communicator::all_reduce(const void*, void*, size_t, DType, cudaStream_t) {}
void Communicator::broadcast(const void*, void*, size_t, DType, int, cudaStream_t) {}
void Communicator::all_gather(const void*, void*, size_t, DType, cudaStream_t) {}
void Communicator::all_to_all(const void*, void*, size_t, DType, cudaStream_t) {}
void Communicator::all_to_allv(const void*, const std::vector<size_t>&, const std::vector<size_t>&, void*,
                               const std::vector<size_t>&, const std::vector<size_t>&, DType, cudaStream_t) {}
std::vector<std::string> Communicator::all_gather_bytes(const std::string& mine) { return {mine}; }
void Communicator::sum(void*, size_t, DType, cudaStream_t) {}
void Communicator::watch(cudaStream_t, const std::string&) {}
void Communicator::check() const {}
bool Communicator::failed() const { return false; }
void Communicator::abort(const std::string&) {}
void Communicator::group(const std::vector<Communicator*>&, const std::function<void()>& fn) { fn(); }

#endif

}  // namespace ds::parallel
