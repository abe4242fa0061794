// The few JSON writers the trainer's summaries need (one object a line on
// stdout, read by tests and scripts). Values are passed already encoded, so
// an object is built from Quote/Num/Bool/List/Obj pieces in order; no JSON
// library is linked for a handful of flat records.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace rollout_cpp {

inline std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// %.9g: a float32 logprob round-trips; NaN and infinities have no JSON form.
inline std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

inline std::string Bool(bool b) { return b ? "true" : "false"; }

template <typename Seq, typename F>
std::string List(const Seq& items, F f) {
  std::string out = "[";
  bool first = true;
  for (const auto& x : items) {
    if (!first) out += ", ";
    first = false;
    out += f(x);
  }
  return out + "]";
}

// A list of integers (token ids, a mask).
template <typename Seq>
std::string Ints(const Seq& items) {
  return List(items, [](auto v) { return std::to_string(v); });
}

// {"k": v, ...} from already-encoded values, in order.
inline std::string Obj(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ", ";
    out += Quote(fields[i].first) + ": " + fields[i].second;
  }
  return out + "}";
}

}  // namespace rollout_cpp
