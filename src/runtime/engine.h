// Engine interface: requests in, tokens out, one step at a time. The CPU engine implements it now; the CUDA
// engine and the HTTP server code against this header.
//
// Threading contract: an Engine is NOT thread-safe. add_request(), cancel(), step(), has_work() and stats() are
// all called from one engine thread (the server owns that thread and hands requests to it through its own queue).
//
// Request lifecycle: add_request() validates and queues (waiting) -> admitted into a free state slot (running) ->
// prefill (possibly over several steps: chunked prefill) -> one token per step -> finished with reason
//   stop       a stop token was generated (model eos ids unless ignore_eos, plus the request's stop_token_ids);
//              the stop token is part of new_tokens (callers skip special tokens when rendering text)
//   length     max_tokens generated, or the sequence reached the engine's max_model_len
//   cancelled  cancel() was called; reported by the next step() with no new tokens
// A finished or cancelled request frees its slot at once and is reported exactly once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/sampler.h"

namespace ds {

using RequestId = uint64_t;

enum class FinishReason { kNone, kStop, kLength, kCancelled };
// "stop" | "length" | "cancelled" | "" (kNone): the OpenAI finish_reason strings.
const char* finish_reason_name(FinishReason r);

struct Request {
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams sampling;
};

// What one step() produced for one request.
struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;  // tokens generated in this step (in order)
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  int prompt_tokens = 0;            // prompt length
  int generated_tokens = 0;         // total generated so far, including new_tokens
  // Non-empty: the request was refused after add_request() had accepted it (finished is true, no tokens).
  // Engines refuse in add_request and never set it; a DEP group's driver does, when the worker rank it sent the
  // request to refused it (runtime/parallel/driver_engine.h). Callers treat it like add_request's error.
  // ({}: brace-initialised outputs need not list it.)
  std::string error{};
};

struct EngineStats {
  int running = 0;          // requests holding a state slot
  int waiting = 0;          // requests queued for a slot
  int slots_in_use = 0;
  int free_slots = 0;
  int max_seqs = 0;
  int64_t steps = 0;
  int64_t prompt_tokens = 0;     // prompt tokens prefilled so far
  int64_t generated_tokens = 0;  // tokens sampled so far
};

// The finish rule every engine applies after each sampled token: kStop for an eos id (unless ignore_eos) or a
// stop_token_ids entry, else kLength at max_tokens generated or at max_model_len total tokens (0: no limit).
FinishReason finish_after(int32_t token, int generated, int64_t total_len, const SamplingParams& p,
                          const std::vector<int32_t>& eos_token_ids, int64_t max_model_len);

class Engine {
 public:
  virtual ~Engine() = default;

  // Validates (non-empty prompt, ids inside the vocabulary, sampling params, length limit) and queues the
  // request. Throws ds::Error with a message fit for a client (HTTP 400) and queues nothing on error.
  virtual RequestId add_request(Request request) = 0;
  // Cancels a waiting or running request; false if the id is unknown or already finished.
  virtual bool cancel(RequestId id) = 0;
  // Admits, prefills and decodes; returns an entry for every request that produced a token or finished.
  virtual std::vector<RequestOutput> step() = 0;
  // True while anything is waiting, running or still to be reported.
  virtual bool has_work() const = 0;
  virtual EngineStats stats() const = 0;
  virtual const ModelConfig& config() const = 0;
};

}  // namespace ds
