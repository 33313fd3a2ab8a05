// Engine interface helpers.
#include "runtime/engine.h"

#include <algorithm>

namespace ds {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kNone: break;
  }
  return "";
}

FinishReason finish_after(int32_t token, int generated, int64_t total_len, const SamplingParams& p,
                          const std::vector<int32_t>& eos, int64_t max_model_len) {
  auto contains = [](const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  if ((!p.ignore_eos && contains(eos, token)) || contains(p.stop_token_ids, token)) return FinishReason::kStop;
  if (generated >= p.max_tokens) return FinishReason::kLength;
  if (max_model_len > 0 && total_len >= max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

}  // namespace ds
