// `deltaserve info`: build features, device, knobs.
#include <cstdio>

#include "app/commands.h"
#include "core/device.h"
#include "core/env.h"

namespace {

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print build features, the GPU found and every DELTASERVE_* knob");
  cmd->callback([] {
    ds::knobs::validate_all();
#ifdef DELTASERVE_WITH_CUDA
    std::printf("cuda: built (sm_90a)\n");
#else
    std::printf("cuda: not built\n");
#endif
    std::printf("gpu: %s (arch %d)\n", ds::cuda_device_name().c_str(), ds::cuda_device_arch());
    std::printf("%s", ds::knobs::help_text().c_str());
  });
}

}  // namespace

DS_REGISTER_COMMAND(90, setup);
