// Op ablation for benchmarks (bench-engine --ablate): a step run with some ops' launches skipped. The outputs are
// wrong; the full step's decode time minus this one's is what those ops cost inside the replayed CUDA graph,
// where the eager per-op profile (--breakdown) overstates small kernels by their launch gaps. Only ops whose
// skipping leaves every later launch memory-safe are accepted: whatever stale or uninitialised values they leave
// behind, the sampler still returns in-range ids (NaN never wins; all-invalid rows give the argmax), and the
// embedding, sampling and metadata copies themselves are never skipped. Routing ids always come from a top-k
// over E experts, so they stay in range too.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace ds {

// Op names as CudaForward's op() calls them, and the categories (every op of the category).
inline const std::vector<std::string>& ablatable_ops() {
  static const std::vector<std::string> v = {
      "input_norm",   "post_attention_norm", "final_norm",      "gather_sampled", "kda.proj",    "kda.f_b_g_b",
      "kda.decode",   "kda.o_proj",          "mla.fused_a",     "mla.cache_write", "mla.decode", "mla.o_proj",
      "moe",          "ffn.gate_up",         "ffn.silu_mul",    "ffn.down",        "lm_head",    "gemm",
      "kda",          "mla"};
  return v;
}

// Why the list cannot be used (an unknown name), or nullopt.
inline std::optional<std::string> ablation_problem(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (std::find(ablatable_ops().begin(), ablatable_ops().end(), n) == ablatable_ops().end()) {
      std::string known;
      for (const std::string& k : ablatable_ops()) known += (known.empty() ? "" : ", ") + k;
      return "ablate: '" + n + "' is not an op that can be skipped safely (known: " + known + ")";
    }
  return std::nullopt;
}

// Whether op `name` of category `category` ("gemm", "kda", "mla", "moe", "other") is skipped.
inline bool is_ablated(const std::vector<std::string>& names, const char* category, const char* name) {
  for (const std::string& n : names)
    if (n == name || (n != "other" && n == category)) return true;
  return false;
}

}  // namespace ds
