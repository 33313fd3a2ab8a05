// A host-only parallel::Group for tests: ranks are threads of one process, exchange() is an in-process
// all-gather with a bounded wait (a rank that never arrives is an error naming it, never a hang). The device
// collectives are not available (the CPU engines that stand in for the CUDA engine do not call them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/parallel/group.h"

namespace ds::test {

class ThreadGroupHub {
 public:
  ThreadGroupHub(int world, parallel::Mode mode, double timeout_s = 20)
      : world_(world), mode_(mode), timeout_s_(timeout_s), slots_(world), arrived_(world, false) {}

  int world() const { return world_; }
  parallel::Mode mode() const { return mode_; }

  std::vector<std::string> exchange(int rank, const std::string& mine) {
    std::unique_lock lk(mu_);
    if (aborted_) throw Error(reason_);
    const uint64_t round = round_;
    slots_[rank] = mine;
    arrived_[rank] = true;
    if (++count_ == world_) {
      result_ = slots_;
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++round_;
      cv_.notify_all();
      return result_;
    }
    const bool done = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s_),
                                   [&] { return round_ != round || aborted_; });
    if (round_ != round) return result_;  // the round completed (maybe just before an abort)
    if (!done) {
      std::string missing;
      for (int r = 0; r < world_; ++r)
        if (!arrived_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      aborted_ = true;
      reason_ = "exchange timed out after " + std::to_string(timeout_s_) + " s waiting for rank(s) " + missing;
      cv_.notify_all();
    }
    throw Error(reason_);
  }
  // What the launcher does when a rank process ends: every pending and later exchange fails at once.
  void abort(const std::string& why) {
    std::lock_guard lk(mu_);
    if (!aborted_) reason_ = why;
    aborted_ = true;
    cv_.notify_all();
  }
  int64_t rounds() const {
    std::lock_guard lk(mu_);
    return static_cast<int64_t>(round_);
  }

 private:
  const int world_;
  const parallel::Mode mode_;
  const double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  std::vector<bool> arrived_;
  int count_ = 0;
  uint64_t round_ = 0;
  bool aborted_ = false;
  std::string reason_;
};

class ThreadGroup final : public parallel::Group {
 public:
  ThreadGroup(std::shared_ptr<ThreadGroupHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return hub_->world(); }
  parallel::Mode mode() const override { return hub_->mode(); }
  std::string name() const override { return "threads (host test group)"; }
  void all_reduce_sum(void*, size_t, DType, cudaStream_t) override { unsupported("all_reduce_sum"); }
  void broadcast(void*, size_t, int, cudaStream_t) override { unsupported("broadcast"); }
  void all_gather(const void*, void*, size_t, cudaStream_t) override { unsupported("all_gather"); }
  void all_to_allv(const void*, const std::vector<size_t>&, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&, const std::vector<size_t>&, cudaStream_t) override {
    unsupported("all_to_allv");
  }
  std::vector<std::string> exchange(const std::string& mine) override { return hub_->exchange(rank_, mine); }

 private:
  [[noreturn]] static void unsupported(const char* what) {
    throw Error(std::string("the host test group has no device collectives (") + what + ")");
  }
  std::shared_ptr<ThreadGroupHub> hub_;
  int rank_;
};

}  // namespace ds::test
