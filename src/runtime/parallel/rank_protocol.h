// The host-side messages between the driver rank (rank 0) and the worker ranks of a TEP/DEP group, carried by
// Group::exchange between engine steps: rank 0's Frame (what every rank does next: step after applying these
// adds and cancels, idle heartbeat, shutdown, abort) and each rank's Report (its error, and under DEP its step
// outputs). A small versioned binary format, decoded with bounds checks: a malformed message is an error
// naming the rank, never undefined behaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ds::parallel {

// What every rank does after the exchange that carried this frame.
enum class FrameKind : uint8_t {
  kStep = 1,      // apply the adds and cancels addressed to this rank, then step()
  kIdle = 2,      // heartbeat while rank 0 has no work: nothing (keeps the group's collectives under their timeout)
  kShutdown = 3,  // rank 0 finished normally: return from the worker loop
  kAbort = 4,     // rank 0 failed: end with `message` ("rank 0 failed: ...")
};

struct AddCommand {
  int rank = -1;      // the rank that runs it (DEP); -1: every rank (TEP replicas)
  RequestId id = 0;   // the group-wide id (rank 0's); workers map it to their engine's own id
  Request request;    // sampling.seed is always set by rank 0 (so every replica draws the same tokens)
};

struct CancelCommand {
  int rank = -1;  // as AddCommand::rank
  RequestId id = 0;
};

struct Frame {
  FrameKind kind = FrameKind::kStep;
  std::vector<AddCommand> adds;
  std::vector<CancelCommand> cancels;
  std::string message;  // kAbort: why
};

struct Refusal {
  RequestId id = 0;  // group-wide id of a request this rank's engine refused (add_request threw)
  std::string message;
};

// One rank's answer. TEP workers send it before each step (error of the previous step); under DEP every rank
// sends it after each step (its outputs, whether it still has work, its stats).
struct Report {
  std::string error;                  // non-empty: this rank failed; every rank stops
  bool has_work = false;
  std::vector<RequestOutput> outputs;  // group-wide ids
  std::vector<Refusal> refused;
  EngineStats stats;
};

std::string encode(const Frame& f);
std::string encode(const Report& r);
// `from` names the sender in the error a malformed message raises.
Frame decode_frame(const std::string& bytes, int from);
Report decode_report(const std::string& bytes, int from);

// Decodes the reports msgs[first..] (rank r sent msgs[r]); the first error as "rank r failed: <error>", or "".
std::string first_rank_error(const std::vector<std::string>& msgs, int first);

}  // namespace ds::parallel
