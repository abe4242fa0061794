// rollout_trainer: a small C++ trainer client of rollout-service, built from
// proto/rollout/v1/rollout.proto alone (stubs generated at build time).
//
// Against --target it: waits for grpc.health.v1 SERVING, calls GetServerInfo,
// Generates from token ids, pushes a small weight update with UpdateWeights
// (begin / chunks / commit: by default the final norm, or --tensor NAME and
// the rest of its parameter group, with bytes derived from --seed), Generates
// again, calls ResetCaches, and prints a JSON summary on stdout. Progress goes
// to stderr. Exit status 0 on success; on a failed call, 1 with a JSON
// {"ok": false, "step": ..., "code": ..., "reason": ..., "message": ...}
// (reason: the server's rollout.v1.ErrorReason, "" for gRPC's own statuses);
// 2 on bad usage.
//
//   rollout_trainer --target 127.0.0.1:50051 --version step-1 [--seed 1]
//       [--tensor NAME] [--prompt-len 200] [--max-tokens 16] [--chunk-bytes N]
//       [--token T | env ROLLOUT_TOKEN] [--tls-ca CA.pem [--tls-cert C.pem --tls-key K.pem]]
//       [--wait-seconds 300] [--timeout-seconds 600]
//
// The new tensor values: element i of tensor NAME is 1 + k/64 for a norm
// weight, k/1024 otherwise, with k = splitmix64 output % 97 - 48 from the state
// seed * 0x9E3779B97F4A7C15 + fnv1a64(NAME) (see NewValues). Every value is
// exact in bf16, fp16, fp32 and fp64, so any language can recompute the bytes.
// (splitmix64 output i from state x: mix(x + (i + 1) * 0x9E3779B97F4A7C15),
// mix(z) = z ^= z >> 30, z *= 0xBF58476D1CE4E5B9, z ^= z >> 27,
// z *= 0x94D049BB133111EB, z ^= z >> 31; all arithmetic modulo 2^64.)
//
// Delta mode, --base-seed S0 [--change-percent P] [--base-version V]: the
// tensors were last pushed with --seed S0, so the server holds S0's values,
// and the update sends them as a change against those (ChangedValues):
// element i takes seed S's value (S: --seed) when splitmix64 output i from the
// state (S + 2^32) * 0x9E3779B97F4A7C15 + fnv1a64(NAME), modulo 1000000, is
// below round(P * 10000), and keeps S0's value otherwise: about P percent of
// the elements change (P in [0, 100], default 3). The update names as
// UpdateWeightsBegin.base_version V, or by default GetServerInfo's
// delta_base_version (which must be the version the S0 push created), and
// sends each tensor as TENSOR_ENCODING_SPARSE_XOR16 (--encoding xor16, the
// default) or TENSOR_ENCODING_SPARSE_XOR8 (--encoding xor8) (the proto's
// TensorEncoding) of S0's bytes to the new bytes, with encoded_bytes and the
// crc32c of the new bytes; chunk offsets count inside the encoded bytes. A
// tensor whose encoding is not smaller than its bytes travels raw in the same
// update. When the server offers no delta base, or refuses the base
// (FAILED_PRECONDITION, reason DELTA_BASE_MISMATCH), the program pushes the
// same new bytes as a full update and says why in its summary
// ("delta": false, "fallback": "..."). The summary's update reports
// "raw_bytes" (the new tensors' bytes) and "encoded_bytes" (what travelled).
//
//   rollout_trainer --target HOST:PORT --version step-2 --base-seed 1 --seed 2
//       [--change-percent 3] [--base-version step-1] [--encoding xor16|xor8]
//       [the options above]
//
// Without a server, --encode-only OUT writes one tensor's SPARSE_XOR16 (or,
// with --encoding xor8, SPARSE_XOR8) bytes to OUT and prints a JSON summary
// (for tests of the encoding), either of the delta-mode change of a tensor
// NAME of N elements, or of two files of raw bytes (the same length, even for
// xor16):
//
//   rollout_trainer --encode-only OUT --tensor NAME --dtype bf16|fp16|fp32|fp64
//       --elements N --base-seed S0 [--seed S] [--change-percent P]
//   rollout_trainer --encode-only OUT --base-file BASE.bin --new-file NEW.bin
//
// The session subcommand drives one multi-turn session (docs/sessions.md)
// with the same credentials: open from the prompt's ids, a greedy turn,
// append --append-ids (default: 4 ids), a second turn, print the trajectory
// (token ids, sources, loss mask) as JSON, close it (session_step.cc):
//
//   rollout_trainer session --target HOST:PORT [--prompt-len 200] [--max-tokens 16]
//       [--append-ids 5,6,7] [--max-total-tokens N] [--keep-open]
//       [--token T] [--tls-ca ...] [--wait-seconds S] [--timeout-seconds S]

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "json.h"
#include "rollout/v1/rollout.grpc.pb.h"
#include "session_step.h"
#include "status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor bytes are written in host order, which must be little-endian"
#endif

namespace {

namespace pb = rollout::v1;
using Clock = std::chrono::system_clock;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using rollout_cpp::Bool;
using rollout_cpp::CodeName;
using rollout_cpp::ErrorReason;
using rollout_cpp::List;
using rollout_cpp::Num;
using rollout_cpp::Obj;
using rollout_cpp::Quote;
using rollout_cpp::ReportFailure;

constexpr int kMaxMessageBytes = 64 << 20;  // docs/clients.md: raise both limits

// ---------------------------------------------------------------- options

struct Options {
  std::string target = "127.0.0.1:50051";
  std::string version;
  uint64_t seed = 1;
  std::string tensor;
  uint32_t prompt_len = 200;
  uint32_t max_tokens = 16;
  uint64_t chunk_bytes = 0;  // 0: the server's recommended_chunk_bytes
  std::string token;
  std::string tls_ca, tls_cert, tls_key;
  double wait_seconds = 300;
  double timeout_seconds = 600;
  // Delta mode (--base-seed): the seed the server's bytes came from.
  std::optional<uint64_t> base_seed;
  double change_percent = 3;
  std::string base_version;  // "": GetServerInfo.delta_base_version
  std::string encoding = "xor16";  // --encoding: xor16 or xor8
  // --encode-only: no server.
  std::string encode_only, base_file, new_file, dtype;
  uint64_t elements = 0;
  bool elements_set = false;
  // The session subcommand (session_step.h); prompt_len and max_tokens too.
  bool session = false;
  rollout_cpp::SessionStepOptions session_step;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "rollout_trainer: " << why << "\n"
            << "usage: rollout_trainer --target HOST:PORT [--version V] [--seed N]\n"
            << "  [--tensor NAME] [--prompt-len N] [--max-tokens N] [--chunk-bytes N]\n"
            << "  [--token T (or env ROLLOUT_TOKEN)] [--tls-ca CA.pem [--tls-cert CERT.pem "
               "--tls-key KEY.pem]]\n"
            << "  [--wait-seconds S] [--timeout-seconds S]\n"
            << "  [--base-seed S0 [--change-percent P] [--base-version V]\n"
            << "   [--encoding xor16|xor8]]   (delta mode)\n"
            << "   or: rollout_trainer --encode-only OUT (--tensor NAME --dtype bf16|fp16|fp32|fp64\n"
            << "  --elements N --base-seed S0 [--seed S] [--change-percent P]\n"
            << "  | --base-file BASE --new-file NEW) [--encoding xor16|xor8]\n"
            << "   or: rollout_trainer session --target HOST:PORT [--prompt-len N] [--max-tokens N]\n"
            << "  [--append-ids ID,ID,...] [--max-total-tokens N] [--keep-open]\n"
            << "  [--token T] [--tls-ca ...] [--wait-seconds S] [--timeout-seconds S]\n";
  std::exit(2);
}

uint64_t ParseUint(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || s[0] == '-') Usage(flag + ": not a number: " + s);
  return v;
}

uint32_t ParseUint32(const std::string& flag, const std::string& s) {
  uint64_t v = ParseUint(flag, s);
  if (v > std::numeric_limits<uint32_t>::max()) Usage(flag + ": over 2^32 - 1: " + s);
  return static_cast<uint32_t>(v);
}

// --append-ids 5,6,7: sent as they are (the server checks the vocabulary).
std::vector<uint32_t> ParseIds(const std::string& flag, const std::string& s) {
  std::vector<uint32_t> out;
  std::stringstream in(s);
  for (std::string piece; std::getline(in, piece, ',');) out.push_back(ParseUint32(flag, piece));
  if (out.empty() || s.back() == ',') Usage(flag + ": a comma-separated list of ids: " + s);
  return out;
}

double ParsePercent(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v >= 0 && v <= 100))
    Usage(flag + ": not a percentage in [0, 100]: " + s);
  return v;
}

double ParseSeconds(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0)) Usage(flag + ": not a positive number: " + s);
  return v;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  if (const char* t = std::getenv("ROLLOUT_TOKEN")) o.token = t;
  std::vector<std::string> seen;
  int first = 1;
  if (argc > 1 && std::string(argv[1]) == "session") {
    o.session = true;
    first = 2;
  }
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") Usage("help");
    if (a == "--keep-open") {  // the one flag without a value
      o.session_step.keep_open = true;
      seen.push_back(a);
      continue;
    }
    std::string value;
    auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else {
      if (i + 1 >= argc) Usage(a + " needs a value");
      value = argv[++i];
    }
    if (a == "--target") o.target = value;
    else if (a == "--version") o.version = value;
    else if (a == "--seed") o.seed = ParseUint(a, value);
    else if (a == "--tensor") o.tensor = value;
    else if (a == "--prompt-len") o.prompt_len = static_cast<uint32_t>(ParseUint(a, value));
    else if (a == "--max-tokens") o.max_tokens = static_cast<uint32_t>(ParseUint(a, value));
    else if (a == "--chunk-bytes") o.chunk_bytes = ParseUint(a, value);
    else if (a == "--token") o.token = value;
    else if (a == "--tls-ca") o.tls_ca = value;
    else if (a == "--tls-cert") o.tls_cert = value;
    else if (a == "--tls-key") o.tls_key = value;
    else if (a == "--wait-seconds") o.wait_seconds = ParseSeconds(a, value);
    else if (a == "--timeout-seconds") o.timeout_seconds = ParseSeconds(a, value);
    else if (a == "--base-seed") o.base_seed = ParseUint(a, value);
    else if (a == "--change-percent") o.change_percent = ParsePercent(a, value);
    else if (a == "--base-version") o.base_version = value;
    else if (a == "--encoding") {
      if (value != "xor16" && value != "xor8") Usage("--encoding must be xor16 or xor8");
      o.encoding = value;
    }
    else if (a == "--encode-only") o.encode_only = value;
    else if (a == "--base-file") o.base_file = value;
    else if (a == "--new-file") o.new_file = value;
    else if (a == "--dtype") o.dtype = value;
    else if (a == "--append-ids") o.session_step.append_ids = ParseIds(a, value);
    else if (a == "--max-total-tokens") o.session_step.max_total_tokens = ParseUint32(a, value);
    else if (a == "--elements") {
      o.elements = ParseUint(a, value);
      o.elements_set = true;
    }
    else Usage("unknown option " + a);
    seen.push_back(a);
  }
  auto given = [&](const char* flag) {
    return std::find(seen.begin(), seen.end(), flag) != seen.end();
  };
  bool files = given("--base-file") || given("--new-file");
  if (o.session) {
    for (const char* f : {"--version", "--seed", "--tensor", "--chunk-bytes", "--base-seed",
                          "--change-percent", "--base-version", "--encoding", "--encode-only",
                          "--base-file", "--new-file", "--dtype", "--elements"})
      if (given(f)) Usage(std::string(f) + " does not go with session (it updates no weights)");
  } else {
    for (const char* f : {"--append-ids", "--max-total-tokens", "--keep-open"})
      if (given(f)) Usage(std::string(f) + " goes with the session subcommand");
  }
  if (!o.encode_only.empty()) {
    if (files) {
      if (!given("--base-file") || !given("--new-file"))
        Usage("--base-file and --new-file go together");
      for (const char* f : {"--tensor", "--dtype", "--elements", "--base-seed", "--seed",
                            "--change-percent"})
        if (given(f)) Usage(std::string(f) + " does not go with --base-file/--new-file");
    } else if (o.tensor.empty() || o.dtype.empty() || !o.elements_set || !o.base_seed) {
      Usage("--encode-only needs --tensor, --dtype, --elements and --base-seed "
            "(or --base-file and --new-file)");
    }
    return o;
  }
  if (files || given("--dtype") || given("--elements"))
    Usage("--base-file, --new-file, --dtype and --elements go with --encode-only");
  if (!o.base_seed && (given("--change-percent") || given("--base-version") ||
                       given("--encoding")))
    Usage("--change-percent, --base-version and --encoding go with --base-seed");
  if (o.tls_cert.empty() != o.tls_key.empty()) Usage("--tls-cert and --tls-key go together");
  if (!o.tls_cert.empty() && o.tls_ca.empty()) Usage("--tls-cert/--tls-key need --tls-ca");
  if (o.prompt_len == 0) Usage("--prompt-len must be at least 1");
  if (o.max_tokens == 0) Usage("--max-tokens must be at least 1");
  o.session_step.prompt_len = o.prompt_len;
  o.session_step.max_tokens = o.max_tokens;
  if (o.version.empty()) o.version = "cpp-seed-" + std::to_string(o.seed);
  return o;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Usage("cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// ---------------------------------------------------------------- calls

// A failed call ends the program: reported (status.h), exit status 1.
[[noreturn]] void Fail(const std::string& step, const grpc::Status& s) {
  ReportFailure(step, s);
  std::exit(1);
}

[[noreturn]] void FailLocal(const std::string& step, const std::string& message) {
  Fail(step, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message));
}

class Connection {
 public:
  explicit Connection(const Options& o) : o_(o) {
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (o.tls_ca.empty()) {
      creds = grpc::InsecureChannelCredentials();
    } else {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ReadFile(o.tls_ca);
      if (!o.tls_cert.empty()) {
        ssl.pem_cert_chain = ReadFile(o.tls_cert);
        ssl.pem_private_key = ReadFile(o.tls_key);
      }
      creds = grpc::SslCredentials(ssl);
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    channel_ = grpc::CreateCustomChannel(o.target, creds, args);
    stub_ = pb::RolloutService::NewStub(channel_);
    health_ = Health::NewStub(channel_);
  }

  // A context with the deadline and, when a token is set, the bearer
  // metadata (per call, so that it works on plaintext channels too).
  std::unique_ptr<grpc::ClientContext> Context(double seconds) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    if (!o_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + o_.token);
    return ctx;
  }

  std::unique_ptr<grpc::ClientContext> Context() const { return Context(o_.timeout_seconds); }

  // Polls grpc.health.v1 Check("") until SERVING or --wait-seconds.
  void WaitServing() {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(o_.wait_seconds * 1000));
    while (true) {
      HealthCheckRequest req;
      HealthCheckResponse resp;
      auto ctx = Context(5);
      grpc::Status s = health_->Check(ctx.get(), req, &resp);
      if (s.ok() && resp.status() == HealthCheckResponse::SERVING) return;
      // UNAVAILABLE (not listening yet, TLS refused) and slow answers are
      // waited out; any other error is final.
      if (!s.ok() && s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
        Fail("Health.Check", s);
      if (std::chrono::steady_clock::now() > deadline) {
        std::string why = "not SERVING after --wait-seconds: ";
        if (s.ok())  // answered, but not (yet) SERVING
          Fail("Health.Check",
               grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            why + HealthCheckResponse::ServingStatus_Name(resp.status())));
        Fail("Health.Check", grpc::Status(s.error_code(), why + s.error_message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }

  pb::RolloutService::Stub& stub() { return *stub_; }

 private:
  const Options& o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::RolloutService::Stub> stub_;
  std::unique_ptr<Health::Stub> health_;
};

// ---------------------------------------------------------------- tensors

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

bool IsNorm(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends("norm.weight") || name.find("layernorm") != std::string::npos ||
         name.find("layer_norm") != std::string::npos;
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64 from a state: output i is mix(state + (i + 1) * kGolden).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += kGolden;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// The element values documented at the top of this file.
std::vector<double> NewValues(const std::string& name, uint64_t count, uint64_t seed) {
  std::vector<double> out;
  out.reserve(count);
  SplitMix64 gen(seed * kGolden + Fnv1a64(name));
  bool norm = IsNorm(name);
  for (uint64_t i = 0; i < count; ++i) {
    double k = static_cast<double>(static_cast<int64_t>(gen.Next() % 97) - 48);
    out.push_back(norm ? 1.0 + k / 64.0 : k / 1024.0);
  }
  return out;
}

// Delta mode's values (top of this file): base_seed's, except the elements
// the rule picks, which take seed's. `picked`: how many it picked.
std::vector<double> ChangedValues(const std::string& name, uint64_t count, uint64_t base_seed,
                                  uint64_t seed, double percent, uint64_t* picked) {
  std::vector<double> out = NewValues(name, count, base_seed);
  std::vector<double> next = NewValues(name, count, seed);
  const uint64_t below = static_cast<uint64_t>(std::llround(percent * 10000));
  SplitMix64 pick((seed + (1ULL << 32)) * kGolden + Fnv1a64(name));
  *picked = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (pick.Next() % 1000000 < below) {
      out[i] = next[i];
      ++*picked;
    }
  }
  return out;
}

// TENSOR_ENCODING_SPARSE_XOR16 (T = uint16_t: 16-bit words) or SPARSE_XOR8
// (T = uint8_t: bytes) of `next` against `base` (the same length, a whole
// number of T), as the proto's comment on TensorEncoding defines them.
// `changed`: how many elements (words or bytes) differ.
template <typename T>
std::string SparseXor(const std::string& base, const std::string& next, uint64_t* changed) {
  constexpr uint64_t kMaxGap = std::numeric_limits<T>::max();
  constexpr size_t kSize = sizeof(T);
  const uint64_t count = base.size() / kSize;
  std::vector<T> xs, gaps;
  int64_t prev = -1;  // the last element an entry named
  *changed = 0;
  for (uint64_t j = 0; j < count; ++j) {
    T b, n;
    std::memcpy(&b, base.data() + kSize * j, kSize);
    std::memcpy(&n, next.data() + kSize * j, kSize);
    if (b == n) continue;
    ++*changed;
    uint64_t gap = static_cast<uint64_t>(static_cast<int64_t>(j) - prev);
    while (gap > kMaxGap) {  // bridge: an entry with x = 0 names the element kMaxGap on
      xs.push_back(0);
      gaps.push_back(static_cast<T>(kMaxGap));
      gap -= kMaxGap;
    }
    xs.push_back(static_cast<T>(b ^ n));
    gaps.push_back(static_cast<T>(gap));
    prev = static_cast<int64_t>(j);
  }
  if (xs.size() > 0xFFFFFFFFULL) FailLocal("encode", "over 2^32 - 1 entries");
  const uint32_t k = static_cast<uint32_t>(xs.size());
  const size_t half = kSize * static_cast<size_t>(k);
  std::string out(4 + 2 * half, '\0');
  std::memcpy(out.data(), &k, 4);  // little-endian hosts only (checked above)
  if (k) {
    std::memcpy(out.data() + 4, xs.data(), half);
    std::memcpy(out.data() + 4 + half, gaps.data(), half);
  }
  return out;
}

// --encoding's TensorEncoding, and how many bytes its elements take.
pb::TensorEncoding SparseEncoding(const std::string& name) {
  return name == "xor8" ? pb::TENSOR_ENCODING_SPARSE_XOR8 : pb::TENSOR_ENCODING_SPARSE_XOR16;
}
size_t SparseElementBytes(const std::string& name) { return name == "xor8" ? 1 : 2; }

std::string SparseEncode(const std::string& name, const std::string& base, const std::string& next,
                         uint64_t* changed) {
  return name == "xor8" ? SparseXor<uint8_t>(base, next, changed)
                        : SparseXor<uint16_t>(base, next, changed);
}

bool IsFloat(pb::DType d) {
  return d == pb::D_TYPE_BFLOAT16 || d == pb::D_TYPE_FLOAT16 || d == pb::D_TYPE_FLOAT32 ||
         d == pb::D_TYPE_FLOAT64;
}

size_t ElementSize(pb::DType d) {
  switch (d) {
    case pb::D_TYPE_FLOAT8_E4M3FN:
    case pb::D_TYPE_FLOAT8_E5M2:
    case pb::D_TYPE_INT8:
    case pb::D_TYPE_UINT8:
    case pb::D_TYPE_BOOL:
      return 1;
    case pb::D_TYPE_BFLOAT16:
    case pb::D_TYPE_FLOAT16:
    case pb::D_TYPE_INT16:
      return 2;
    case pb::D_TYPE_FLOAT32:
    case pb::D_TYPE_INT32:
      return 4;
    case pb::D_TYPE_FLOAT64:
    case pb::D_TYPE_INT64:
      return 8;
    default:
      return 0;
  }
}

uint64_t Elements(const pb::TensorSpec& t) {
  uint64_t n = 1;
  for (uint64_t d : t.shape()) n *= d;
  return n;
}

// --dtype's value: bf16, fp16, fp32, fp64 (or the proto's D_TYPE_ names).
pb::DType ParseDType(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return pb::D_TYPE_BFLOAT16;
  if (s == "fp16" || s == "float16") return pb::D_TYPE_FLOAT16;
  if (s == "fp32" || s == "float32") return pb::D_TYPE_FLOAT32;
  if (s == "fp64" || s == "float64") return pb::D_TYPE_FLOAT64;
  pb::DType d;
  if (pb::DType_Parse(s, &d) && IsFloat(d)) return d;
  Usage("--dtype: not a floating dtype: " + s);
}

// float32 -> bfloat16, rounding to nearest even (exact for our values).
uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<uint16_t>(bits >> 16);
}

// The tensor's bytes, little-endian and row-major, in its manifest dtype.
std::string Encode(const std::vector<double>& values, pb::DType dtype) {
  std::string out;
  out.resize(values.size() * ElementSize(dtype));
  char* p = out.data();
  for (double v : values) {
    switch (dtype) {
      case pb::D_TYPE_BFLOAT16: {
        uint16_t h = ToBf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        p += 2;
        break;
      }
      case pb::D_TYPE_FLOAT16: {
        _Float16 h = static_cast<_Float16>(v);
        std::memcpy(p, &h, 2);
        p += 2;
        break;
      }
      case pb::D_TYPE_FLOAT32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        p += 4;
        break;
      }
      case pb::D_TYPE_FLOAT64:
        std::memcpy(p, &v, 8);
        p += 8;
        break;
      default:
        FailLocal("encode", "no floating dtype: " + pb::DType_Name(dtype));
    }
  }
  return out;
}

// CRC-32C (Castagnoli), as TensorSpec.crc32c wants it.
uint32_t Crc32c(const std::string& data) {
  static uint32_t table[256];
  static bool ready = false;
  if (!ready) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78U : c >> 1;
      table[i] = c;
    }
    ready = true;
  }
  uint32_t crc = 0xFFFFFFFFU;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFU;
}

// The tensors to push: --tensor (with the rest of its group), or else the
// best ungrouped floating tensor: the final norm, another norm, the smallest.
std::vector<pb::TensorSpec> ChooseTensors(const pb::GetServerInfoResponse& info,
                                          const std::string& wanted) {
  std::map<std::string, int> group_of;
  for (int g = 0; g < info.parameter_groups_size(); ++g)
    for (const auto& n : info.parameter_groups(g).names()) group_of[n] = g;
  std::map<std::string, const pb::TensorSpec*> by_name;
  for (const auto& p : info.parameters()) by_name[p.name()] = &p;

  std::string pick = wanted;
  if (pick.empty()) {
    const pb::TensorSpec* best = nullptr;
    auto rank = [](const pb::TensorSpec& p) {
      return std::make_tuple(p.name() != "model.norm.weight", !IsNorm(p.name()),
                             Elements(p) * ElementSize(p.dtype()));
    };
    for (const auto& p : info.parameters()) {
      if (group_of.count(p.name()) || !IsFloat(p.dtype()) || Elements(p) == 0) continue;
      if (!best || rank(p) < rank(*best)) best = &p;
    }
    if (!best) FailLocal("choose tensor", "the manifest has no ungrouped floating tensor");
    pick = best->name();
  }
  if (!by_name.count(pick)) FailLocal("choose tensor", "not in the manifest: " + pick);
  std::vector<pb::TensorSpec> out;
  auto g = group_of.find(pick);
  if (g == group_of.end()) {
    out.push_back(*by_name[pick]);
  } else {
    for (const auto& n : info.parameter_groups(g->second).names()) {
      if (!by_name.count(n)) FailLocal("choose tensor", "group member not in the manifest: " + n);
      out.push_back(*by_name[n]);
    }
  }
  for (const auto& t : out)
    if (!IsFloat(t.dtype()))
      FailLocal("choose tensor", t.name() + " is " + pb::DType_Name(t.dtype()) +
                                     ": only floating tensors get new values here");
  return out;
}

// ---------------------------------------------------------------- steps

std::string GenerationJson(const pb::GenerateResponse& r) {
  const pb::Completion& c = r.completions(0);
  return Obj({{"weight_version", Quote(r.weight_version())},
              {"token_ids", List(c.token_ids(), [](uint32_t t) { return std::to_string(t); })},
              {"logprobs", List(c.logprobs(), [](float v) { return Num(v); })},
              {"finish_reason", Quote(pb::FinishReason_Name(c.finish_reason()))},
              {"prompt_tokens", std::to_string(r.usage().prompt_tokens())},
              {"cached_prompt_tokens", std::to_string(r.usage().cached_prompt_tokens())}});
}

std::string CachesJson(const google::protobuf::RepeatedPtrField<pb::CacheResetResult>& rs) {
  return List(rs, [](const pb::CacheResetResult& r) {
    return Obj({{"cache", Quote(pb::CacheKind_Name(r.cache()))},
                {"reset", Bool(r.reset())},
                {"detail", Quote(r.detail())}});
  });
}

pb::GenerateResponse Generate(Connection& s, const std::vector<uint32_t>& prompt, uint32_t max_tokens,
                              const std::string& step) {
  pb::GenerateRequest req;
  for (uint32_t t : prompt) req.add_prompt_token_ids(t);
  auto* sp = req.mutable_sampling_params();
  sp->set_max_tokens(max_tokens);
  sp->set_temperature(0.0f);  // greedy: the same weights give the same tokens
  sp->set_ignore_eos(true);
  pb::GenerateResponse resp;
  auto ctx = s.Context();
  grpc::Status st = s.stub().Generate(ctx.get(), req, &resp);
  if (!st.ok()) Fail(step, st);
  if (resp.completions_size() != 1) FailLocal(step, "expected one completion");
  const auto& c = resp.completions(0);
  if (c.logprobs_size() != c.token_ids_size()) FailLocal(step, "logprobs not aligned with tokens");
  std::cerr << "rollout_trainer: " << step << ": " << c.token_ids_size() << " tokens, version "
            << resp.weight_version() << "\n";
  return resp;
}

// One UpdateWeights call: begin (base_version set for a delta), every
// tensor's bytes as they travel (`wire`) in chunks, commit.
struct Pushed {
  grpc::Status status;
  pb::UpdateWeightsResponse ack;
  uint64_t chunks = 0;
  bool stream_ok = false;
};

Pushed Push(Connection& s, const std::string& version, const std::string& base_version,
            const std::vector<pb::TensorSpec>& specs, const std::vector<std::string>& wire,
            uint64_t chunk) {
  Pushed out;
  auto ctx = s.Context();
  std::unique_ptr<grpc::ClientWriter<pb::UpdateWeightsRequest>> w(
      s.stub().UpdateWeights(ctx.get(), &out.ack));
  pb::UpdateWeightsRequest req;
  auto* begin = req.mutable_begin();
  begin->set_weight_version(version);
  begin->set_pause_mode(pb::PAUSE_MODE_WAIT);
  if (!base_version.empty()) begin->set_base_version(base_version);
  for (const auto& t : specs) *begin->add_tensors() = t;
  bool ok = w->Write(req);
  for (size_t i = 0; ok && i < wire.size(); ++i) {
    for (uint64_t off = 0; ok && off < wire[i].size(); off += chunk) {
      req.Clear();
      auto* c = req.mutable_chunk();
      c->set_tensor_index(static_cast<uint32_t>(i));
      c->set_offset(off);
      c->set_data(wire[i].data() + off, std::min<uint64_t>(chunk, wire[i].size() - off));
      ok = w->Write(req);
      out.chunks += ok;
    }
  }
  if (ok) {
    req.Clear();
    req.mutable_commit();
    ok = w->Write(req);
  }
  w->WritesDone();  // if a Write failed, Finish has the server's reason
  out.status = w->Finish();
  out.stream_ok = ok;
  return out;
}

// --encode-only: one tensor's SPARSE_XOR16 (or XOR8) bytes to a file, no server.
int EncodeOnly(const Options& o) {
  std::string base, next;
  uint64_t picked = 0;
  bool seeded = o.base_file.empty();
  if (seeded) {
    pb::DType dtype = ParseDType(o.dtype);
    base = Encode(NewValues(o.tensor, o.elements, *o.base_seed), dtype);
    next = Encode(ChangedValues(o.tensor, o.elements, *o.base_seed, o.seed, o.change_percent, &picked),
                  dtype);
  } else {
    base = ReadFile(o.base_file);
    next = ReadFile(o.new_file);
    if (base.size() != next.size()) Usage("--base-file and --new-file differ in length");
  }
  const size_t unit = SparseElementBytes(o.encoding);
  if (base.size() % unit) Usage("an odd number of bytes (such a tensor is sent raw or as xor8)");
  uint64_t changed = 0;
  std::string payload = SparseEncode(o.encoding, base, next, &changed);
  std::ofstream f(o.encode_only, std::ios::binary | std::ios::trunc);
  f.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  f.close();
  if (!f) Usage("cannot write " + o.encode_only);
  uint32_t entries;
  std::memcpy(&entries, payload.data(), 4);
  std::vector<std::pair<std::string, std::string>> fields = {
      {"ok", "true"},
      {"out", Quote(o.encode_only)},
      {"encoding", Quote(pb::TensorEncoding_Name(SparseEncoding(o.encoding)))},
      {"raw_bytes", std::to_string(next.size())},
      {"encoded_bytes", std::to_string(payload.size())},
      {"elements", std::to_string(next.size() / unit)},
      {"changed_elements", std::to_string(changed)},
      {"entries", std::to_string(entries)},
      {"base_crc32c", std::to_string(Crc32c(base))},
      {"crc32c", std::to_string(Crc32c(next))}};
  if (seeded) fields.push_back({"picked_elements", std::to_string(picked)});
  std::cout << Obj(fields) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  if (!o.encode_only.empty()) return EncodeOnly(o);
  auto t0 = std::chrono::steady_clock::now();
  Connection s(o);

  // 1. Readiness.
  s.WaitServing();
  std::cerr << "rollout_trainer: " << o.target << " is SERVING\n";
  if (o.session)
    return rollout_cpp::RunSessionStep(s.stub(), [&s] { return s.Context(); }, o.session_step);

  // 2. The server's description: version, manifest, groups, limits.
  pb::GetServerInfoResponse info;
  {
    auto ctx = s.Context();
    grpc::Status st = s.stub().GetServerInfo(ctx.get(), pb::GetServerInfoRequest(), &info);
    if (!st.ok()) Fail("GetServerInfo", st);
  }
  if (info.degraded()) FailLocal("GetServerInfo", "the server is degraded");
  if (info.vocab_size() == 0) FailLocal("GetServerInfo", "vocab_size is 0");
  std::cerr << "rollout_trainer: model " << info.model() << ", version " << info.weight_version()
            << ", " << info.parameters_size() << " tensors, " << info.parameter_groups_size()
            << " groups\n";

  // 3. Generate from token ids (deterministic prompt inside the vocabulary).
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < o.prompt_len; ++i)
    prompt.push_back(static_cast<uint32_t>((31ULL * i + 7) % info.vocab_size()));
  pb::GenerateResponse before = Generate(s, prompt, o.max_tokens, "Generate (before)");

  // 4. UpdateWeights: begin, chunks, commit; in delta mode against the base,
  // or in full when the server offers or takes no base.
  std::vector<pb::TensorSpec> specs = ChooseTensors(info, o.tensor);
  std::vector<std::string> data;  // the new tensors' bytes
  std::vector<uint64_t> picked(specs.size(), 0);
  uint64_t raw_total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& t = specs[i];
    data.push_back(Encode(o.base_seed ? ChangedValues(t.name(), Elements(t), *o.base_seed, o.seed,
                                                      o.change_percent, &picked[i])
                                      : NewValues(t.name(), Elements(t), o.seed),
                          t.dtype()));
    t.set_crc32c(Crc32c(data.back()));  // the server checks it
    raw_total += data.back().size();
  }
  uint64_t chunk = o.chunk_bytes ? o.chunk_bytes
                                 : (info.recommended_chunk_bytes() ? info.recommended_chunk_bytes()
                                                                   : 1 << 20);
  chunk = std::min<uint64_t>(chunk, kMaxMessageBytes / 2);

  bool delta = o.base_seed.has_value();
  std::string fallback;  // why a delta went as a full update
  std::string base_version = o.base_version.empty() ? info.delta_base_version() : o.base_version;
  std::vector<pb::TensorSpec> sent = specs;  // as the applied update declared them
  std::vector<std::string> wire = data;      // their bytes as they travelled
  std::vector<uint64_t> changed_elements(specs.size(), 0);
  Pushed pushed;
  if (delta && base_version.empty()) {
    delta = false;
    fallback = "the server offers no delta base (GetServerInfo.delta_base_version is empty)";
  }
  if (delta) {
    std::vector<pb::TensorSpec> dspecs = specs;
    std::vector<std::string> dwire = data;
    uint64_t encoded_total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto& t = dspecs[i];
      if (data[i].size() % SparseElementBytes(o.encoding) == 0) {  // else raw
        std::string base = Encode(NewValues(t.name(), Elements(t), *o.base_seed), t.dtype());
        std::string payload = SparseEncode(o.encoding, base, data[i], &changed_elements[i]);
        if (payload.size() < data[i].size()) {
          t.set_encoding(SparseEncoding(o.encoding));
          t.set_encoded_bytes(payload.size());
          dwire[i] = std::move(payload);
        }
      }
      encoded_total += dwire[i].size();
    }
    if (info.max_update_bytes() && encoded_total > info.max_update_bytes())
      FailLocal("UpdateWeights (delta)", "the update is larger than max_update_bytes");
    std::cerr << "rollout_trainer: delta against " << base_version << ": " << encoded_total
              << " encoded bytes for " << raw_total << " bytes\n";
    pushed = Push(s, o.version, base_version, dspecs, dwire, chunk);
    const grpc::Status& st = pushed.status;
    std::string reason = ErrorReason(st);
    if (!st.ok() && st.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        (reason == "DELTA_BASE_MISMATCH" || reason == "ERROR_REASON_DELTA_BASE_MISMATCH")) {
      delta = false;
      fallback = "the server refused base_version '" + base_version + "' (" +
                 CodeName(st.error_code()) + ", " + reason + "): " + st.error_message();
    } else {
      if (!st.ok()) Fail("UpdateWeights (delta)", st);
      sent = std::move(dspecs);
      wire = std::move(dwire);
    }
  }
  if (!delta) {
    if (!fallback.empty()) std::cerr << "rollout_trainer: a full update instead: " << fallback << "\n";
    if (info.max_update_bytes() && raw_total > info.max_update_bytes())
      FailLocal("UpdateWeights", "the update is larger than max_update_bytes");
    pushed = Push(s, o.version, "", specs, data, chunk);
    if (!pushed.status.ok()) Fail("UpdateWeights", pushed.status);
  }
  if (!pushed.stream_ok) FailLocal("UpdateWeights", "the stream broke but the call reported OK");
  const pb::UpdateWeightsResponse& ack = pushed.ack;
  uint64_t chunks_sent = pushed.chunks;
  uint64_t wire_total = 0;
  for (const auto& w : wire) wire_total += w.size();
  std::cerr << "rollout_trainer: UpdateWeights acknowledged: now serving " << ack.weight_version()
            << " (was " << ack.previous_weight_version() << "), " << ack.tensors_loaded()
            << " tensor(s), " << ack.bytes_received() << " bytes\n";

  // 5. Generate again: the new version.
  pb::GenerateResponse after = Generate(s, prompt, o.max_tokens, "Generate (after)");

  // 6. ResetCaches.
  pb::ResetCachesResponse reset;
  {
    auto ctx = s.Context();
    grpc::Status st = s.stub().ResetCaches(ctx.get(), pb::ResetCachesRequest(), &reset);
    if (!st.ok()) Fail("ResetCaches", st);
  }
  std::cerr << "rollout_trainer: ResetCaches: " << reset.results_size() << " cache(s) in "
            << reset.duration_seconds() << " s\n";

  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& tm = ack.timings();
  std::string tensors_json = List(sent, [&](const pb::TensorSpec& t) {
    size_t i = &t - sent.data();
    std::vector<std::pair<std::string, std::string>> f = {
        {"name", Quote(t.name())},
        {"dtype", Quote(pb::DType_Name(t.dtype()))},
        {"shape", List(t.shape(), [](uint64_t d) { return std::to_string(d); })},
        {"bytes", std::to_string(data[i].size())},
        {"crc32c", std::to_string(t.crc32c())},
        {"encoding", Quote(pb::TensorEncoding_Name(t.encoding() ? t.encoding()
                                                                  : pb::TENSOR_ENCODING_RAW))},
        {"encoded_bytes", std::to_string(wire[i].size())}};
    if (o.base_seed) {
      f.push_back({"picked_elements", std::to_string(picked[i])});
      f.push_back({"changed_elements", std::to_string(changed_elements[i])});
    }
    return Obj(f);
  });
  std::cout << Obj({
                   {"ok", "true"},
                   {"target", Quote(o.target)},
                   {"tls", Bool(!o.tls_ca.empty())},
                   {"mutual_tls", Bool(!o.tls_cert.empty())},
                   {"token", Bool(!o.token.empty())},
                   {"server", Obj({{"model", Quote(info.model())},
                                   {"server_version", Quote(info.server_version())},
                                   {"weight_version", Quote(info.weight_version())},
                                   {"vocab_size", std::to_string(info.vocab_size())},
                                   {"max_model_len", std::to_string(info.max_model_len())},
                                   {"parameters", std::to_string(info.parameters_size())},
                                   {"parameter_groups", std::to_string(info.parameter_groups_size())},
                                   {"max_message_bytes", std::to_string(info.max_message_bytes())},
                                   {"recommended_chunk_bytes",
                                    std::to_string(info.recommended_chunk_bytes())}})},
                   {"prompt_token_ids", List(prompt, [](uint32_t t) { return std::to_string(t); })},
                   {"before", GenerationJson(before)},
                   {"update",
                    Obj({{"version", Quote(o.version)},
                         {"seed", std::to_string(o.seed)},
                         {"delta", Bool(delta)},
                         {"base_seed", o.base_seed ? std::to_string(*o.base_seed) : "null"},
                         {"change_percent", o.base_seed ? Num(o.change_percent) : "null"},
                         {"base_version", Quote(delta ? base_version : "")},
                         {"fallback", Quote(fallback)},
                         {"raw_bytes", std::to_string(raw_total)},
                         {"encoded_bytes", std::to_string(wire_total)},
                         {"tensors", tensors_json},
                         {"chunk_bytes", std::to_string(chunk)},
                         {"chunks", std::to_string(chunks_sent)},
                         {"ack", Obj({{"weight_version", Quote(ack.weight_version())},
                                      {"previous_weight_version", Quote(ack.previous_weight_version())},
                                      {"bytes_received", std::to_string(ack.bytes_received())},
                                      {"tensors_loaded", std::to_string(ack.tensors_loaded())},
                                      {"replayed", Bool(ack.replayed())},
                                      {"requests_aborted", std::to_string(ack.requests_aborted())},
                                      {"caches_reset", CachesJson(ack.caches_reset())},
                                      {"timings", Obj({{"receive_seconds", Num(tm.receive_seconds())},
                                                       {"apply_seconds", Num(tm.apply_seconds())},
                                                       {"load_seconds", Num(tm.load_seconds())},
                                                       {"reset_seconds", Num(tm.reset_seconds())},
                                                       {"admission_closed_seconds",
                                                        Num(tm.admission_closed_seconds())}})}})}})},
                   {"after", GenerationJson(after)},
                   {"reset_caches", Obj({{"results", CachesJson(reset.results())},
                                         {"duration_seconds", Num(reset.duration_seconds())}})},
                   {"seconds", Num(seconds)},
               })
            << std::endl;
  return 0;
}
