// Host side of the fused finalize + all-reduce + RMSNorm: capability gating, launch shape, validation at the
// boundary, and the buffer layout (the kernels are in allreduce.cu).
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/allreduce/allreduce.h"

#ifdef DELTASERVE_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace ds::allreduce {

namespace {

constexpr size_t kStateBytes = 256;                       // ArState, padded
constexpr size_t kSsBytes = (kSsWords * 4 + 255) / 256 * 256;

bool act_dtype(DType t) { return t == DType::kBF16 || t == DType::kF16; }

void check_comm(const RankView& c, cudaStream_t stream, const char* op) {
  CHECK(c.world >= 1 && c.world <= kMaxRanks && c.rank >= 0 && c.rank < c.world, "{}: rank {} of {}", op, c.rank,
        c.world);
  CHECK(c.state && c.ss, "{}: the rank view has no state (make_rank_view)", op);
  for (int r = 0; r < c.world; ++r) CHECK(c.peer_data[r] && aligned16(c.peer_data[r]), "{}: buffer of rank {} missing", op, r);
  // The protocol is single-in-flight per buffer set: a second stream could interleave two calls' epochs.
  CHECK(c.owner_stream == nullptr || c.owner_stream == stream,
        "{}: called on another stream than the buffer set's owner stream (one call in flight per buffer set)", op);
}

}  // namespace

size_t data_offset_bytes() { return kStateBytes + kSsBytes; }

size_t buffer_bytes(int world, size_t slot_elems) {
  return data_offset_bytes() + 2 * static_cast<size_t>(world) * slot_elems * 2;
}

RankView make_rank_view(void* const* bases, int rank, int world, size_t slot_elems) {
  CHECK(world >= 1 && world <= kMaxRanks, "all-reduce buffers: {} ranks (1..{})", world, kMaxRanks);
  CHECK(rank >= 0 && rank < world, "all-reduce buffers: rank {} of {}", rank, world);
  CHECK(slot_elems > 0 && slot_elems % 8 == 0, "all-reduce buffers: slot of {} elements (a positive multiple of 8)",
        slot_elems);
  RankView v;
  v.rank = rank;
  v.world = world;
  v.slot_elems = slot_elems;
  for (int r = 0; r < world; ++r) {
    CHECK(bases[r] && reinterpret_cast<uintptr_t>(bases[r]) % 256 == 0,
          "all-reduce buffers: base of rank {} is null or not 256-byte aligned", r);
    v.peer_data[r] = reinterpret_cast<uint32_t*>(static_cast<char*>(bases[r]) + data_offset_bytes());
  }
  v.state = static_cast<ArState*>(bases[rank]);
  v.ss = reinterpret_cast<uint32_t*>(static_cast<char*>(bases[rank]) + kStateBytes);
  return v;
}

std::string describe_error(uint32_t code) {
  const uint32_t what = code & 0xFF000000u, who = code & 0x00FFFFFFu;
  switch (what) {
    case 0: return "no error";
    case kErrPeer: return fmt::format("the contribution of rank {} did not arrive within the timeout (peer dead, hung, "
                                      "or the ranks' calls out of step)", who);
    case kErrChunk: return fmt::format("block {} of a token did not publish its RMSNorm partial within the timeout "
                                       "(blocks not co-resident?)", who);
    case kErrAbort: return "aborted after an earlier failure on this rank";
    default: return fmt::format("unknown error code {:#x}", code);
  }
}

std::optional<std::string> fused_ar_norm_unsupported(const FusedArNormConfig& c) {
  if (c.max_tokens <= 0) return "disabled: DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS = 0";
  if (c.world != 2 && c.world != 4 && c.world != 8 && c.world != 16)
    return fmt::format("tensor-parallel degree {} (the fused kernel runs TP 2, 4, 8 or 16)", c.world);
  if (!act_dtype(c.dtype)) return fmt::format("activation dtype {} (bf16 or fp16 only)", dtype_name(c.dtype));
  if (!c.peer_access) return "no peer access between every pair of ranks (P2P / CUDA IPC unavailable)";
  if (c.D < kMinD || c.D > kMaxD || c.D % 8 != 0)
    return fmt::format("hidden size {} (need {} <= D <= {} and D % 8 == 0)", c.D, kMinD, kMaxD);
  if (!c.aligned) return "an operand is not 16-byte aligned";
  if (c.TOPK < 1 || c.TOPK > kMaxTopk) return fmt::format("TOPK = {} (1..{})", c.TOPK, kMaxTopk);
  const int max_t = std::min(c.max_tokens, kMaxTokens);
  if (static_cast<size_t>(max_t) * c.D > c.slot_elems)
    return fmt::format("peer buffers too small: {} tokens x D = {} need {} elements per slot, have {}", max_t, c.D,
                       static_cast<size_t>(max_t) * c.D, c.slot_elems);
  if (c.T > max_t)
    return fmt::format("T = {} tokens > DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS = {}", c.T, max_t);
  if (!fused_ar_norm_grid(std::max(c.T, 1), c.D, c.co_resident_ranks, c.resident_blocks))
    return fmt::format("{} rank kernels of {} tokens cannot be co-resident on one device ({} resident blocks)",
                       c.co_resident_ranks, c.T, c.resident_blocks);
  return std::nullopt;
}

std::optional<FusedGrid> fused_ar_norm_grid(int T, int D, int co_resident_ranks, int resident_blocks, int force_vpt) {
  const int nvec = D / 8;
  for (int vpt : {1, 2, 4}) {
    if (force_vpt != 0 && vpt != force_vpt) continue;
    const int chunks = (nvec + kThreads * vpt - 1) / (kThreads * vpt);
    if (chunks > kMaxChunks) continue;
    if (resident_blocks > 0 && static_cast<int64_t>(T) * chunks * std::max(co_resident_ranks, 1) > resident_blocks)
      continue;
    return FusedGrid{chunks, vpt};
  }
  return std::nullopt;
}

int peer_all_reduce_blocks(size_t count, int co_resident_ranks, int resident_blocks) {
  const size_t want = (count / 8 + kThreads - 1) / kThreads;
  // Unknown capacity: 32 blocks, co-resident with room to spare on any GPU this runs on.
  size_t cap = resident_blocks > 0 ? static_cast<size_t>(resident_blocks / std::max(co_resident_ranks, 1)) : 32;
  // Ranks simulated on one device: while R - 1 ranks spin in this kernel, the last rank's own kernels before its
  // call (GEMMs wanting a whole SM's registers or shared memory, cluster launches wanting several free SMs of one
  // GPC) must still find room, or it never arrives. The spinners of all ranks together take at most
  // resident_blocks / 32 blocks (about one SM in four holds one), so most SMs stay entirely free of them.
  if (co_resident_ranks > 1 && resident_blocks > 0)
    cap = std::max<size_t>(1, static_cast<size_t>(resident_blocks / (32 * co_resident_ranks)));
  return static_cast<int>(std::max<size_t>(1, std::min(want, cap)));
}

void fused_finalize_ar_norm(const FusedArNormParams& p) {
  constexpr const char* op = "fused_finalize_ar_norm";
  CHECK(act_dtype(p.dtype), "{}: dtype {} (bf16 or fp16)", op, dtype_name(p.dtype));
  CHECK(p.D >= kMinD && p.D <= kMaxD && p.D % 8 == 0, "{}: D = {}", op, p.D);
  CHECK(p.TOPK >= 1 && p.TOPK <= kMaxTopk, "{}: TOPK = {}", op, p.TOPK);
  CHECK(p.T >= 0 && p.T <= kMaxTokens, "{}: T = {} (0..{})", op, p.T, kMaxTokens);
  check_comm(p.comm, p.stream, op);
  CHECK(static_cast<size_t>(p.T) * p.D <= p.comm.slot_elems, "{}: T * D = {} exceeds the buffer slot ({})", op,
        static_cast<size_t>(p.T) * p.D, p.comm.slot_elems);
  if (p.T == 0) return;  // every rank has the same T: nobody launches, the epochs stay in step
  CHECK(p.expert_out && p.expanded_to_permuted && p.topk_weights && p.residual && p.residual_out && p.norm_w && p.y,
        "{}: null operand", op);
  CHECK(aligned16(p.expert_out) && aligned16(p.residual) && aligned16(p.residual_out) && aligned16(p.norm_w) &&
            aligned16(p.y) && (p.shared_out == nullptr || aligned16(p.shared_out)),
        "{}: operands must be 16-byte aligned", op);
  CHECK(p.y != p.residual && p.y != p.residual_out, "{}: y must not alias the residual", op);
  const auto g = fused_ar_norm_grid(p.T, p.D, p.comm.co_resident_ranks, p.comm.resident_blocks, p.force_vpt);
  CHECK(g.has_value(), "{}: no co-resident launch shape for T = {}, D = {}, {} ranks per device, {} resident blocks",
        op, p.T, p.D, p.comm.co_resident_ranks, p.comm.resident_blocks);
#ifdef DELTASERVE_WITH_CUDA
  detail::launch_fused_ar_norm(p, *g);
#else
  DS_THROW("{}: deltaserve was built without CUDA", op);
#endif
}

void peer_all_reduce(const PeerAllReduceParams& p) {
  constexpr const char* op = "peer_all_reduce";
  CHECK(act_dtype(p.dtype), "{}: dtype {} (bf16 or fp16)", op, dtype_name(p.dtype));
  check_comm(p.comm, p.stream, op);
  CHECK(p.count % 8 == 0 && p.count <= p.comm.slot_elems, "{}: count {} (a multiple of 8, at most {})", op, p.count,
        p.comm.slot_elems);
  if (p.count == 0) return;
  CHECK(p.in && p.out && aligned16(p.in) && aligned16(p.out), "{}: null or misaligned operand", op);
#ifdef DELTASERVE_WITH_CUDA
  detail::launch_peer_all_reduce(p, peer_all_reduce_blocks(p.count, p.comm.co_resident_ranks, p.comm.resident_blocks));
#else
  DS_THROW("{}: deltaserve was built without CUDA", op);
#endif
}

#ifdef DELTASERVE_WITH_CUDA

void init_buffers(void* base, int world, size_t slot_elems, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(base, 0xFF, buffer_bytes(world, slot_elems), stream));  // every slot: sentinel
  CUDA_CHECK(cudaMemsetAsync(base, 0, sizeof(ArState), stream));
}

uint32_t read_error(const RankView& v) {
  uint32_t e = 0;
  CUDA_CHECK(cudaMemcpy(&e, &v.state->error, sizeof e, cudaMemcpyDeviceToHost));
  return e;
}

ArState read_state(const RankView& v) {
  ArState st{};
  CUDA_CHECK(cudaMemcpy(&st, v.state, sizeof st, cudaMemcpyDeviceToHost));
  return st;
}

namespace detail {
void throw_cuda_error(int err, const char* expr, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(err);
  DS_THROW("{}:{}: {} failed: {}: {}", file, line, expr, cudaGetErrorName(e), cudaGetErrorString(e));
}
}  // namespace detail

#else

int device_resident_blocks(int) { DS_THROW("all-reduce: built without CUDA"); }
void init_buffers(void*, int, size_t, cudaStream_t) { DS_THROW("all-reduce buffers: built without CUDA"); }
uint32_t read_error(const RankView&) { DS_THROW("all-reduce buffers: built without CUDA"); }
ArState read_state(const RankView&) { DS_THROW("all-reduce buffers: built without CUDA"); }
namespace detail {
void throw_cuda_error(int, const char* expr, const char*, int) { DS_THROW("{}: built without CUDA", expr); }
}  // namespace detail

#endif

}  // namespace ds::allreduce
