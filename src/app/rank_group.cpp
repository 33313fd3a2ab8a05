// The wiring point between the process layer (parallel_cli.cpp) and the engine's TEP/DEP implementation
// (NcclGroup, CudaEngineOptions::group, DeviceModelOptions' rank fields): nothing else in src/app knows how a
// group or a rank's engine is built.
#include "app/parallel_cli.h"
#include "core/error.h"
#include "runtime/parallel/nccl_group.h"

namespace ds::app {

std::shared_ptr<parallel::Group> make_rank_group(const parallel::RankEnv& env, const parallel::ParallelSpec& spec,
                                                 const ModelConfig& config) {
  // Peer buffers for the fused MoE finalize + all-reduce + RMSNorm: at most 16 tokens of hidden_size (TEP only).
  const size_t peer_slot = spec.mode == parallel::Mode::kTep ? 16 * static_cast<size_t>(config.hidden_size) : 0;
  return parallel::NcclGroup::from_rank_env(env, spec.mode, peer_slot);
}

void configure_rank_engine(CudaEngineOptions& engine, DeviceModelOptions& model,
                           std::shared_ptr<parallel::Group> group, const parallel::ParallelSpec& spec) {
  const int r = group->rank();
  if (spec.mode == parallel::Mode::kTep) {  // heads, dense rows and experts over the tp ranks (ep == tp)
    model.tp_rank = r, model.tp_size = spec.tp;
    model.ep_rank = r, model.ep_size = spec.ep;
  } else {  // DEP: attention whole on every rank, experts over the ranks
    model.tp_rank = 0, model.tp_size = 1;
    model.ep_rank = r, model.ep_size = spec.ep;
  }
  engine.group = std::move(group);
}

}  // namespace ds::app
