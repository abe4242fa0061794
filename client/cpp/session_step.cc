// rollout_trainer session: GetServerInfo, then one session from start to
// end: OpenSession with the prompt's ids, a greedy turn, AppendToSession of
// the environment's ids, a second greedy turn, GetSession, CloseSession
// (unless --keep-open). Prints one JSON object on stdout: the session id, the
// prompt, each turn (its sampled ids and logprobs), what the append added,
// and the trajectory (token_ids, sources, logprobs, loss_mask, version_spans,
// segments). A failed call prints rollout_trainer's failure object with the
// session_id, closes the session and exits 1.
//
// The prompt follows the trainer's rule: token i is (31 i + 7) mod
// vocab_size; without --append-ids the append is the rule's next 4 ids (so
// inside the vocabulary). Turns are greedy with ignore_eos: each samples
// exactly --max-tokens ids, the same ones on the same weights.
#include "session_step.h"

#include <iostream>
#include <string>

#include "json.h"
#include "status.h"

namespace rollout_cpp {
namespace {

constexpr uint32_t kDefaultAppended = 4;

std::vector<uint32_t> RuleIds(uint32_t from, uint32_t count, uint32_t vocab) {
  std::vector<uint32_t> out;
  for (uint32_t i = from; i < from + count; ++i)
    out.push_back(static_cast<uint32_t>((31ULL * i + 7) % vocab));
  return out;
}

pb::SamplingParams Greedy(uint32_t max_tokens) {
  pb::SamplingParams sp;
  sp.set_max_tokens(max_tokens);
  sp.set_temperature(0.0f);
  sp.set_ignore_eos(true);  // every turn its full length: the test knows the counts
  return sp;
}

std::string TurnJson(const pb::SessionGenerateResponse& r) {
  const pb::Completion& c = r.completion();
  const pb::SessionState& s = r.state();
  return Obj({{"request_id", Quote(r.request_id())},
              {"weight_version", Quote(r.weight_version())},
              {"token_ids", Ints(c.token_ids())},
              {"logprobs", List(c.logprobs(), [](float v) { return Num(v); })},
              {"finish_reason", Quote(pb::FinishReason_Name(c.finish_reason()))},
              {"prompt_tokens", std::to_string(r.usage().prompt_tokens())},
              {"cached_prompt_tokens", std::to_string(r.usage().cached_prompt_tokens())},
              {"segment_index", std::to_string(s.segment_index())},
              {"total_tokens", std::to_string(s.total_tokens())},
              {"budget_remaining", std::to_string(s.budget_remaining())},
              {"generation_prompt_token_ids", Ints(s.generation_prompt_token_ids())},
              {"resumed", Bool(s.resumed())}});
}

std::string TrajectoryJson(const pb::GetSessionResponse& t) {
  auto source = [](int s) { return Quote(pb::TokenSource_Name(static_cast<pb::TokenSource>(s))); };
  return Obj(
      {{"token_ids", Ints(t.token_ids())},
       {"sources", List(t.sources(), source)},
       {"logprobs", List(t.logprobs(), [](float v) { return Num(v); })},
       {"loss_mask", Ints(LossMask(t))},
       {"version_spans", List(t.version_spans(),
                              [](const pb::VersionSpan& v) {
                                return Obj({{"weight_version", Quote(v.weight_version())},
                                            {"start", std::to_string(v.start())},
                                            {"count", std::to_string(v.count())}});
                              })},
       {"segments", List(t.segments(),
                         [&](const pb::TrajectorySegment& g) {
                           return Obj({{"source", source(g.source())},
                                       {"start", std::to_string(g.start())},
                                       {"count", std::to_string(g.count())},
                                       {"finish_reason", Quote(pb::FinishReason_Name(g.finish_reason()))},
                                       {"stop_reason", Quote(g.stop_reason())}});
                         })},
       {"max_total_tokens", std::to_string(t.max_total_tokens())},
       {"busy", Bool(t.busy())}});
}

}  // namespace

int RunSessionStep(pb::RolloutService::StubInterface& stub, const ContextFactory& context,
                   const SessionStepOptions& o) {
  pb::GetServerInfoResponse info;
  {
    auto ctx = context();
    grpc::Status st = stub.GetServerInfo(ctx.get(), pb::GetServerInfoRequest(), &info);
    if (st.ok() && info.vocab_size() == 0)
      st = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "vocab_size is 0");
    if (!st.ok()) {
      ReportFailure("GetServerInfo", st);
      return 1;
    }
  }
  const std::vector<uint32_t> prompt = RuleIds(0, o.prompt_len, info.vocab_size());
  const std::vector<uint32_t> appended =
      o.append_ids.empty() ? RuleIds(o.prompt_len, kDefaultAppended, info.vocab_size())
                           : o.append_ids;

  Session s(stub, context);  // closes the session on every early return
  auto failed = [&](const std::string& step, const grpc::Status& st) {
    ReportFailure(step, st, {{"session_id", Quote(s.id())}});
    return 1;
  };
  auto turn = [&](const std::string& step, pb::SessionGenerateResponse* r) {
    grpc::Status st = s.Generate(Greedy(o.max_tokens), r);
    if (st.ok() && r->completion().logprobs_size() != r->completion().token_ids_size())
      st = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "logprobs not aligned with tokens");
    if (st.ok())
      std::cerr << "rollout_trainer: " << step << ": " << r->completion().token_ids_size()
                << " tokens, " << pb::FinishReason_Name(r->completion().finish_reason())
                << ", version " << r->weight_version() << "\n";
    return st;
  };

  pb::OpenSessionResponse opened;
  grpc::Status st = s.Open(OpenFromIds(prompt, o.max_total_tokens), &opened);
  if (!st.ok()) return failed("OpenSession", st);
  std::cerr << "rollout_trainer: OpenSession: " << s.id() << ", " << opened.prompt_token_ids_size()
            << " prompt tokens, budget " << opened.max_total_tokens() << "\n";

  pb::SessionGenerateResponse first, second;
  if (!(st = turn("SessionGenerate (turn 1)", &first)).ok())
    return failed("SessionGenerate (turn 1)", st);
  pb::AppendToSessionResponse added;
  if (!(st = s.Append(appended, &added)).ok()) return failed("AppendToSession", st);
  std::cerr << "rollout_trainer: AppendToSession: " << added.token_ids_size() << " ids, "
            << added.total_tokens() << " held\n";
  if (!(st = turn("SessionGenerate (turn 2)", &second)).ok())
    return failed("SessionGenerate (turn 2)", st);

  pb::GetSessionResponse t;
  if (!(st = s.Trajectory(&t)).ok()) return failed("GetSession", st);
  // The mask and the JSON index sources and logprobs by token position.
  if (t.sources_size() != t.token_ids_size() || t.logprobs_size() != t.token_ids_size())
    return failed("GetSession", grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "sources or logprobs not aligned with token_ids"));

  bool closed = false;
  if (o.keep_open) {
    s.Release();
  } else {
    if (!(st = s.Close()).ok()) return failed("CloseSession", st);
    closed = true;
  }
  std::cout << Obj({{"ok", "true"},
                    {"session_id", Quote(opened.session_id())},
                    {"weight_version", Quote(opened.weight_version())},
                    {"max_total_tokens", std::to_string(opened.max_total_tokens())},
                    {"vocab_size", std::to_string(info.vocab_size())},
                    {"prompt_token_ids", Ints(opened.prompt_token_ids())},
                    {"turns", "[" + TurnJson(first) + ", " + TurnJson(second) + "]"},
                    {"appended", Obj({{"token_ids", Ints(added.token_ids())},
                                      {"total_tokens", std::to_string(added.total_tokens())},
                                      {"budget_remaining",
                                       std::to_string(added.budget_remaining())}})},
                    {"trajectory", TrajectoryJson(t)},
                    {"closed", Bool(closed)}})
            << std::endl;
  return 0;
}

}  // namespace rollout_cpp
