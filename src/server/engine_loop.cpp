// The engine thread and the per-request streams (see engine_loop.h).
#include "server/engine_loop.h"

#include <algorithm>

#include "core/log.h"

namespace ds::server {

RequestStream::Update RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.tokens.empty() || pending_.finished; });
  Update u = std::move(pending_);
  pending_ = Update{};
  return u;
}

void RequestStream::deliver(const std::vector<int32_t>& tokens, bool finished, FinishReason reason) {
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    pending_.tokens.insert(pending_.tokens.end(), tokens.begin(), tokens.end());
    if (finished) {
      pending_.finished = true;
      pending_.reason = reason;
      done_ = true;
    }
  }
  cv_.notify_all();
}

void RequestStream::fail(std::string error, bool client_error) {
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    pending_.finished = true;
    pending_.error = std::move(error);
    pending_.error_is_client = client_error;
    done_ = true;
  }
  cv_.notify_all();
}

EngineLoop::EngineLoop(Engine& engine, EngineLoopOptions options) : engine_(engine), options_(options) {
  stats_ = engine_.stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

std::shared_ptr<RequestStream> EngineLoop::submit(Request request) {
  auto s = std::make_shared<RequestStream>();
  {
    std::lock_guard lk(mu_);
    if (stopping_ || in_flight_ >= options_.max_in_flight) return nullptr;
    ++in_flight_;
    incoming_.emplace_back(std::move(request), s);
  }
  cv_.notify_one();
  return s;
}

void EngineLoop::cancel(const std::shared_ptr<RequestStream>& stream) {
  if (!stream) return;
  {
    std::lock_guard lk(mu_);
    if (stream->cancel_requested_) return;
    stream->cancel_requested_ = true;
    cancels_.push_back(stream);
  }
  cv_.notify_one();
}

void EngineLoop::cancel_all() {
  {
    std::lock_guard lk(mu_);
    cancel_all_ = true;  // active_ belongs to the engine thread: it does the cancelling
  }
  cv_.notify_one();
}

int EngineLoop::in_flight() const {
  std::lock_guard lk(mu_);
  return in_flight_;
}

EngineStats EngineLoop::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

StepTimes EngineLoop::step_times() const {
  std::lock_guard lk(mu_);
  return step_times_;
}

bool EngineLoop::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return idle_cv_.wait_for(lk, timeout, [&] { return in_flight_ == 0; });
}

void EngineLoop::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::publish_stats() {
  EngineStats st = engine_.stats();
  std::lock_guard lk(mu_);
  stats_ = st;
}

void EngineLoop::finish_stream(RequestId id) {
  active_.erase(id);
  std::lock_guard lk(mu_);
  --in_flight_;
  if (in_flight_ == 0) idle_cv_.notify_all();
}

void EngineLoop::run() {
  for (;;) {
    std::vector<std::pair<Request, std::shared_ptr<RequestStream>>> incoming;
    std::vector<std::shared_ptr<RequestStream>> cancels;
    bool cancel_all = false;
    {
      std::unique_lock lk(mu_);
      const bool busy = engine_.has_work();
      auto ready = [&] { return stopping_ || busy || cancel_all_ || !incoming_.empty() || !cancels_.empty(); };
      if (options_.idle_tick && options_.idle_period.count() > 0) {
        if (!cv_.wait_for(lk, options_.idle_period, ready)) {
          lk.unlock();
          try {
            options_.idle_tick();
          } catch (const std::exception& e) {
            LOG_ERROR("engine idle tick failed: {}", e.what());
          }
          continue;
        }
      } else {
        cv_.wait(lk, ready);
      }
      if (stopping_) break;
      incoming.swap(incoming_);
      cancels.swap(cancels_);
      cancel_all = cancel_all_;
      cancel_all_ = false;
    }
    for (auto& [req, s] : incoming) {
      try {
        RequestId id = engine_.add_request(std::move(req));
        s->id_ = id;
        active_.emplace(id, s);
      } catch (const std::exception& e) {  // the engine's validation: a client error (HTTP 400)
        s->fail(e.what(), /*client_error=*/true);
        std::lock_guard lk(mu_);
        if (--in_flight_ == 0) idle_cv_.notify_all();
      }
    }
    if (cancel_all)
      for (auto& [id, s] : active_) cancels.push_back(s);
    for (auto& s : cancels)
      if (s->id_ != 0 && active_.count(s->id_)) engine_.cancel(s->id_);
    if (engine_.has_work()) {
      std::vector<RequestOutput> outs;
      bool stepped = false;
      const auto t_step = std::chrono::steady_clock::now();
      try {
        outs = engine_.step();
        stepped = true;
      } catch (const std::exception& e) {
        // An engine failure must not take the server down: fail what was running and keep serving.
        LOG_ERROR("engine step failed: {}; failing {} request(s)", e.what(), active_.size());
        std::vector<RequestId> ids;
        for (auto& [id, s] : active_) {
          s->fail(std::string("internal engine error: ") + e.what(), /*client_error=*/false);
          ids.push_back(id);
          try {
            engine_.cancel(id);  // frees the slot; the engine reports it later, to no one
          } catch (const std::exception&) {
          }
        }
        for (RequestId id : ids) finish_stream(id);
      }
      const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
      int64_t decode_tokens = 0;  // tokens after their request's first: see StepTimes
      for (const auto& o : outs) {
        auto it = active_.find(o.id);
        if (it == active_.end() || !o.error.empty()) continue;
        const auto n = static_cast<int64_t>(o.new_tokens.size());
        decode_tokens += it->second->generated_ > 0 ? n : std::max<int64_t>(0, n - 1);
        it->second->generated_ += n;
      }
      if (stepped) {
        std::lock_guard lk(mu_);
        StepTimes& st = step_times_;
        (decode_tokens > 0 ? st.decode_steps : st.prefill_steps) += 1;
        (decode_tokens > 0 ? st.decode_seconds : st.prefill_seconds) += step_s;
        st.decode_tokens += decode_tokens;
        st.decode_token_seconds += step_s * static_cast<double>(decode_tokens);
      }
      publish_stats();  // before delivering: a client that saw its request end sees its slot free too
      for (const auto& o : outs) {
        auto it = active_.find(o.id);
        if (it == active_.end()) continue;
        if (!o.error.empty()) {  // refused after it was accepted (a DEP worker rank): a client error as well
          it->second->fail(o.error, /*client_error=*/true);
          finish_stream(o.id);
          continue;
        }
        it->second->deliver(o.new_tokens, o.finished, o.reason);
        if (o.finished) finish_stream(o.id);
      }
    }
    publish_stats();
  }
  // Shutting down: whatever is still in flight ends with an error the handlers turn into 503.
  for (auto& [id, s] : active_) {
    engine_.cancel(id);
    s->fail("server shutting down", /*client_error=*/false);
  }
  active_.clear();
  std::lock_guard lk(mu_);
  for (auto& [req, s] : incoming_) s->fail("server shutting down", /*client_error=*/false);
  incoming_.clear();
  in_flight_ = 0;
  idle_cv_.notify_all();
}

}  // namespace ds::server
