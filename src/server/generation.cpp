// Tokens -> text with stop strings (see generation.h).
#include "server/generation.h"

namespace ds::server {

Generation::Generation(const Tokenizer& tok, std::vector<std::string> stop, Clock::time_point arrival)
    : decoder_(tok, /*skip_special=*/true), stops_(std::move(stop)), arrival_(arrival) {}

Generation::Step Generation::consume(RequestStream::Update u) {
  Step st;
  if (finished_) {
    st.finished = true;
    return st;
  }
  if (!u.tokens.empty()) {
    const auto now = Clock::now();
    if (completion_tokens_ == 0) first_token_ = now;
    last_token_ = now;
  }
  for (int32_t tok : u.tokens) {
    ++completion_tokens_;
    if (stops_.push(decoder_.push(tok), st.text)) {
      // Tokens after the stop string in the same update were generated but are not part of the answer;
      // usage counts what the engine generated up to and including the token that completed the stop.
      finished_ = st.finished = st.stop_string = true;
      st.finish_reason = "stop";
      return st;
    }
  }
  if (!u.finished) return st;
  finished_ = st.finished = true;
  if (!u.error.empty() || u.reason == FinishReason::kCancelled) {
    // Only the server cancels a request whose client is still listening: at shutdown.
    st.error = u.error.empty() ? "request cancelled: the server is shutting down" : u.error;
    st.error_is_client = u.error_is_client;
    return st;
  }
  if (!stops_.push(decoder_.flush(), st.text)) stops_.finish(st.text);
  // A stop string can only complete here if the flushed tail (U+FFFD) completes it.
  st.stop_string = stops_.stopped();
  st.finish_reason = (u.reason == FinishReason::kLength && !st.stop_string) ? "length" : "stop";
  return st;
}

double Generation::ttft_seconds() const {
  return std::chrono::duration<double>(first_token_ - arrival_).count();
}

double Generation::tpot_seconds() const {
  if (completion_tokens_ < 2) return 0;
  return std::chrono::duration<double>(last_token_ - first_token_).count() / (completion_tokens_ - 1);
}

double Generation::e2e_seconds() const {
  return std::chrono::duration<double>(last_token_ - arrival_).count();
}

}  // namespace ds::server
