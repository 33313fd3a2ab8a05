// Stop strings on streamed text (see stop_matcher.h).
#include "server/stop_matcher.h"

#include <algorithm>

namespace ds::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

bool StopMatcher::push(std::string_view text, std::string& out) {
  if (stopped_) return true;
  if (stops_.empty()) {
    out += text;
    return false;
  }
  held_ += text;
  // The earliest stop occurrence wins (the held text never contains a complete one, so searching it all is
  // cheap: it is at most max_len - 1 bytes plus the new piece).
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, held_.find(s));
  if (best != std::string::npos) {
    out.append(held_, 0, best);
    held_.clear();
    stopped_ = true;
    return true;
  }
  // Keep the longest suffix that is a proper prefix of a stop string; send the rest.
  size_t keep = 0;
  for (size_t len = std::min(held_.size(), max_len_ - 1); len > 0; --len) {
    std::string_view suffix(held_.data() + held_.size() - len, len);
    if (std::any_of(stops_.begin(), stops_.end(),
                    [&](const std::string& s) { return s.starts_with(suffix); })) {
      keep = len;
      break;
    }
  }
  out.append(held_, 0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return false;
}

void StopMatcher::finish(std::string& out) {
  if (!stopped_) out += held_;
  held_.clear();
}

}  // namespace ds::server
