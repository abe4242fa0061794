// The trainer's `session` subcommand: one session driven through every
// session RPC, its trajectory printed as JSON (see session_step.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "session.h"

namespace rollout_cpp {

struct SessionStepOptions {
  uint32_t prompt_len = 200;  // --prompt-len
  uint32_t max_tokens = 16;   // --max-tokens, per turn
  std::vector<uint32_t> append_ids;  // --append-ids; empty: the default rule
  std::optional<uint32_t> max_total_tokens;  // --max-total-tokens; unset: the context
  bool keep_open = false;  // --keep-open: leave the session for another process
};

// Runs the step on a channel the caller made (and waited SERVING on);
// returns the exit status: 0, or 1 after reporting the failed call.
int RunSessionStep(pb::RolloutService::StubInterface& stub, const ContextFactory& context,
                   const SessionStepOptions& o);

}  // namespace rollout_cpp
