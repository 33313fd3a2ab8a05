// KDA host side: the decode layout selector (measured thresholds), set-up (env knob read once), capability
// checks, the prefill chunk plan and workspace layout, and the checked entry points.
#include <algorithm>
#include <iterator>
#include <string>

#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/common/per_device.h"
#include "kernels/kda/kda.h"
#ifdef DELTASERVE_WITH_CUDA
#include "kernels/kda/kda_cuda_check.h"
#endif

namespace ds::kda {
namespace {

// Measured on an H200 (bench/kda_bench, docs/perf.md "decode layout selector"): the compact-heads layout is
// faster for num_seqs <= max_seqs. With the V split over a cluster (H <= 64) the cluster launch, the two
// cluster barriers and the duplicated q/k prologue cost 15-125% more than the split's extra parallelism saves,
// at every N measured (1..512); at H >= 96 (no split) compact is the many-heads kernel with H fixed at compile
// time: 1-4% faster for N <= 4 without programmatic dependent launch, within noise (0.95-1.05) with it. So
// every count gets 0 (never): the table stays so that a retuned kernel or another Hopper part can move it.
struct CompactThreshold {
  int heads;
  int max_seqs;
};
constexpr CompactThreshold kHopperThresholds[] = {
    {1, 0},  {2, 0},  {3, 0},  {4, 0},  {6, 0},  {8, 0},  {12, 0},
    {16, 0}, {24, 0}, {32, 0}, {48, 0}, {64, 0}, {96, 0}, {128, 0},
};

// The streaming layout (kda_decode_stream.cu) takes batches of at least this many (sequence, head) items on
// arch 90: below it a CTA walks too few items to hide its serial per-item chain. kda_bench --quick, graph replay,
// stream / many (docs/perf.md): H100 (eighteenth session) 1.26 at 256 items, 1.03 at 2,048, 1.00 at 3,072,
// 0.98-0.99 at 4,096, 0.97 from 8,192; H200 (nineteenth) 1.01-1.03 at 4,096, 1.00 at 6,144, 0.97-0.98 from
// 8,192. The H200's crossover sets the rule.
constexpr int64_t kHopperStreamMinItems = 6144;

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

std::string head_list() {
  std::string s;
  for (int h : kCompactHeadCounts) {
    if (!s.empty()) s += ',';
    s += std::to_string(h);
  }
  return s;
}

// Checks shared by decode and prefill; `rows` is N (decode) or T (prefill).
std::optional<std::string> common_unsupported(int H, int K, int V, int rows, const Bf16Rows* views[5],
                                              const Bf16Rows& beta, const void* const* ptrs, int nptrs,
                                              int num_slots, const bf16_t* out, int64_t out_stride,
                                              const bf16_t* conv_w, const float* dt_bias, const float* o_norm_w) {
  if (K != kHeadDim || V != kHeadDim)
    return fmt::format("only K = V = {} is implemented (got K={}, V={})", kHeadDim, K, V);
  if (H <= 0 || H > 65535) return fmt::format("H={} is out of range [1, 65535]", H);
  if (rows == 0) return std::nullopt;
  for (int i = 0; i < nptrs; ++i)
    if (ptrs[i] == nullptr) return fmt::format("a required pointer (argument {}) is null", i);
  if (num_slots <= 0) return fmt::format("num_slots={} must be positive", num_slots);
  const int64_t P = static_cast<int64_t>(H) * kHeadDim;
  const char* names[5] = {"q", "k", "v", "f", "gz"};
  for (int i = 0; i < 5; ++i) {
    if (views[i]->ptr == nullptr) return fmt::format("{} is null", names[i]);
    if (!aligned(views[i]->ptr, 8) || views[i]->stride % 4 != 0)
      return fmt::format("{} must be 8-byte aligned with a stride that is a multiple of 4 elements (stride {})",
                         names[i], views[i]->stride);
    if (views[i]->stride < P) return fmt::format("{} stride {} < H*K = {}", names[i], views[i]->stride, P);
  }
  if (beta.ptr == nullptr || beta.stride < H) return fmt::format("beta_logits null or stride {} < H", beta.stride);
  if (out == nullptr || !aligned(out, 8) || out_stride % 4 != 0 || out_stride < P)
    return fmt::format("out must be 8-byte aligned with a stride >= H*V that is a multiple of 4 (stride {})",
                       out_stride);
  if (!aligned(conv_w, 16) || !aligned(dt_bias, 16) || !aligned(o_norm_w, 16))
    return "conv_w, dt_bias and o_norm_w must be 16-byte aligned";
  return std::nullopt;
}

// A forced scan configuration (KdaPrefillParams::scan_vtiles / scan_stages) must be one the launcher has.
std::optional<std::string> forced_scan_unsupported(int vtiles, int stages) {
  if (vtiles == 0 && stages == 0) return std::nullopt;
  if ((vtiles == 4 && (stages == 3 || stages == 1)) || (vtiles == 2 && (stages == 2 || stages == 1)))
    return std::nullopt;
  return fmt::format("scan_vtiles={} / scan_stages={}: not a scan configuration (4 / 3, 4 / 1, 2 / 2, 2 / 1, or "
                     "0 / 0 for the measured rule)",
                     vtiles, stages);
}
std::optional<std::string> scan_loader_unsupported(int loader) {
  if (loader == 0 || loader == kKdaScanLoaderCpAsync || loader == kKdaScanLoaderBulk) return std::nullopt;
  return fmt::format("scan_loader={}: not a loader (0 for the default, {} cp.async, {} bulk copies)", loader,
                     kKdaScanLoaderCpAsync, kKdaScanLoaderBulk);
}
std::optional<std::string> intra_silu_unsupported(int silu) {
  if (silu == 0 || silu == kKdaSiluExact || silu == kKdaSiluTanh) return std::nullopt;
  return fmt::format("intra_silu={}: not a SiLU form (0 for the default, {} exact, {} tanh)", silu, kKdaSiluExact,
                     kKdaSiluTanh);
}

}  // namespace

#ifdef DELTASERVE_WITH_CUDA
namespace detail {
void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  ::ds::detail::throw_check(file, line, expr, fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err)));
}
void throw_no_compact_instantiation(int num_heads) {
  DS_THROW("KDA decode: the compact-heads layout has no instantiation for H={} (instantiated: {})", num_heads,
           head_list());
}
void check_forced_scan_config(int vtiles, int stages) {
  if (auto why = forced_scan_unsupported(vtiles, stages)) DS_THROW("KDA prefill scan: {}", *why);
}
int current_device_sm_count() {
  int n = 0;
  KDA_CUDA_CHECK(current_device_sms(n));
  return n;
}
int scan_loader_of(int requested) {
  if (auto why = scan_loader_unsupported(requested)) DS_THROW("KDA prefill scan: {}", *why);
  return requested == 0 ? kKdaScanLoaderDefault : requested;
}
int intra_silu_of(int requested) {
  if (auto why = intra_silu_unsupported(requested)) DS_THROW("KDA prefill intra: {}", *why);
  return requested == 0 ? kKdaSiluDefault : requested;
}
}  // namespace detail
#endif

KdaLayout parse_kda_layout(const std::string& s) {
  if (s == "auto") return KdaLayout::kAuto;
  if (s == "compact") return KdaLayout::kCompact;
  if (s == "many") return KdaLayout::kMany;
  if (s == "stream") return KdaLayout::kStream;
  DS_THROW("unknown KDA decode layout '{}' (auto|compact|many|stream)", s);
}

const char* kda_layout_name(KdaLayout l) {
  switch (l) {
    case KdaLayout::kAuto: return "auto";
    case KdaLayout::kCompact: return "compact";
    case KdaLayout::kMany: return "many";
    case KdaLayout::kStream: return "stream";
  }
  return "?";
}

KdaScanConfig kda_prefill_scan_config_for(int64_t head_seqs, int sms) {
  // Cost of one wave of each configuration relative to 4 tiles x 3 stages, with the bulk-copy factor loader (the
  // default), fitted to kda_bench --scan-variants on the H200 (2026-12-05, docs/perf.md, the shapes whose waves
  // fill the device: 4 x 1 1.96-2.09, 2 x 2 1.60-1.74, 2 x 1 3.2-3.45; the fit with the cp.async loader was
  // 1.85 / 1.55 / 2.75): the one-stage kernels share an SM two ways; 2 tiles of 64 columns do twice a 4-tile CTA's
  // work for the same per-chunk barriers and load waits (the scan is latency-bound) and read each head's factors
  // half as often.
  struct Option {
    KdaScanConfig cfg;
    int ctas_per_sm;
    double cost;
  };
  static constexpr Option kOptions[] = {{{4, 3}, 1, 1.0}, {{4, 1}, 2, 2.0}, {{2, 2}, 1, 1.75}, {{2, 1}, 2, 3.45}};
  if (head_seqs <= 0 || sms <= 0) return kOptions[0].cfg;
  const Option* best = nullptr;
  double best_t = 0;
  for (const Option& o : kOptions) {  // ties keep the earlier option
    const int64_t ctas = head_seqs * o.cfg.vtiles, slots = static_cast<int64_t>(sms) * o.ctas_per_sm;
    const double t = static_cast<double>((ctas + slots - 1) / slots) * o.cost;
    if (best == nullptr || t < best_t) best = &o, best_t = t;
  }
  return best->cfg;
}

bool should_use_compact_heads(int arch, int num_seqs, int num_heads) {
  if (!is_compact_head_count(num_heads)) return false;
  if (arch != 90) return num_heads == 2;  // legacy rule: the thresholds below were measured on Hopper only
  for (const auto& t : kHopperThresholds)
    if (t.heads == num_heads) return num_seqs <= t.max_seqs;
  return false;
}

bool should_use_stream(int arch, int num_seqs, int num_heads) {
  return arch == 90 && static_cast<int64_t>(num_seqs) * num_heads >= kHopperStreamMinItems;
}

KdaDecodeSetup kda_decode_setup() {
  KdaDecodeSetup s;
  s.arch = cuda_device_arch();
  s.layout = parse_kda_layout(get_knob(knobs::kKdaLayout));
  return s;
}

KdaLayout kda_decode_layout(const KdaDecodeSetup& setup, int num_seqs, int num_heads) {
  switch (setup.layout) {
    case KdaLayout::kMany:
    case KdaLayout::kStream: return setup.layout;
    case KdaLayout::kCompact:
      if (!is_compact_head_count(num_heads))
        DS_THROW("KDA decode: the compact-heads layout is forced ({}=compact) but H={} has no compact "
                 "instantiation (instantiated: {}); use auto or many",
                 knobs::kKdaLayout.name, num_heads, head_list());
      return KdaLayout::kCompact;
    case KdaLayout::kAuto: break;
  }
  if (should_use_stream(setup.arch, num_seqs, num_heads)) return KdaLayout::kStream;
  return should_use_compact_heads(setup.arch, num_seqs, num_heads) ? KdaLayout::kCompact : KdaLayout::kMany;
}

std::optional<std::string> kda_decode_unsupported(const KdaDecodeParams& p) {
  if (p.N < 0) return fmt::format("N={} is negative", p.N);
  const Bf16Rows* views[5] = {&p.q, &p.k, &p.v, &p.f, &p.gz};
  const void* ptrs[] = {p.slot_ids, p.state_pool, p.conv_pool, p.conv_w, p.A_log, p.dt_bias, p.o_norm_w};
  if (auto why = common_unsupported(p.H, p.K, p.V, p.N, views, p.beta_logits, ptrs, 7, p.num_slots, p.out,
                                    p.out_stride, p.conv_w, p.dt_bias, p.o_norm_w))
    return why;
  if (static_cast<int64_t>(p.N) * p.H * 8 > INT32_MAX) return fmt::format("N*H = {}*{} is too large", p.N, p.H);
  if (p.N > 0 && !aligned(p.state_pool, 16)) return "state_pool must be 16-byte aligned";
  return std::nullopt;
}

void kda_decode(const KdaDecodeParams& p, const KdaDecodeSetup& setup, Stream stream) {
  if (auto why = kda_decode_unsupported(p)) DS_THROW("KDA decode: {}", *why);
  const KdaLayout layout = kda_decode_layout(setup, p.N, p.H);
#ifdef DELTASERVE_WITH_CUDA
  kda_decode_launch(p, layout, stream);
#else
  (void)layout, (void)stream;
  DS_THROW("KDA decode: this build has no CUDA support");
#endif
}

// ---- prefill ------------------------------------------------------------------------------------------------

std::vector<int32_t> kda_chunk_offsets(const std::vector<int32_t>& cu_seqlens) {
  CHECK(!cu_seqlens.empty() && cu_seqlens[0] == 0, "cu_seqlens must start with 0");
  std::vector<int32_t> off(cu_seqlens.size(), 0);
  for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n) {
    const int32_t len = cu_seqlens[n + 1] - cu_seqlens[n];
    CHECK_GE(len, 0);
    off[n + 1] = off[n] + (len + kChunk - 1) / kChunk;
  }
  return off;
}

namespace {
// Bytes of each factor array per (chunk, head) tile, in KdaChunkFactors order.
constexpr size_t kTileBytes[] = {
    kKdaFactorTile * 2, kKdaFactorTile * 2, kKdaFactorTile * 2,  // qg, kd, w (bf16, swizzled rows)
    kKdaUTile * 4,                                               // u (fp32, column blocks)
    kKdaAqkTile * 2,                                             // aqk (bf16, swizzled rows)
    kHeadDim * 4,                                                         // gl (fp32)
    kChunk * kHeadDim * 2,                                                // o (bf16, 64 rows per chunk)
};
size_t round_up(size_t x) { return (x + 255) / 256 * 256; }
}  // namespace

size_t kda_prefill_workspace_bytes(int num_chunks, int H) {
  const size_t tiles = static_cast<size_t>(num_chunks) * H;
  size_t total = 0;
  for (size_t b : kTileBytes) total += round_up(tiles * b);
  return total;
}

KdaChunkFactors kda_chunk_factors(void* workspace, int num_chunks, int H) {
  const size_t tiles = static_cast<size_t>(num_chunks) * H;
  auto* base = static_cast<unsigned char*>(workspace);
  unsigned char* ptr[std::size(kTileBytes)];
  for (size_t i = 0; i < std::size(kTileBytes); ++i) {
    ptr[i] = base;
    base += round_up(tiles * kTileBytes[i]);
  }
  return {reinterpret_cast<bf16_t*>(ptr[0]), reinterpret_cast<bf16_t*>(ptr[1]), reinterpret_cast<bf16_t*>(ptr[2]),
          reinterpret_cast<float*>(ptr[3]),  reinterpret_cast<bf16_t*>(ptr[4]), reinterpret_cast<float*>(ptr[5]),
          reinterpret_cast<bf16_t*>(ptr[6])};
}

std::optional<std::string> kda_prefill_unsupported(const KdaPrefillParams& p) {
  if (p.N < 0 || p.N > 65535) return fmt::format("N={} is out of range [0, 65535]", p.N);
  if (p.T < 0) return fmt::format("T={} is negative", p.T);
  if (auto why = forced_scan_unsupported(p.scan_vtiles, p.scan_stages)) return why;
  if (auto why = scan_loader_unsupported(p.scan_loader)) return why;
  if (auto why = intra_silu_unsupported(p.intra_silu)) return why;
  const Bf16Rows* views[5] = {&p.q, &p.k, &p.v, &p.f, &p.gz};
  const void* ptrs[] = {p.cu_seqlens, p.chunk_offsets, p.slot_ids, p.state_pool, p.conv_pool,
                        p.conv_w,     p.A_log,         p.dt_bias,  p.o_norm_w};
  if (auto why = common_unsupported(p.H, p.K, p.V, p.T, views, p.beta_logits, ptrs, 9, p.num_slots, p.out,
                                    p.out_stride, p.conv_w, p.dt_bias, p.o_norm_w))
    return why;
  if (p.T == 0) return std::nullopt;
  if (p.num_chunks < (p.T + kChunk - 1) / kChunk)
    return fmt::format("num_chunks={} is too small for T={} (use kda_chunk_offsets)", p.num_chunks, p.T);
  const size_t need = kda_prefill_workspace_bytes(p.num_chunks, p.H);
  if (p.workspace == nullptr || p.workspace_bytes < need || !aligned(p.workspace, 256))
    return fmt::format("workspace must be 256-byte aligned and hold {} bytes (got {})", need, p.workspace_bytes);
  return std::nullopt;
}

void kda_prefill(const KdaPrefillParams& p, Stream stream) {
  if (auto why = kda_prefill_unsupported(p)) DS_THROW("KDA prefill: {}", *why);
#ifdef DELTASERVE_WITH_CUDA
  kda_prefill_intra(p, stream);
  kda_prefill_scan(p, stream);
#else
  (void)stream;
  DS_THROW("KDA prefill: this build has no CUDA support");
#endif
}

}  // namespace ds::kda
