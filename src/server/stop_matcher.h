// Stop strings on streamed text: finds them across token boundaries and never emits any part of one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::server {

// Text arrives in pieces (one per token). Text that could be the start of a stop string is held back until
// it is known not to be; when a stop string completes, everything before it is released and the rest (the
// stop string and anything after it) is dropped, as OpenAI does.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends the text that is safe to send to out. Returns true when a stop string matched (then the stream
  // is over: push must not be called again).
  bool push(std::string_view text, std::string& out);
  // End of generation without a stop string: releases the held-back text.
  void finish(std::string& out);
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // unsent text: a suffix that is a proper prefix of some stop string
  size_t max_len_ = 0;
  bool stopped_ = false;
};

}  // namespace ds::server
