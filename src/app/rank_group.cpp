// THE WIRING POINT between the process layer (parallel_cli.cpp) and the engine's TEP/DEP implementation
// (branch tp-engine: NcclGroup, CudaEngineOptions::group, DeviceModelOptions' rank fields). Nothing else in
// src/app knows how a group or a rank's engine is built. Until that branch is merged (its nccl_group.h is absent)
// a rank refuses with a clear error instead of running an unsharded engine; after the merge the #if goes.
#include "app/parallel_cli.h"
#include "core/error.h"

#if __has_include("runtime/parallel/nccl_group.h")
#include "runtime/parallel/nccl_group.h"
#define DS_HAVE_RANK_ENGINE 1
#endif

namespace ds::app {

std::shared_ptr<parallel::Group> make_rank_group(const parallel::RankEnv& env, const parallel::ParallelSpec& spec,
                                                 const ModelConfig& config) {
#ifdef DS_HAVE_RANK_ENGINE
  // Peer buffers for the fused MoE finalize + all-reduce + RMSNorm: at most 16 tokens of hidden_size (TEP only).
  const size_t peer_slot = spec.mode == parallel::Mode::kTep ? 16 * static_cast<size_t>(config.hidden_size) : 0;
  return parallel::NcclGroup::from_rank_env(env, spec.mode, peer_slot);
#else
  (void)config;
  DS_THROW("rank {}: this build has no NCCL group for --mode {}: the engine side of tensor/expert parallelism "
           "(branch tp-engine) provides it; it is wired in src/app/rank_group.cpp",
           env.rank, parallel::to_string(spec.mode));
#endif
}

void configure_rank_engine(CudaEngineOptions& engine, DeviceModelOptions& model,
                           std::shared_ptr<parallel::Group> group, const parallel::ParallelSpec& spec) {
#ifdef DS_HAVE_RANK_ENGINE
  const int r = group->rank();
  if (spec.mode == parallel::Mode::kTep) {  // heads and dense rows over tp ranks; experts over ep (= tp, or 1)
    model.tp_rank = r, model.tp_size = spec.tp;
    model.ep_rank = spec.ep == 1 ? 0 : r, model.ep_size = spec.ep;
  } else {  // DEP: attention whole on every rank, experts over the ranks
    model.tp_rank = 0, model.tp_size = 1;
    model.ep_rank = r, model.ep_size = spec.ep;
  }
  engine.group = std::move(group);
#else
  (void)engine, (void)model, (void)group, (void)spec;
  DS_THROW("this build's CUDA engine has no tensor/expert parallelism (branch tp-engine)");
#endif
}

}  // namespace ds::app
