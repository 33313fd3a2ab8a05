// THE WIRING POINT between the process layer (parallel_cli.cpp) and the engine's TEP/DEP implementation
// (branch tp-engine): the NCCL group of a launched rank, and handing it to the CUDA engine. Nothing else in
// src/app knows how a group is built.
#include <type_traits>
#include <utility>

#include "app/parallel_cli.h"
#include "core/error.h"

namespace ds::app {

std::shared_ptr<parallel::Group> make_rank_group(const parallel::RankEnv& env, const parallel::ParallelSpec& spec) {
  // >>> tp-engine merge: build the NCCL group here, e.g.
  //       auto comm = parallel::Communicator::from_rank_env(env);        // rank 0 publishes the NCCL id
  //       return parallel::make_nccl_group(std::move(comm), spec.mode);  // (the tp-engine constructor)
  //     and delete the throw below.
  DS_THROW("rank {}: this build has no NCCL group for --mode {} yet: the engine side of tensor/expert parallelism "
           "(branch tp-engine) provides it; wire it in src/app/rank_group.cpp",
           env.rank, parallel::to_string(spec.mode));
}

namespace {
// CudaEngineOptions::group arrives with the tp-engine branch; until then a rank cannot be given its group and
// says so (never a silently unsharded engine). After the merge this is `options.group = std::move(group)`.
template <class Options>
void set_group(Options& options, std::shared_ptr<parallel::Group> group) {
  if constexpr (requires { options.group = std::move(group); }) {
    options.group = std::move(group);
  } else {
    DS_THROW("this build's CUDA engine takes no parallel group (CudaEngineOptions::group, branch tp-engine)");
  }
}
}  // namespace

void set_engine_group(CudaEngineOptions& options, std::shared_ptr<parallel::Group> group) {
  set_group(options, std::move(group));
}

}  // namespace ds::app
