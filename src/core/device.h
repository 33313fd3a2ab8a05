// Device discovery that works in every build: false/0 when CUDA is not built or no GPU is present.
#pragma once

#include <string>

namespace ds {

// True when this binary has CUDA support and a usable GPU is present.
bool cuda_device_available();
// Compute capability as major*10+minor (90 for Hopper) of the current device; 0 when none.
int cuda_device_arch();
std::string cuda_device_name();
// Visible CUDA devices (CUDA_VISIBLE_DEVICES applies); 0 when CUDA is not built or no GPU is present.
int cuda_device_count();
// Makes `device` the calling thread's current device; ds::Error naming it and the visible count otherwise.
void cuda_select_device(int device);

}  // namespace ds
