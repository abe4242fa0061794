#include "status.h"

#include <cstdint>
#include <iostream>

#include "json.h"

namespace rollout_cpp {

const char* CodeName(grpc::StatusCode c) {
  static const char* names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? names[i] : "UNKNOWN";
}

namespace {

// The length-delimited fields numbered `field` of one serialized protobuf
// message: all that reading google.rpc.Status, Any and ErrorInfo needs, so
// the program links no generated code for them.
std::vector<std::string> ProtoFields(const std::string& buf, uint32_t field) {
  std::vector<std::string> out;
  size_t i = 0;
  auto varint = [&]() -> uint64_t {
    uint64_t v = 0;
    for (int shift = 0; i < buf.size() && shift < 64; shift += 7) {
      uint8_t b = static_cast<uint8_t>(buf[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) break;
    }
    return v;
  };
  while (i < buf.size()) {
    uint64_t key = varint();
    switch (key & 7) {
      case 0: varint(); break;
      case 1: i += 8; break;
      case 5: i += 4; break;
      case 2: {
        uint64_t n = varint();
        if (n > buf.size() - i) return out;
        if ((key >> 3) == field) out.push_back(buf.substr(i, n));
        i += n;
        break;
      }
      default: return out;
    }
  }
  return out;
}

}  // namespace

std::string ErrorReason(const grpc::Status& s) {
  const std::string suffix = "/google.rpc.ErrorInfo";
  for (const std::string& any : ProtoFields(s.error_details(), 3)) {
    auto type = ProtoFields(any, 1);
    auto value = ProtoFields(any, 2);
    if (type.empty() || value.empty() || type[0].size() < suffix.size() ||
        type[0].compare(type[0].size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    auto reason = ProtoFields(value[0], 1);
    return reason.empty() ? "" : reason[0];
  }
  return "";
}

void ReportFailure(const std::string& step, const grpc::Status& s,
                   const std::vector<std::pair<std::string, std::string>>& extra) {
  std::cerr << "rollout_trainer: " << step << " failed: " << CodeName(s.error_code()) << ": "
            << s.error_message() << "\n";
  std::vector<std::pair<std::string, std::string>> fields = {
      {"ok", "false"},
      {"step", Quote(step)},
      {"code", Quote(CodeName(s.error_code()))},
      {"reason", Quote(ErrorReason(s))},
      {"message", Quote(s.error_message())}};
  fields.insert(fields.end(), extra.begin(), extra.end());
  std::cout << Obj(fields) << std::endl;
}

}  // namespace rollout_cpp
