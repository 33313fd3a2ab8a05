// MLA host-side logic without CUDA: capability checks, the fused A-GEMM operand checks, workspace sizes and the
// decode split heuristic. Runs (and is tested) on machines without a GPU.
#include <fmt/format.h>

#include <algorithm>

#include "core/align.h"
#include "kernels/mla/mla.h"

namespace ds::mla {

namespace {

// Workspace carving: every sub-buffer starts 256-byte aligned (vector loads and cuBLASLt operands).
size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }


}  // namespace

std::optional<std::string> mla_unsupported(const MlaDims& d) {
  if (d.latent != kLatent || d.rope != kRope || d.nope != kNope || d.value != kValue)
    return fmt::format("MLA kernels support kv_lora_rank/qk_rope/qk_nope/v_head dims 512/64/128/128 only, got "
                       "{}/{}/{}/{}",
                       d.latent, d.rope, d.nope, d.value);
  if (d.heads < 1 || d.heads > kMaxHeads)
    return fmt::format("MLA kernels support 1..{} heads per GPU, got {}", kMaxHeads, d.heads);
  return std::nullopt;
}

std::optional<std::string> fused_a_unsupported(const FusedAParams& p) {
  constexpr const char* op = "mla fused A-GEMM";
  if (auto e = mla_unsupported(MlaDims{p.heads})) return fmt::format("{}: {}", op, *e);
  if (p.hidden <= 0) return fmt::format("{}: hidden size {} must be positive", op, p.hidden);
  // Layout first (a strided or misaligned view is refused whatever its dtype), then dtypes, then shapes.
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"x", &p.x}, {"w", &p.w}, {"out", &p.out}})
    if (auto e = gemm::dense_operand_problem(op, name, *t)) return e;
  const bool fp8 = p.x.dtype == DType::kF8E4M3;
  if (p.x.dtype != DType::kBF16 && !fp8)
    return fmt::format("{}: operand 'x' has dtype {}, expected bf16 (or f8e4m3 with FP8 weights)", op,
                       dtype_name(p.x.dtype));
  const DType wt = fp8 ? DType::kF8E4M3 : DType::kBF16;
  // bf16 x with FP8 weights is the decode-size W8A16 path of the GEMM (T <= gemm::kDecodeMaxRows).
  const bool w8a16 = !fp8 && p.w.dtype == DType::kF8E4M3 && p.x.shape[0] <= gemm::kDecodeMaxRows;
  if (p.w.dtype != wt && !w8a16)
    return fmt::format("{}: operand 'w' has dtype {}, expected {} to match 'x'{}", op, dtype_name(p.w.dtype),
                       dtype_name(wt), fp8 ? "" : " (bf16 x takes FP8 weights only for T <= 4)");
  if (p.out.dtype != DType::kBF16)
    return fmt::format("{}: operand 'out' has dtype {}, expected bf16", op, dtype_name(p.out.dtype));
  const int64_t T = p.x.shape[0], n_out = static_cast<int64_t>(p.heads) * kQk + kRow;
  if (p.x.shape[1] != p.hidden)
    return fmt::format("{}: operand 'x' has shape {}, expected [T, {}]", op, p.x.shape_str(), p.hidden);
  if (p.w.shape[0] != n_out || p.w.shape[1] != p.hidden)
    return fmt::format("{}: operand 'w' has shape {}, expected [{}, {}] (q_proj {} rows + kv_a_proj_with_mqa 576)",
                       op, p.w.shape_str(), n_out, p.hidden, p.heads * kQk);
  if (p.out.shape[0] != T || p.out.shape[1] != n_out)
    return fmt::format("{}: operand 'out' has shape {}, expected [{}, {}]", op, p.out.shape_str(), T, n_out);
  // The scales (FP8) and anything else the GEMM needs.
  return gemm::gemm_unsupported({p.x, p.w, p.x_scale, p.w_scale, p.out, op, p.norm_w, p.norm_eps});
}

size_t decode_workspace_bytes(int N, int H, int num_splits) {
  const size_t n = static_cast<size_t>(std::max(N, 0)), h = static_cast<size_t>(std::max(H, 0)),
               s = static_cast<size_t>(std::max(num_splits, 1));
  return align256(n * h * kRow * 2)            // q_abs  bf16 [N, H, 576]
         + align256(n * s * h * kLatent * 4)   // o_part f32  [N, H, S, 512]
         + align256(n * s * h * 4);            // lse    f32  [N, H, S] (log2 domain)
}

int decode_num_splits(int arch, int num_sms, int N, int H, int max_ctx) {
  // Tuned for sm_90 (one 200 KB block per SM); other architectures get the same fill-the-machine-once rule.
  (void)arch;
  constexpr int kHeadsPerBlock = 32, kMinRowsPerSplit = 64, kMaxSplits = 256;  // 64: one KV tile per split
  const int blocks = std::max(1, N) * ((std::max(1, H) + kHeadsPerBlock - 1) / kHeadsPerBlock);
  if (blocks >= num_sms) return 1;
  // floor, not ceil: N * S must not exceed one wave (16 sequences on 132 SMs: 8 splits = 128 blocks, one wave;
  // 9 would give 144 blocks and a second, nearly empty wave).
  int s = std::max(1, num_sms / blocks);
  s = std::min(s, std::max(1, (max_ctx + kMinRowsPerSplit - 1) / kMinRowsPerSplit));
  return std::min(s, kMaxSplits);
}

int decode_variant(int arch) {
  // sm_90: the 8-warp K split (Q fragments stay in registers, 16 independent accumulators per warp); elsewhere the
  // simpler 4-warp column split.
  return arch == 90 ? 2 : 1;
}

std::optional<std::string> cache_write_unsupported(const CacheWriteParams& p) {
  if (p.T < 0) return fmt::format("mla cache_write: T = {}", p.T);
  if (p.T == 0) return std::nullopt;
  if (!p.ckv || !p.norm_w || !p.slot_mapping || !p.cache) return std::string("mla cache_write: null pointer argument");
  if (p.ckv_stride < kRow || p.ckv_stride % 8 != 0 || !aligned16(p.ckv))
    return fmt::format("mla cache_write: ckv rows must hold 576 values and start 16-byte aligned (stride {})",
                       p.ckv_stride);
  if (!aligned16(p.cache) || !aligned16(p.norm_w))
    return std::string("mla cache_write: cache and norm_w must be 16-byte aligned");
  return std::nullopt;
}

std::optional<std::string> decode_unsupported(const DecodeParams& p) {
  if (auto e = mla_unsupported(MlaDims{p.H})) return e;
  if (p.N < 0) return fmt::format("mla decode: N = {}", p.N);
  if (p.N > 0 && (!p.q || !p.wkv_b || !p.cache.data || !p.cache.block_table || !p.ctx_lens || !p.out ||
                  !p.workspace))
    return std::string("mla decode: null pointer argument");
  if (p.q_stride < static_cast<int64_t>(p.H) * kQk || p.q_stride % 8 != 0 || !aligned16(p.q))
    return fmt::format("mla decode: q rows must hold H*192 = {} values and start 16-byte aligned (stride {})",
                       p.H * kQk, p.q_stride);
  if (!aligned16(p.cache.data) || !aligned16(p.wkv_b) || !aligned16(p.out))
    return std::string("mla decode: cache, wkv_b and out must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(p.workspace) % 256 != 0)
    return std::string("mla decode: workspace must be 256-byte aligned");
  if (p.cache.page_size <= 0 || p.cache.max_pages_per_seq <= 0)
    return fmt::format("mla decode: page_size {} / max_pages_per_seq {}", p.cache.page_size,
                       p.cache.max_pages_per_seq);
  if (p.num_splits < 1 || p.num_splits > 256) return fmt::format("mla decode: num_splits {}", p.num_splits);
  if (p.variant < 0 || p.variant > 2) return fmt::format("mla decode: variant {} (0, 1 or 2)", p.variant);
  if (!(p.scale > 0.0f)) return std::string("mla decode: softmax scale must be positive");
  if (p.write) {
    if (p.write->T != p.N)
      return fmt::format("mla decode: the fused cache write covers the decode tokens only (write.T = {}, N = {})",
                         p.write->T, p.N);
    if (auto e = cache_write_unsupported(*p.write)) return e;
  }
  return std::nullopt;
}

size_t prefill_workspace_bytes(int total_ctx, int H) {
  const size_t c = static_cast<size_t>(std::max(total_ctx, 0)), h = static_cast<size_t>(std::max(H, 0));
  return align256(c * kLatent * 2)              // c_n  bf16 [ctx, 512] (GEMM A operand: dense)
         + align256(c * kRope * 2)              // k_pe bf16 [ctx, 64]
         + align256(c * h * (kNope + kValue) * 2);  // kv bf16 [ctx, H * 256]
}

std::optional<std::string> prefill_unsupported(const PrefillParams& p) {
  if (auto e = mla_unsupported(MlaDims{p.H})) return e;
  if (p.N < 0 || p.T < 0 || p.total_ctx < 0 || p.max_new_tokens < 0)
    return fmt::format("mla prefill: N={} T={} total_ctx={} max_new_tokens={}", p.N, p.T, p.total_ctx,
                       p.max_new_tokens);
  if (p.T > 0 && (!p.q || !p.wkv_b || !p.cache.data || !p.cache.block_table || !p.cu_seqlens || !p.ctx_lens ||
                  !p.cu_ctx || !p.out || !p.workspace))
    return std::string("mla prefill: null pointer argument");
  if (p.q_stride < static_cast<int64_t>(p.H) * kQk || p.q_stride % 8 != 0 || !aligned16(p.q))
    return fmt::format("mla prefill: q rows must hold H*192 = {} values and start 16-byte aligned (stride {})",
                       p.H * kQk, p.q_stride);
  if (!aligned16(p.cache.data) || !aligned16(p.wkv_b) || !aligned16(p.out))
    return std::string("mla prefill: cache, wkv_b and out must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(p.workspace) % 256 != 0)
    return std::string("mla prefill: workspace must be 256-byte aligned");
  if (p.cache.page_size <= 0 || p.cache.max_pages_per_seq <= 0)
    return fmt::format("mla prefill: page_size {} / max_pages_per_seq {}", p.cache.page_size,
                       p.cache.max_pages_per_seq);
  if (!(p.scale > 0.0f)) return std::string("mla prefill: softmax scale must be positive");
  return std::nullopt;
}

}  // namespace ds::mla
