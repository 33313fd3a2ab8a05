// Tokenizer encode speed on one core (MB/s of UTF-8 input), per kind of text, with the test vocabulary or a
// real model folder: tokenizer_bench [MODEL_DIR_WITH_tiktoken.model] [--seconds S]
#ifndef DELTASERVE_WITH_TIKTOKEN
#include <cstdio>
int main() {
  std::printf("tokenizer_bench: built without PCRE2 (DELTASERVE_SERVER=OFF): no tiktoken tokenizer\n");
  return 0;
}
#else
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer_loader.h"

namespace {

namespace fs = std::filesystem;

// Thread CPU time: the development machines are shared, so wall time measures the neighbours too.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string repeat_to(const std::string& unit, size_t bytes) {
  std::string s;
  while (s.size() < bytes) s += unit;
  return s;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Built-in texts, so the numbers do not depend on what is installed. ~1 MB each.
std::vector<std::pair<std::string, std::string>> corpora() {
  const size_t n = 1 << 20;
  std::string prose =
      "The quick brown fox jumps over the lazy dog. It's 2024, and we're serving models with 48B parameters "
      "at 3B active; they've got 27 layers (KDA:MLA = 3:1), and I'm measuring TTFT, TPOT and throughput.\n"
      "Continuous batching keeps the GPU busy: requests join and leave the batch at every step, while the "
      "scheduler admits new sequences as long as state slots and latent pages remain free.\n\n";
  std::string code =
      "template <typename T>\nstatic void launch(const Params& p, cudaStream_t stream) {\n"
      "    dim3 grid(p.num_heads, (p.T + 63) / 64);\n    kernel<T><<<grid, 128, 0, stream>>>(p);\n"
      "    CUDA_CHECK(cudaGetLastError());\n}\n\nfor (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n";
  std::string cjk =
      "深度学习模型的推理引擎需要高效的调度器和内存管理。线性注意力机制使得长上下文的推理成本保持恒定，"
      "状态的大小与序列长度无关。日本語のテキスト、東京は日本の首都です。한국어 문장도 포함합니다.\n";
  std::string mixed = prose + "😀🚀 emoji and 中文 mixed with English, numbers 3.14159 and 1,000,000. " + cjk;
  return {{"english", repeat_to(prose, n)},
          {"code", repeat_to(code, n)},
          {"cjk", repeat_to(cjk, n)},
          {"mixed", repeat_to(mixed, n)}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else
      dir = argv[i];
  }
  std::unique_ptr<ds::tok::TiktokenBpe> bpe;
  if (!dir.empty()) {
    bpe = ds::tok::load_tiktoken_bpe(dir);
  } else {
    // The committed test vocabulary (3,840 ranks): smaller than Kimi's 163,584, so pieces need more merges.
    fs::path golden = fs::path(DS_SOURCE_DIR) / "tests/tokenizer/golden";
    auto ranks = ds::tok::load_tiktoken_ranks((golden / "kimi_test.tiktoken").string());
    auto config = nlohmann::json::parse(read_file(golden / "kimi_test_tokenizer_config.json"));
    bpe = std::make_unique<ds::tok::TiktokenBpe>(
        ranks, ds::tok::tiktoken_special_tokens(static_cast<int32_t>(ranks.size()), config));
    dir = golden.string() + " (test vocabulary)";
  }
  std::printf("tokenizer_bench: %s, %d ranks, one thread\n", dir.c_str(), bpe->num_base_tokens());
  std::printf(
      "MB/s = 10^6 bytes of UTF-8 input encoded per second of this thread's CPU time (wall in brackets)\n");
  std::printf("%-10s %10s %10s %12s %10s\n", "text", "MB/s", "(wall)", "tokens/s", "bytes/tok");
  double total_bytes = 0, total_cpu = 0;
  for (const auto& [name, text] : corpora()) {
    size_t tokens = bpe->encode(text).size();  // warm-up (JIT, caches)
    int iters = 0;
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds(), cpu = 0;
    do {
      tokens = bpe->encode(text).size();
      ++iters;
      cpu = cpu_seconds() - c0;
    } while (cpu < seconds);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double bytes = static_cast<double>(text.size()) * iters;
    std::printf("%-10s %10.1f %10.1f %12.0f %10.2f\n", name.c_str(), bytes / cpu / 1e6, bytes / wall / 1e6,
                static_cast<double>(tokens) * iters / cpu,
                static_cast<double>(text.size()) / static_cast<double>(tokens));
    total_bytes += bytes;
    total_cpu += cpu;
  }
  std::printf("%-10s %10.1f\n", "all", total_bytes / total_cpu / 1e6);
  return 0;
}

#endif  // DELTASERVE_WITH_TIKTOKEN
