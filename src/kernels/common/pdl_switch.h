// The process-wide programmatic dependent launch switch (DELTASERVE_PDL), kept apart from pdl.cuh so host-only
// translation units can set it. Off: every kernel launches with full stream serialisation (pdl::wait() is then a
// no-op), the ground truth that a PDL read race shows against (CudaForwardTiny.PdlOnAndOffGiveIdenticalBits).
#pragma once

#include <atomic>

namespace ds::pdl {

inline std::atomic<bool> g_enabled{true};

inline void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace ds::pdl
