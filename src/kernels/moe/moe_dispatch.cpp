// MoE host side: capability checks, workspace layout, path heuristic, and the op's single dispatch point.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/align.h"
#include "core/error.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_kernels.h"
#include "kernels/moe/moe_workspace.h"

#ifdef DELTASERVE_WITH_CUDA
#include "kernels/moe/moe_cuda_check.h"
#endif

namespace ds::moe {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kFP8Block: return "fp8-block";
    case WeightFormat::kMXFP8: return "mxfp8";
    case WeightFormat::kMXFP4: return "mxfp4";
    case WeightFormat::kNVFP4: return "nvfp4";
  }
  return "?";
}
const char* act_format_name(ActFormat f) {
  switch (f) {
    case ActFormat::kBF16: return "bf16";
    case ActFormat::kFP8Block: return "fp8-1x128";
    case ActFormat::kMXFP8: return "mxfp8-1x32";
  }
  return "?";
}
const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kStream: return "stream(mma.sync)";
    case GemmPath::kWgmma: return "wgmma(sm90a)";
    case GemmPath::kGemv: return "gemv";
  }
  return "?";
}

namespace {

// The (weights, activations) pairs the kernels implement. MXFP4 is weight-only (bf16 activations) on Hopper;
// NVFP4 runs weight-only or W4A8 (FP8 1x128 activations).
bool format_pair_supported(WeightFormat w, ActFormat a) {
  switch (w) {
    case WeightFormat::kBF16: return a == ActFormat::kBF16;
    case WeightFormat::kFP8Block: return a == ActFormat::kFP8Block;
    case WeightFormat::kMXFP8: return a == ActFormat::kMXFP8;
    case WeightFormat::kMXFP4: return a == ActFormat::kBF16;
    case WeightFormat::kNVFP4: return a == ActFormat::kBF16 || a == ActFormat::kFP8Block;
  }
  return false;
}

// The one-token decode: fused finalize, weights it streams as bf16 or W8A16 (any activation format of the
// pair: it reads x and h in bf16).
bool gemv_supports(const MoeParams& p) {
  return p.do_finalize && p.router.topk <= detail::kMaxTopk &&
         (p.weight_format == WeightFormat::kBF16 || p.weight_format == WeightFormat::kFP8Block);
}

// Warps of a gemv block at T tokens: a slot per route and per token's shared expert, for the up to two tokens of
// a block row.
int gemv_warps(int T, const MoeParams& p) {
  return std::min(T, detail::kGemvBlockTokens) * (p.router.topk + (p.has_shared ? 1 : 0));
}
bool gemv_tokens_fit(int T, const MoeParams& p) {
  return T >= 1 && T <= detail::kGemvMaxTokens && gemv_warps(T, p) <= detail::kGemvMaxWarps;
}
// Token counts the heuristic sends to the gemv path (MoeParams::gemv_tokens: 0), from moe_bench's forced rows on an
// H100 (docs/perf-moe.md, runs 24-25): FP8-block weights (read as W8A16) up to 8 tokens, op 108 -> 90 us at T = 4
// and 187 -> 169 at T = 8 against the stream path (85 and 159 us with the rows on grid.x); bf16 up to 4 (with the
// rows on grid.x, T = 4: op 156 -> 144, with routing and the shared expert 172 -> 165; T = 8 even; T = 16 slower).
int gemv_auto_tokens(const MoeParams& p) { return p.weight_format == WeightFormat::kFP8Block ? 8 : 4; }

bool wgmma_supports(WeightFormat w, ActFormat a) {
  return (w == WeightFormat::kBF16 && a == ActFormat::kBF16) ||
         (w == WeightFormat::kFP8Block && a == ActFormat::kFP8Block);
}

int local_experts(const MoeParams& p) {
  const int end = p.expert_end < 0 ? p.router.E : p.expert_end;
  return end - p.expert_begin;
}

}  // namespace

std::optional<std::string> moe_route_unsupported(const RouterParams& r, int D) {
  if (r.E < 1 || r.E > detail::kMaxExperts) return fmt::format("router: E={} outside [1, {}]", r.E, detail::kMaxExperts);
  if (r.topk < 1 || r.topk > detail::kMaxTopk)
    return fmt::format("router: top-k {} outside [1, {}]", r.topk, detail::kMaxTopk);
  if (r.num_expert_group < 1 || r.E % r.num_expert_group != 0)
    return fmt::format("router: E={} not divisible into {} groups", r.E, r.num_expert_group);
  if (r.topk_group < 1 || r.topk_group > r.num_expert_group)
    return fmt::format("router: topk_group={} of {} groups", r.topk_group, r.num_expert_group);
  if (r.topk > r.topk_group * (r.E / r.num_expert_group))
    return fmt::format("router: top-k {} exceeds the {} experts of the kept groups", r.topk,
                       r.topk_group * (r.E / r.num_expert_group));
  if (D < 32 || D % 32 != 0) return fmt::format("router: hidden size {} is not a positive multiple of 32", D);
  return std::nullopt;
}

std::optional<std::string> moe_unsupported(const MoeParams& p) {
  if (p.arch < 80) return fmt::format("arch sm_{}: the MoE kernels need mma.sync (sm_80 or newer)", p.arch);
  if (p.arch != 90)
    return fmt::format("arch sm_{}: this build carries sm_90a kernels only (wgmma, e4m3 mma.sync)", p.arch);
  if (p.D <= 0 || p.D % detail::kQuantBlock != 0)
    return fmt::format("hidden size D={} must be a positive multiple of 128", p.D);
  if (p.I <= 0 || p.I % detail::kQuantBlock != 0)
    return fmt::format("intermediate size I={} must be a positive multiple of 128", p.I);
  if (p.routing == RoutingMode::kInKernel)
    if (auto r = moe_route_unsupported(p.router, p.D)) return r;
  if (p.router.E < 1 || p.router.E > detail::kMaxExperts)
    return fmt::format("E={} outside [1, {}]", p.router.E, detail::kMaxExperts);
  if (p.router.topk < 1 || p.router.topk > detail::kMaxTopk)
    return fmt::format("top-k {} outside [1, {}]", p.router.topk, detail::kMaxTopk);
  const int end = p.expert_end < 0 ? p.router.E : p.expert_end;
  if (p.expert_begin < 0 || end > p.router.E || p.expert_begin >= end)
    return fmt::format("local expert range [{}, {}) is not inside [0, {})", p.expert_begin, end, p.router.E);
  if (p.max_tokens < 1) return fmt::format("max_tokens={} must be >= 1", p.max_tokens);
  if (static_cast<int64_t>(p.max_tokens) * (p.router.topk + 1) > (int64_t{1} << 30))
    return fmt::format("max_tokens={} x top-k {} overflows the 32-bit route indices", p.max_tokens, p.router.topk);
  if (!format_pair_supported(p.weight_format, p.act_format))
    return fmt::format("weights {} with activations {} is not an implemented pair (bf16/bf16, fp8-block/fp8-1x128, "
                       "mxfp8/mxfp8-1x32, mxfp4/bf16, nvfp4/bf16, nvfp4/fp8-1x128)",
                       weight_format_name(p.weight_format), act_format_name(p.act_format));
  if (p.force_path == GemmPath::kWgmma && !wgmma_supports(p.weight_format, p.act_format))
    return fmt::format("the wgmma path implements bf16 and fp8-block weights only, not {}",
                       weight_format_name(p.weight_format));
  if (p.fp8_prefill_tile_m != 0 && p.fp8_prefill_tile_m != detail::kWgmmaTileMFp8 &&
      p.fp8_prefill_tile_m != detail::kWgmmaTileMFp8Ws)
    return fmt::format("fp8_prefill_tile_m {} (0, {} or {})", p.fp8_prefill_tile_m, detail::kWgmmaTileMFp8,
                       detail::kWgmmaTileMFp8Ws);
  if (p.stream_token_tiles != 0 && p.stream_token_tiles != 1 && p.stream_token_tiles != 2 &&
      p.stream_token_tiles != 4 && p.stream_token_tiles != 8)
    return fmt::format("stream_token_tiles {} (0, 1, 2, 4 or 8)", p.stream_token_tiles);
  if ((p.gemv_up_cols != 0 && p.gemv_up_cols != 2 && p.gemv_up_cols != 4) ||
      (p.gemv_down_rows != 0 && p.gemv_down_rows != 2 && p.gemv_down_rows != 4 && p.gemv_down_rows != 8))
    return fmt::format("gemv block shape {} h columns / {} rows of D (0, 2 or 4 / 0, 2, 4 or 8)", p.gemv_up_cols,
                       p.gemv_down_rows);
  if (p.gemv_tokens < 0 || p.gemv_tokens > detail::kGemvMaxTokens)
    return fmt::format("gemv_tokens {} (0 for the rule, or 1 to {})", p.gemv_tokens, detail::kGemvMaxTokens);
  if (p.force_path == GemmPath::kGemv && !gemv_supports(p))
    return fmt::format("the gemv path runs the fused finalize with bf16 or fp8-block weights only, not {}{}",
                       weight_format_name(p.weight_format), p.do_finalize ? "" : " deferred");
  return std::nullopt;
}

std::optional<std::string> moe_pre_norm_unsupported(const MoeParams& p) {
  if (p.T != 1) return fmt::format("the pre-norm router runs one token, not T={}", p.T);
  if (p.routing != RoutingMode::kInKernel || p.cluster_route || p.route_counter)
    return std::string("the pre-norm router needs in-kernel routing in two kernels (no cluster or fused route)");
  if (moe_choose_path(p.arch, p.T, p) != GemmPath::kGemv) return std::string("the pre-norm router needs the gemv path");
  if (!p.pre_add || !p.pre_residual || !p.pre_residual_out || !p.pre_out || !p.pre_norm_w)
    return std::string("the pre-norm router needs pre_add, pre_residual, pre_residual_out, pre_out and pre_norm_w");
  if (p.pre_out != p.x || p.pre_residual_out != p.residual)
    return std::string("the pre-norm router writes the op's x and its finalize residual: pre_out must be x and "
                       "pre_residual_out the residual");
  if (p.pre_residual_out == p.pre_residual || p.pre_residual_out == p.pre_add)
    return std::string("pre_residual_out must not alias pre_residual or pre_add (every CTA reads them)");
  for (const void* q : {static_cast<const void*>(p.pre_add), static_cast<const void*>(p.pre_residual),
                        static_cast<const void*>(p.pre_residual_out), static_cast<const void*>(p.pre_norm_w),
                        static_cast<const void*>(p.pre_out)})
    if (!aligned16(q)) return std::string("the pre-norm router's rows must be 16-byte aligned");
  if (p.D % 8 != 0 || p.D > 8192) return fmt::format("the pre-norm router needs D % 8 == 0, D <= 8192 (D={})", p.D);
  return std::nullopt;
}

GemmPath moe_choose_path(int arch, int T, const MoeParams& p) {
  if (p.force_path) return *p.force_path;
  // A few tokens: the weights of their experts, read once by two matrix-vector kernels (measured on sm_90 only,
  // docs/perf-moe.md; two tokens' slots per block must fit it: top-8 with a shared expert), up to the measured
  // limit (gemv_auto_tokens) or MoeParams::gemv_tokens.
  const int gemv_limit = p.gemv_tokens > 0 ? p.gemv_tokens : gemv_auto_tokens(p);
  if (arch == 90 && T <= gemv_limit && gemv_tokens_fit(T, p) && p.gemv_decode && gemv_supports(p))
    return GemmPath::kGemv;
  // wgmma exists on sm_90 only; the streaming kernel runs everywhere mma.sync does.
  if (arch != 90 || !wgmma_supports(p.weight_format, p.act_format)) return GemmPath::kStream;
  // FP8-block (MoeParams::fp8_decode_wgmma, the default): the stream kernel is
  // latency-bound at every decode size (its weights in flight are what its registers hold); the wgmma kernels'
  // rings won from T = 16 on in the op, even at half a route per expert (run 25).
  if (p.weight_format == WeightFormat::kFP8Block && p.fp8_decode_wgmma) return GemmPath::kWgmma;
  // Streaming wins while an expert sees few tokens: it reads each weight once with the tokens as the mma's
  // narrow (n = 8) side. The wgmma tile (64 or 128 rows) is mostly padding below ~32 tokens per expert.
  // Cut-over: average routed tokens per local expert (T * TOPK / EL) above 16 (docs/perf-moe.md).
  const int64_t routes = static_cast<int64_t>(T) * p.router.topk;
  return routes > 16LL * local_experts(p) ? GemmPath::kWgmma : GemmPath::kStream;
}

int moe_fp8_prefill_tile_m(int T, const MoeParams& p) {
  if (p.fp8_prefill_tile_m != 0) return p.fp8_prefill_tile_m;
  // 128-row tiles halve the bytes per MMA (the 64-row kernel is bound by its feed from L2) but pad more: taken
  // from 64 routed rows per local expert on average. H100, Kimi shape (docs/perf-moe.md run 15): 128 rows win by
  // 6-7 % at 64 rows per expert (T = 2,048, the engine's prefill step) and lose by ~1 % at 32 (T = 1,024).
  const int64_t routes = static_cast<int64_t>(T) * p.router.topk;
  return routes >= 64LL * local_experts(p) ? detail::kWgmmaTileMFp8Ws : detail::kWgmmaTileMFp8;
}

int moe_stream_token_tiles(int T, const MoeParams& p) {
  if (p.stream_token_tiles != 0) return p.stream_token_tiles;
  // Measured at T = 2..512, every format pair (moe_bench --tiles, H100, docs/perf-moe.md runs 17-20), on full_us
  // (routing + shared expert: what the engine runs). A routed expert sees about T * topk / E tokens (~2 at T = 64,
  // ~16 at T = 512 on the Kimi shape), so tiles beyond one pass of a routed group only cost registers; fewer tiles
  // keep two CTAs per SM (stream_min_ctas), and the shared expert, which sees all T tokens, takes several passes
  // over its rows from L2, each pass on CTAs of its own (moe_stream.cuh). One pass for the shared expert (8 tiles
  // at T > 32, the old rule) was the slowest pick from T = 33 up in every format (FP8 T = 512: 2,013 us against
  // 1,696 with 2 tiles, before the passes had CTAs of their own; 1,469 after).
  switch (p.weight_format) {
    case WeightFormat::kBF16:  // T = 64: 1,090 us (8 tiles: 1,220); T = 512: 4 tiles 1,993 (1 tile: 3,334)
      return T <= 128 ? 1 : 4;
    case WeightFormat::kFP8Block:  // 2 beats 1 by 1-6 % and 4 by 10-20 % at every T
      return 2;
    case WeightFormat::kMXFP8:  // 1 up to T = 128 (2 % better there), 2 above (T = 256: 1,461 us against 1,651)
      return T <= 128 ? 1 : 2;
    case WeightFormat::kMXFP4:
    case WeightFormat::kNVFP4:  // 2 at every T with bf16 activations; with FP8 ones, 1 up to T = 128 (3-6 % better)
      return p.act_format == ActFormat::kFP8Block && T <= 128 ? 1 : 2;
  }
  return 2;  // not reached: every weight format is a case above
}

namespace detail {

WorkspaceLayout workspace_layout(const MoeParams& p) {
  WorkspaceLayout l;
  const int64_t Tm = p.max_tokens, K = p.router.topk, R = Tm * K;
  const int EL = local_experts(p), G = EL + (p.has_shared ? 1 : 0);
  const int64_t P = R + (p.has_shared ? Tm : 0);
  const int64_t nchunks = (R + kDispatchChunk - 1) / kDispatchChunk;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  };
  const bool quant_act = p.act_format != ActFormat::kBF16;
  l.logits = take(p.routing == RoutingMode::kInKernel ? Tm * p.router.E * 4 : 0);
  l.topk_ids = take(R * 4);
  l.topk_w = take(R * 4);
  l.e2p = take(R * 4);
  l.grp_begin = take(G * 4);
  l.grp_count = take(G * 4);
  l.active = take(G * 4);
  l.num_active = take(4);
  l.tile_prefix = take((G + 1) * 4);
  l.row_token = take(P * 4);
  l.row_dest = take(P * 4);
  l.qcounters = take(static_cast<size_t>(G) * (p.I / kQuantBlock) * 4);
  l.chunk_hist = take(nchunks * G * 4);
  l.fcounters = take(std::min<int64_t>(Tm, kFusedMaxRoutes) * (p.D / kFinalizeCols) * 4);
  l.xq = take(quant_act ? Tm * p.D : 0);
  l.xscale = take(p.act_format == ActFormat::kFP8Block ? Tm * (p.D / 128) * 4
                  : p.act_format == ActFormat::kMXFP8  ? Tm * (p.D / 32)
                                                       : 0);
  l.h = take(P * p.I * (quant_act ? 1 : 2));
  l.hscale = take(p.act_format == ActFormat::kFP8Block ? P * (p.I / 128) * 4
                  : p.act_format == ActFormat::kMXFP8  ? P * (p.I / 32)
                                                       : 0);
  // fp32 staging of h for the stream path's quantised formats (its CTAs cover 16 of I; the last CTA of a
  // 128-wide block quantises it). Sized for every call because any T may take the stream path.
  l.h32 = take(quant_act ? P * p.I * 4 : 0);
  l.expert_out = take(p.do_finalize ? R * p.D * 2 : 0);
  l.shared_out = take(p.do_finalize && p.has_shared ? Tm * p.D * 2 : 0);
  l.total = off;
  return l;
}

}  // namespace detail

size_t moe_workspace_bytes(const MoeParams& p) {
  if (auto why = moe_unsupported(p)) DS_THROW("moe_workspace_bytes: unsupported MoE configuration: {}", *why);
  return detail::workspace_layout(p).total;
}

#ifdef DELTASERVE_WITH_CUDA

namespace detail {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  ::ds::detail::throw_check(file, line, expr, fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err)));
}

// The op's dispatch point: the only place where runtime format values and the token tile count become
// template arguments. Each pair is instantiated once, in the .cu file of its format.
template <int NT>
void stream_for_formats(WeightFormat w, ActFormat a, const GemmArgs& g) {
  if (w == WeightFormat::kBF16) return launch_stream_gemm<WeightFormat::kBF16, ActFormat::kBF16, NT>(g);
  if (w == WeightFormat::kFP8Block) return launch_stream_gemm<WeightFormat::kFP8Block, ActFormat::kFP8Block, NT>(g);
  if (w == WeightFormat::kMXFP8) return launch_stream_gemm<WeightFormat::kMXFP8, ActFormat::kMXFP8, NT>(g);
  if (w == WeightFormat::kMXFP4) return launch_stream_gemm<WeightFormat::kMXFP4, ActFormat::kBF16, NT>(g);
  if (a == ActFormat::kBF16) return launch_stream_gemm<WeightFormat::kNVFP4, ActFormat::kBF16, NT>(g);
  return launch_stream_gemm<WeightFormat::kNVFP4, ActFormat::kFP8Block, NT>(g);
}

void run_expert_gemm(GemmPath path, WeightFormat w, ActFormat a, int tiles, const GemmArgs& g) {
  if (path == GemmPath::kWgmma) {
    if (w == WeightFormat::kBF16) return launch_wgmma_bf16(g);
    return g.fp8_tile_m == kWgmmaTileMFp8Ws ? launch_wgmma_fp8_ws(g) : launch_wgmma_fp8(g);
  }
  // Token tiles held in registers (moe_stream_token_tiles); a larger group loops over passes of 8 x tiles tokens.
  if (tiles == 1) return stream_for_formats<1>(w, a, g);
  if (tiles == 2) return stream_for_formats<2>(w, a, g);
  if (tiles == 4) return stream_for_formats<4>(w, a, g);
  return stream_for_formats<8>(w, a, g);
}

// The routing launches of a checked call with T > 0 (moe_route and the op's in-kernel routing): router GEMM and
// top-k as one cluster or fused kernel where asked and applicable, else the logits GEMM (unless given) and top-k.
void launch_route(const RouteParams& p) {
  if (!p.logits_given && p.cluster && route_cluster_applies(p.T, p.router))
    return launch_route_cluster(p.x, p.gate_w, p.bias, p.T, p.D, p.router, p.logits, p.topk_ids, p.topk_weights,
                                p.stream, p.pdl);
  if (!p.logits_given && p.route_counter && route_fused_applies(p.T, p.router))
    return launch_route_fused(p.x, p.gate_w, p.bias, p.T, p.D, p.router, p.logits, p.topk_ids, p.topk_weights,
                              p.route_counter, p.stream, p.pdl);
  if (!p.logits_given) launch_router_logits(p.x, p.gate_w, p.T, p.D, p.router.E, p.logits, p.stream, p.pdl);
  launch_topk(p.logits, p.bias, p.T, p.router, p.topk_ids, p.topk_weights, p.stream, p.pdl);
}

}  // namespace detail

MoeResult moe_forward(const MoeParams& p) {
  using namespace detail;
  if (auto why = moe_unsupported(p)) DS_THROW("moe_forward: unsupported MoE configuration: {}", *why);
  const WorkspaceLayout L = workspace_layout(p);
  CHECK(p.T >= 0 && p.T <= p.max_tokens, "moe_forward: T={} outside [0, max_tokens={}]", p.T, p.max_tokens);
  CHECK(p.workspace && p.workspace_bytes >= L.total, "moe_forward: workspace {} bytes, {} needed", p.workspace_bytes,
        L.total);
  CHECK(reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0, "moe_forward: workspace must be 256-byte aligned");
  CHECK(p.x, "moe_forward: x is null");
  CHECK(p.experts.w13 && p.experts.w2, "moe_forward: expert weights are null");
  if (p.weight_format != WeightFormat::kBF16)
    CHECK(p.experts.w13_scale && p.experts.w2_scale, "moe_forward: {} weights need their scales",
          weight_format_name(p.weight_format));
  if (p.weight_format == WeightFormat::kNVFP4)
    CHECK(p.experts.w13_global && p.experts.w2_global, "moe_forward: nvfp4 weights need their global scales");
  if (p.has_shared) CHECK(p.shared.w13 && p.shared.w2, "moe_forward: has_shared but the shared weights are null");
  const bool in_kernel = p.routing == RoutingMode::kInKernel;
  if (in_kernel) {
    CHECK(p.gate_w, "moe_forward: in-kernel routing needs gate_w");
  } else {
    CHECK(p.topk_ids_in && p.topk_weights_in, "moe_forward: separated routing needs topk_ids_in/topk_weights_in");
  }
  if (p.do_finalize) {
    CHECK(p.out, "moe_forward: fused finalize needs out");
  } else {
    CHECK(p.expert_out && p.expanded_to_permuted, "moe_forward: deferred finalize needs expert_out and "
          "expanded_to_permuted");
    CHECK(!p.has_shared || p.shared_out, "moe_forward: deferred finalize with a shared expert needs shared_out");
    if (in_kernel)
      CHECK(p.topk_ids_out && p.topk_weights_out,
            "moe_forward: deferred finalize with in-kernel routing needs topk_ids_out/topk_weights_out");
  }

  auto* ws = static_cast<char*>(p.workspace);
  auto at = [&](size_t off) { return static_cast<void*>(ws + off); };
  const int T = p.T, K = p.router.topk, D = p.D, EL = local_experts(p), G = EL + (p.has_shared ? 1 : 0);
  const GemmPath path = moe_choose_path(p.arch, T, p);
  CHECK(path != GemmPath::kGemv || T == 0 || gemv_tokens_fit(T, p),
        "moe_forward: the gemv path runs up to {} tokens, two per block of at most {} warps, not T={} with top-{}{}",
        detail::kGemvMaxTokens, detail::kGemvMaxWarps, T, K, p.has_shared ? " and a shared expert" : "");

  // ---- routing: ids/weights actually used by dispatch and finalize (and returned)
  const int32_t* ids = p.topk_ids_in;
  const float* weights = p.topk_weights_in;
  if (in_kernel) {
    auto* ids_w = p.topk_ids_out ? p.topk_ids_out : static_cast<int32_t*>(at(L.topk_ids));
    auto* w_w = p.topk_weights_out ? p.topk_weights_out : static_cast<float*>(at(L.topk_w));
    RouteParams r;
    r.router = p.router;
    r.T = T;
    r.D = D;
    r.x = p.x;
    r.gate_w = p.gate_w;
    r.bias = p.gate_bias;
    r.logits = static_cast<float*>(at(L.logits));
    r.topk_ids = ids_w;
    r.topk_weights = w_w;
    r.cluster = p.cluster_route;
    r.route_counter = p.route_counter;
    r.pdl = p.pdl;
    r.stream = p.stream;
    if (p.pre_norm_w) {  // the layer boundary in the router kernel, then the top-k of its logits
      if (auto why = moe_pre_norm_unsupported(p)) DS_THROW("moe_forward: {}", *why);
      PreNormArgs pn;
      pn.add = p.pre_add;
      pn.residual = p.pre_residual;
      pn.residual_out = p.pre_residual_out;
      pn.norm_w = p.pre_norm_w;
      pn.out = p.pre_out;
      pn.eps = p.pre_eps;
      launch_router_prenorm(p.gate_w, D, p.router.E, r.logits, pn, p.stream, p.pdl);
      r.logits_given = true;
    }
    if (T > 0) launch_route(r);
    ids = ids_w;
    weights = w_w;
  }
  int32_t* e2p = p.expanded_to_permuted ? p.expanded_to_permuted : static_cast<int32_t*>(at(L.e2p));
  bf16_t* expert_out = p.do_finalize ? static_cast<bf16_t*>(at(L.expert_out)) : p.expert_out;
  bf16_t* shared_out = p.do_finalize ? static_cast<bf16_t*>(at(L.shared_out)) : p.shared_out;

  MoeResult res;
  res.path = path;
  res.topk_ids = MoeTensor(const_cast<int32_t*>(ids), DType::kI32, T, K);
  res.topk_weights = MoeTensor(const_cast<float*>(weights), DType::kF32, T, K);
  res.expanded_to_permuted = MoeTensor(e2p, DType::kI32, static_cast<int64_t>(T) * K);
  if (!p.do_finalize) {
    res.expert_out = MoeTensor(expert_out, DType::kBF16, T, K, D);
    if (p.has_shared) res.shared_out = MoeTensor(shared_out, DType::kBF16, T, D);
  }
  if (T == 0) return res;

  if (path == GemmPath::kGemv) {
    GemvDecodeArgs ga;
    ga.T = T;
    ga.x = p.x;
    ga.ids = ids;
    ga.w = weights;
    ga.TOPK = K;
    ga.expert_begin = p.expert_begin;
    ga.EL = EL;
    ga.has_shared = p.has_shared;
    ga.D = D;
    ga.I = p.I;
    ga.fp8 = p.weight_format == WeightFormat::kFP8Block;
    ga.experts = p.experts;
    ga.shared = p.shared;
    // h bf16 [T (TOPK (+ 1 shared)), I]: the h region has P >= that many rows of bf16 when the activations are
    // bf16; with quantised activations it holds one byte per element, the fp32 staging four.
    ga.h = static_cast<bf16_t*>(at(p.act_format == ActFormat::kBF16 ? L.h : L.h32));
    ga.residual = p.residual;
    ga.out = p.out;
    ga.e2p = e2p;  // the returned map, whether the caller gave the buffer or not
    ga.up_cols = p.gemv_up_cols;
    ga.down_rows = p.gemv_down_rows;
    ga.down_persistent = p.gemv_down_persistent && p.gemv_down_rows == 0 &&
                         gemv_down_persistent_applies(ga.fp8, D, p.I);
    ga.down_preload = p.gemv_down_preload && gemv_down_persistent_applies(ga.fp8, D, p.I);  // heights: launch_fmt
    ga.x_ready = in_kernel && p.pdl;  // the router and top-k kernels waited for x's producer before triggering
    if (p.norm_w && p.norm_out && aligned16(p.norm_w) && aligned16(p.norm_out) &&
        gemv_norm_fusable(D, gemv_warps(T, p))) {
      ga.norm_w = p.norm_w;
      ga.norm_out = p.norm_out;
      ga.norm_eps = p.norm_eps;
      ga.norm_counter = static_cast<int32_t*>(at(L.fcounters));  // the stream path's counters: unused here
      res.normed = true;
    }
    ga.pdl = p.pdl;
    ga.stream = p.stream;
    launch_gemv_decode(ga);
    return res;
  }

  // Fused decode: no dispatch kernel, the stream GEMMs derive the plan from the ids; GEMM2 finalizes.
  const bool fused = path == GemmPath::kStream && p.fuse_decode && static_cast<int64_t>(T) * K <= kFusedMaxRoutes;
  auto* qcounters = static_cast<int32_t*>(at(L.qcounters));
  const int num_qcounters = G * (p.I / kQuantBlock);

  // ---- activations in the gate/up GEMM's format (per token, not per route: TOPK times less work)
  const void* act = p.x;
  const void* act_scale = nullptr;
  if (p.act_format != ActFormat::kBF16) {
    // Fused: the fused quantisation's counters are zeroed here (the dispatch kernel does it otherwise).
    launch_act_quant(p.x, T, D, p.act_format, at(L.xq), at(L.xscale), p.stream, p.pdl, fused ? qcounters : nullptr,
                     fused ? num_qcounters : 0);
    act = at(L.xq);
    act_scale = at(L.xscale);
  }

  // ---- dispatch
  Plan plan;
  plan.T = T;
  plan.TOPK = K;
  plan.EL = EL;
  plan.G = G;
  plan.expert_begin = p.expert_begin;
  plan.has_shared = p.has_shared;
  plan.grp_begin = static_cast<int32_t*>(at(L.grp_begin));
  plan.grp_count = static_cast<int32_t*>(at(L.grp_count));
  plan.active = static_cast<int32_t*>(at(L.active));
  plan.num_active = static_cast<int32_t*>(at(L.num_active));
  plan.tile_prefix = static_cast<int32_t*>(at(L.tile_prefix));
  plan.row_token = static_cast<int32_t*>(at(L.row_token));
  plan.row_dest = static_cast<int32_t*>(at(L.row_dest));
  plan.e2p = e2p;
  plan.qcounters = qcounters;
  plan.chunk_hist = static_cast<int32_t*>(at(L.chunk_hist));
  DispatchArgs da;
  da.plan = plan;
  da.topk_ids = ids;
  const int fp8_tile_m = moe_fp8_prefill_tile_m(T, p);
  const int stream_tiles = moe_stream_token_tiles(T, p);
  da.tile_m = path == GemmPath::kWgmma ? (p.weight_format == WeightFormat::kBF16 ? kWgmmaTileMBf16 : fp8_tile_m) : 0;
  da.num_qcounters = num_qcounters;
  da.zero_dropped = p.do_finalize ? nullptr : expert_out;
  da.D = D;
  da.pdl = p.pdl;
  da.stream = p.stream;
  if (!fused) launch_dispatch(da);

  // ---- experts
  GemmArgs g;
  g.plan = plan;
  g.D = D;
  g.I = p.I;
  g.act = p.act_format;
  g.experts = p.experts;
  g.shared = p.shared;
  g.h = at(L.h);
  g.h_scale = at(L.hscale);
  g.h32 = static_cast<float*>(at(L.h32));
  g.expert_out = expert_out;
  g.shared_out = shared_out;
  g.max_groups = static_cast<int>(std::min<int64_t>(G, static_cast<int64_t>(T) * K + (p.has_shared ? 1 : 0)));
  g.num_sms = device_sm_count();
  g.fp8_tile_m = fp8_tile_m;
  g.pdl = p.pdl;
  g.stream = p.stream;
  if (fused) {
    g.fused = true;
    g.topk_ids = ids;
    g.topk_w = weights;
    g.fcounters = static_cast<int32_t*>(at(L.fcounters));
    g.zero_dropped = p.do_finalize ? nullptr : expert_out;
    g.residual = p.residual;
    g.out = p.do_finalize ? p.out : nullptr;
  }
  if (p.gemm_begin) MOE_CUDA_CHECK(cudaEventRecord(p.gemm_begin, p.stream));
  g.gemm1 = true;
  g.a = act;
  g.a_scale = act_scale;
  run_expert_gemm(path, p.weight_format, p.act_format, stream_tiles, g);
  g.gemm1 = false;
  g.a = at(L.h);
  g.a_scale = at(L.hscale);
  run_expert_gemm(path, p.weight_format, p.act_format, stream_tiles, g);
  if (p.gemm_end) MOE_CUDA_CHECK(cudaEventRecord(p.gemm_end, p.stream));

  // ---- finalize
  if (p.do_finalize && !fused)
    launch_finalize(expert_out, e2p, weights, p.has_shared ? shared_out : nullptr, p.residual, T, K, D, p.out,
                    p.stream, p.pdl);
  return res;
}

void moe_route(const RouteParams& p) {
  if (auto why = moe_route_unsupported(p.router, p.D)) DS_THROW("moe_route: {}", *why);
  CHECK(p.logits && p.topk_ids && p.topk_weights, "moe_route: null output");
  if (p.T == 0) return;
  if (!p.logits_given) CHECK(p.x && p.gate_w, "moe_route: null input");
  detail::launch_route(p);
}

#else  // no CUDA in this build: the host-side functions above stay usable (load-time checks, sizing)

MoeResult moe_forward(const MoeParams&) { DS_THROW("moe_forward: deltaserve was built without CUDA"); }
void moe_route(const RouteParams&) { DS_THROW("moe_route: deltaserve was built without CUDA"); }

#endif

namespace {

void check_view(const MoeTensor& v, const char* name, DType dt, std::initializer_list<int64_t> shape) {
  CHECK(v.data, "moe_finalize: {} is null", name);
  CHECK(v.dtype == dt, "moe_finalize: {} is {}, expected {}", name, dtype_name(v.dtype), dtype_name(dt));
  const std::vector<int64_t> want(shape), got(v.shape, v.shape + v.ndim);
  CHECK(got == want, "moe_finalize: {} has shape [{}], expected [{}]", name, fmt::join(got, ", "), fmt::join(want, ", "));
}

}  // namespace

void moe_finalize(const FinalizeParams& p) {
  CHECK(p.expert_out.ndim == 3, "moe_finalize: expert_out must be [T, TOPK, D], got {} dims", p.expert_out.ndim);
  const int64_t T = p.expert_out.shape[0], K = p.expert_out.shape[1], D = p.expert_out.shape[2];
  CHECK(K >= 1 && K <= detail::kMaxTopk && D % 8 == 0, "moe_finalize: TOPK={} D={}", K, D);
  check_view(p.expert_out, "expert_out", DType::kBF16, {T, K, D});
  check_view(p.expanded_to_permuted, "expanded_to_permuted", DType::kI32, {T * K});
  check_view(p.topk_weights, "topk_weights", DType::kF32, {T, K});
  if (p.shared_out.data) check_view(p.shared_out, "shared_out", DType::kBF16, {T, D});
  if (p.residual.data) check_view(p.residual, "residual", DType::kBF16, {T, D});
  check_view(p.out, "out", DType::kBF16, {T, D});
#ifdef DELTASERVE_WITH_CUDA
  if (T == 0) return;
  detail::launch_finalize(p.expert_out.ptr<bf16_t>(), p.expanded_to_permuted.ptr<int32_t>(),
                          p.topk_weights.ptr<float>(), p.shared_out.ptr<bf16_t>(), p.residual.ptr<bf16_t>(),
                          static_cast<int>(T), static_cast<int>(K), static_cast<int>(D), p.out.ptr<bf16_t>(),
                          p.stream, p.pdl);
#else
  DS_THROW("moe_finalize: deltaserve was built without CUDA");
#endif
}

}  // namespace ds::moe
