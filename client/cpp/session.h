// Sessions from C++: one multi-turn trajectory that the server holds as token
// ids from its prompt to its last turn (docs/sessions.md), so that nothing
// sampled is ever tokenized again between turns. The counterpart of
// client/rollout_client/sessions.py; the proto states every rule.
//
//   rollout_cpp::Session s(stub, [&] { return connection.Context(); });
//   pb::OpenSessionResponse opened;
//   grpc::Status st = s.Open(rollout_cpp::OpenFromIds(prompt), &opened);
//   pb::SessionGenerateResponse turn;
//   st = s.Generate(params, &turn);           // the model's turn
//   pb::AppendToSessionResponse added;
//   st = s.Append(tool_output_ids, &added);   // the environment's output
//   pb::GetSessionResponse t;
//   st = s.Trajectory(&t);                    // ids, sources, logprobs, spans
//   std::vector<int> mask = rollout_cpp::LossMask(t);
//
// Every method returns the call's grpc::Status (nothing throws or exits), so
// the caller decides what a refusal means.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rollout/v1/rollout.grpc.pb.h"

namespace rollout_cpp {

namespace pb = rollout::v1;

// A new context for each call, with its deadline and the bearer token (the
// channel carries TLS): the trainer's own, so that a session calls with the
// credentials of its other calls.
using ContextFactory = std::function<std::unique_ptr<grpc::ClientContext>()>;

class Session {
 public:
  Session(pb::RolloutService::StubInterface& stub, ContextFactory context);
  // Closes the session if it is still open, ignoring the outcome: an open
  // session reserves its whole budget on the server until its idle timeout.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Opens it (once per object); on success id() names it.
  grpc::Status Open(const pb::OpenSessionRequest& request, pb::OpenSessionResponse* opened);
  // The next model turn; `params` as Generate takes them (n must be 1).
  grpc::Status Generate(const pb::SamplingParams& params, pb::SessionGenerateResponse* turn,
                        const std::string& request_id = "");
  // The environment's output as token ids, held as they are.
  grpc::Status Append(const std::vector<uint32_t>& token_ids, pb::AppendToSessionResponse* added);
  // The environment's output as chat messages, rendered by the server's
  // template (see AppendToSessionRequest).
  grpc::Status Append(const std::vector<pb::ChatMessage>& messages,
                      pb::AppendToSessionResponse* added);
  // GetSession: every held token with its source and logprob, the version
  // spans and the segments.
  grpc::Status Trajectory(pb::GetSessionResponse* trajectory);
  // CloseSession. `closed` may be null.
  grpc::Status Close(pb::CloseSessionResponse* closed = nullptr);
  // Stops owning it: the destructor leaves it open (another process reads or
  // closes it by id()).
  void Release() { owned_ = false; }

  const std::string& id() const { return id_; }

 private:
  grpc::Status NotOpen() const;

  pb::RolloutService::StubInterface& stub_;
  ContextFactory context_;
  std::string id_;
  bool owned_ = false;  // opened here, not yet closed or released
};

// An OpenSessionRequest holding `prompt` as token ids; `max_total_tokens`
// unset: the model's context.
pb::OpenSessionRequest OpenFromIds(const std::vector<uint32_t>& prompt,
                                   std::optional<uint32_t> max_total_tokens = std::nullopt);

// A text-only chat message, e.g. TextMessage("tool", "391").
pb::ChatMessage TextMessage(const std::string& role, const std::string& text);

// 1 for each sampled token (what a trainer's loss counts), 0 for prompt and
// appended ones, aligned with trajectory.token_ids.
std::vector<int> LossMask(const pb::GetSessionResponse& trajectory);

}  // namespace rollout_cpp
