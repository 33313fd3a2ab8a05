// Device discovery that works in every build: false/0 when CUDA is not built or no GPU is present.
#pragma once

#include <string>

namespace ds {

// True when this binary has CUDA support and a usable GPU is present.
bool cuda_device_available();
// Compute capability as major*10+minor (90 for Hopper) of the current device; 0 when none.
int cuda_device_arch();
std::string cuda_device_name();

}  // namespace ds
