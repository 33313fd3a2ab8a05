// The text side of one generation: tokens -> UTF-8 text (specials skipped), stop strings, counts, timing.
// Shared by the streaming and non-streaming paths so both give the same text and finish reason.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "server/engine_loop.h"
#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

using Clock = std::chrono::steady_clock;

class Generation {
 public:
  Generation(const Tokenizer& tok, std::vector<std::string> stop, Clock::time_point arrival);

  struct Step {
    std::string text;           // new text to send (may be empty)
    bool finished = false;      // nothing more will come
    std::string finish_reason;  // "stop" | "length" once finished ("" for an error)
    bool stop_string = false;   // finished because a stop string matched: the caller cancels the request
    std::string error;          // the engine refused or failed the request
    bool error_is_client = false;
  };
  // Folds one update from the engine thread into text.
  Step consume(RequestStream::Update update);

  int completion_tokens() const { return completion_tokens_; }
  bool has_first_token() const { return completion_tokens_ > 0; }
  double ttft_seconds() const;
  // (last - first) / (tokens - 1); 0 with fewer than two tokens.
  double tpot_seconds() const;
  double e2e_seconds() const;

 private:
  StreamDecoder decoder_;
  StopMatcher stops_;
  Clock::time_point arrival_, first_token_, last_token_;
  int completion_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace ds::server
