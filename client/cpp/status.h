// How a failed call is reported, the same for every step of the trainer:
// the gRPC status code by name, the server's ErrorInfo reason and its message,
// on stderr for a person and as one JSON object on stdout for a script.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

namespace rollout_cpp {

// "INVALID_ARGUMENT" for grpc::StatusCode::INVALID_ARGUMENT.
const char* CodeName(grpc::StatusCode c);

// The ErrorInfo reason of a status (rollout.v1.ErrorReason's name without
// its prefix, e.g. "ROLE_DENIED"), from its google.rpc.Status details;
// "" for statuses gRPC made itself.
std::string ErrorReason(const grpc::Status& s);

// Prints `step failed: CODE: message` to stderr and
// {"ok": false, "step", "code", "reason", "message", extra...} to stdout.
void ReportFailure(const std::string& step, const grpc::Status& s,
                   const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace rollout_cpp
