// Offline engine benchmark (`deltaserve bench-engine`): fixed input/output lengths at several concurrencies,
// driven straight through the Engine interface (no HTTP, no tokenizer), so the figures are the engine's own.
//
// Per concurrency C: C requests of random prompt tokens (input_len each, ignore_eos, max_tokens = output_len) are
// added at once and stepped to completion. Per request: TTFT = first token's step end - add time; TPOT = (last
// token - first token) / (generated - 1). The decode phase is every step after the last request's first token
// (then all C sequences decode together, no prefill in the step): its median step time is the figure compared with
// the weight-streaming bound (perf_model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/perf_model.h"

namespace ds {

struct EngineBenchOptions {
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int input_len = 1024;
  int output_len = 256;
  uint64_t seed = 1;
  int warmup_steps = 0;          // decode steps of a throw-away request before each concurrency (graph capture etc.)
  DecodeBytesOptions bytes;      // precision of the model (fp8 / fp8_kda_proj) for the bound
  double copy_bandwidth = kH200CopyBandwidth;
  std::function<void(const std::string&)> progress;  // optional one-line progress reports
};

// Time per step category (e.g. "kda", "mla", "moe", "gemm", "other") the engine measured, in ms; empty when the
// engine does not profile.
using CategoryMs = std::map<std::string, double>;

struct EngineBenchRow {
  int concurrency = 0;
  int requests = 0;
  double ttft_ms_median = 0, ttft_ms_max = 0;
  double tpot_ms_median = 0;         // over requests
  double tps_user = 0;               // 1000 / tpot_ms_median
  double tps_total = 0;              // generated tokens / wall time of the whole run
  double decode_step_ms_median = 0;  // steady decode steps (all C sequences decoding)
  int decode_steps = 0;
  double bound_ms = 0;               // bytes of one decode step / copy bandwidth
  double pct_of_bound = 0;           // bound_ms / decode_step_ms_median * 100
  CategoryMs breakdown_ms;           // per decode step, median over steady steps (engine-provided)
};

// Engine-specific hook: returns the category times of the step that just ran (empty if none).
using StepProfileFn = std::function<CategoryMs()>;

std::vector<EngineBenchRow> run_engine_bench(Engine& engine, const EngineBenchOptions& options,
                                             const StepProfileFn& profile = nullptr);

std::string engine_bench_markdown(const std::vector<EngineBenchRow>& rows);
std::string engine_bench_json(const std::vector<EngineBenchRow>& rows, const std::string& label);

}  // namespace ds
