// Pointer alignment checks for the kernels' host-side operand checks (16-byte vector loads and stores).
#pragma once

#include <cstdint>

namespace ds {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace ds
