#include "session.h"

#include <utility>

namespace rollout_cpp {

Session::Session(pb::RolloutService::StubInterface& stub, ContextFactory context)
    : stub_(stub), context_(std::move(context)) {}

Session::~Session() {
  if (owned_) Close();
}

// Refused here rather than sent: the server would answer an empty
// session_id with INVALID_ARGUMENT, which reads as the caller's bad input.
grpc::Status Session::NotOpen() const {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the session is not open");
}

grpc::Status Session::Open(const pb::OpenSessionRequest& request, pb::OpenSessionResponse* opened) {
  if (!id_.empty())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this Session already opened " + id_);
  auto ctx = context_();
  grpc::Status st = stub_.OpenSession(ctx.get(), request, opened);
  if (st.ok()) {
    id_ = opened->session_id();
    owned_ = true;
  }
  return st;
}

grpc::Status Session::Generate(const pb::SamplingParams& params, pb::SessionGenerateResponse* turn,
                               const std::string& request_id) {
  if (id_.empty()) return NotOpen();
  pb::SessionGenerateRequest req;
  req.set_session_id(id_);
  req.set_request_id(request_id);
  *req.mutable_sampling_params() = params;
  auto ctx = context_();
  return stub_.SessionGenerate(ctx.get(), req, turn);
}

grpc::Status Session::Append(const std::vector<uint32_t>& token_ids,
                             pb::AppendToSessionResponse* added) {
  if (id_.empty()) return NotOpen();
  pb::AppendToSessionRequest req;
  req.set_session_id(id_);
  for (uint32_t t : token_ids) req.add_token_ids(t);
  auto ctx = context_();
  return stub_.AppendToSession(ctx.get(), req, added);
}

grpc::Status Session::Append(const std::vector<pb::ChatMessage>& messages,
                             pb::AppendToSessionResponse* added) {
  if (id_.empty()) return NotOpen();
  pb::AppendToSessionRequest req;
  req.set_session_id(id_);
  for (const auto& m : messages) *req.add_messages() = m;
  auto ctx = context_();
  return stub_.AppendToSession(ctx.get(), req, added);
}

grpc::Status Session::Trajectory(pb::GetSessionResponse* trajectory) {
  if (id_.empty()) return NotOpen();
  pb::GetSessionRequest req;
  req.set_session_id(id_);
  auto ctx = context_();
  return stub_.GetSession(ctx.get(), req, trajectory);
}

grpc::Status Session::Close(pb::CloseSessionResponse* closed) {
  if (id_.empty()) return NotOpen();
  pb::CloseSessionRequest req;
  req.set_session_id(id_);
  pb::CloseSessionResponse ignored;
  auto ctx = context_();
  grpc::Status st = stub_.CloseSession(ctx.get(), req, closed ? closed : &ignored);
  // Whatever the answer, asking again cannot do better: NOT_FOUND means it
  // is gone already, and a failed call leaves the idle timeout to free it.
  owned_ = false;
  return st;
}

pb::OpenSessionRequest OpenFromIds(const std::vector<uint32_t>& prompt,
                                   std::optional<uint32_t> max_total_tokens) {
  pb::OpenSessionRequest req;
  for (uint32_t t : prompt) req.add_prompt_token_ids(t);
  if (max_total_tokens) req.set_max_total_tokens(*max_total_tokens);
  return req;
}

pb::ChatMessage TextMessage(const std::string& role, const std::string& text) {
  pb::ChatMessage m;
  m.set_role(role);
  m.add_content()->set_text(text);
  return m;
}

std::vector<int> LossMask(const pb::GetSessionResponse& trajectory) {
  std::vector<int> mask;
  mask.reserve(trajectory.sources_size());
  for (int s : trajectory.sources()) mask.push_back(s == pb::TOKEN_SOURCE_SAMPLED ? 1 : 0);
  return mask;
}

}  // namespace rollout_cpp
