// ktrace: a CUDA injection library that writes every kernel's start and end time (CSV) through CUPTI's activity
// API, the kernels of CUDA graphs included.
//
// Nsight Systems makes no report on the GPU machine, and ncu replays kernels one at a time, which hides exactly
// what a decode step's graph does: programmatic dependent launches overlapping their neighbours, a kernel waiting
// for SM space behind the previous one's tail. The CUPTI timestamps are the kernels' real start and end inside the
// graph. scripts/ktrace_summary.py turns the CSV into a per-kernel table; scripts/gpu-trace.sh runs both.
//
//   CUDA_INJECTION64_PATH=$BUILD/tools/ktrace/libds_ktrace.so DS_KTRACE_OUT=trace.csv deltaserve bench-engine ...
//
// No change to the traced program: the CUDA driver loads the library and calls InitializeInjection() when it
// initialises.
#include <cupti.h>
#include <cxxabi.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

constexpr size_t kBufferBytes = 8u << 20;  // CUPTI hands a full buffer back and asks for the next one

std::mutex g_mu;  // buffer_completed runs on CUPTI's worker thread, finish() on the exiting one
FILE* g_out = nullptr;
const char* g_path = nullptr;
uint64_t g_kernels = 0;
size_t g_dropped = 0;
std::unordered_map<const char*, std::string> g_names;  // CUPTI keeps one name pointer per function

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "ktrace: %s failed: %s\n", what, msg ? msg : "unknown CUPTI error");
  return false;
}

// The demangled name with its double quotes doubled (CSV); a name that does not demangle stays as it is.
const std::string& csv_name(const char* mangled) {
  auto it = g_names.find(mangled);
  if (it != g_names.end()) return it->second;
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::string name = status == 0 && d ? d.get() : (mangled ? mangled : "?");
  std::string quoted;
  for (char c : name) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return g_names.emplace(mangled, std::move(quoted)).first->second;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(alignof(std::max_align_t), kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    // Newer CUPTI versions append fields; the ones read here keep their offsets.
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::fprintf(g_out, "%llu,%llu,%u,%llu,%u,%u,%d,%d,%u,%d,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->graphId, static_cast<unsigned long long>(k->graphNodeId),
                 k->correlationId, k->streamId, k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                 static_cast<unsigned>(k->registersPerThread), k->staticSharedMemory + k->dynamicSharedMemory,
                 csv_name(k->name).c_str());
    ++g_kernels;
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_out) return;
  std::fclose(g_out);
  g_out = nullptr;
  std::fprintf(stderr, "ktrace: %llu kernels -> %s%s\n", static_cast<unsigned long long>(g_kernels), g_path,
               g_dropped ? " (CUPTI dropped records: the timeline has holes)" : "");
}

}  // namespace

extern "C" int InitializeInjection() {
  g_path = std::getenv("DS_KTRACE_OUT");
  if (!g_path || !*g_path) g_path = "ktrace.csv";
  g_out = std::fopen(g_path, "w");
  if (!g_out) {
    std::fprintf(stderr, "ktrace: cannot write %s (DS_KTRACE_OUT): tracing off\n", g_path);
    return 0;
  }
  std::fprintf(g_out, "start_ns,end_ns,graph_id,graph_node,correlation,stream,grid,block,regs,smem,name\n");
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks") ||
      !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)")) {
    std::fclose(g_out);
    g_out = nullptr;
    return 0;
  }
  std::atexit(finish);
  return 1;
}
