// Checked parsing of the PyTorch side's replies.
#include "torch_reply.hpp"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "ffnlab/error.hpp"

namespace ffnlab::cli {

namespace {

using json = nlohmann::json;

// At most 200 characters of a line, for a message.
std::string excerpt(std::string_view line) {
  std::string out;
  for (char c : line.substr(0, 200))
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return line.size() > 200 ? out + "..." : out;
}

[[noreturn]] void refuse(const std::string& script, const std::string& what,
                         std::string_view line) {
  throw Error(fmt::format("[bench] {}: {} (the line was '{}')", script, what, excerpt(line)));
}

json object_of(std::string_view line, const std::string& script) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) refuse(script, "a reply that is not JSON", line);
  if (!j.is_object()) refuse(script, "a reply that is not a JSON object", line);
  return j;
}

std::string text(const json& j, const char* key, const std::string& script, std::string_view line) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string()) refuse(script, fmt::format("'{}' is not a string", key), line);
  return excerpt(j[key].get<std::string>());
}

}  // namespace

TorchHello parse_torch_hello(std::string_view line, const std::string& script) {
  const json j = object_of(line, script);
  if (!j.contains("ready") || !j["ready"].is_boolean())
    refuse(script, "the first reply has no boolean 'ready'", line);
  TorchHello h;
  h.ready = j["ready"].get<bool>();
  h.error = text(j, "error", script, line);
  h.torch = text(j, "torch", script, line);
  h.runtime = text(j, "runtime", script, line);
  if (h.ready) {
    if (!j.contains("threads") || !j["threads"].is_number_integer() ||
        j["threads"].get<std::int64_t>() < 0 || j["threads"].get<std::int64_t>() > (1 << 20))
      refuse(script, "'threads' is not a thread count", line);
    h.threads = j["threads"].get<int>();
  }
  return h;
}

TorchReply parse_torch_reply(std::string_view line, const std::string& script) {
  const json j = object_of(line, script);
  TorchReply r;
  if (j.contains("seconds")) {
    const json& s = j["seconds"];
    if (!s.is_number() || !std::isfinite(s.get<double>()) || s.get<double>() <= 0)
      refuse(script, "'seconds' is not a positive finite number", line);
    r.kind = TorchReply::Kind::seconds;
    r.seconds = s.get<double>();
  } else if (j.contains("skipped")) {
    r.kind = TorchReply::Kind::skipped;
    r.skipped = text(j, "skipped", script, line);
  } else if (j.contains("freed")) {
    r.kind = TorchReply::Kind::freed;
  } else {
    refuse(script, "a reply with none of 'seconds', 'skipped', 'freed'", line);
  }
  return r;
}

}  // namespace ffnlab::cli
