// Device discovery that works in every build: false/0 when CUDA is not built or no GPU is present.
#pragma once

#include <cstddef>
#include <string>

namespace ds {

// True when this binary has CUDA support and a usable GPU is present.
bool cuda_device_available();
// Compute capability as major*10+minor (90 for Hopper) of the current device; 0 when none.
int cuda_device_arch();
std::string cuda_device_name();
// Visible CUDA devices (CUDA_VISIBLE_DEVICES applies); 0 when CUDA is not built or no GPU is present.
int cuda_device_count();
// Device-to-device copy bandwidth of the current device in bytes/s, bytes read + written: the median of 9 copies of
// `bytes` after 2 warm-up copies, timed with CUDA events. The ceiling bandwidth figures are judged against, measured
// on the card at hand (an H100 copies ~3.0 TB/s, an H200 ~4.26). 0 when no GPU is present or the two buffers do
// not fit (the CUDA error is cleared, nothing stays allocated).
double cuda_copy_bandwidth(size_t bytes = size_t{1} << 30);
// Makes `device` the calling thread's current device; ds::Error naming it and the visible count otherwise.
void cuda_select_device(int device);

}  // namespace ds
