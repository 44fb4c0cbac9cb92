// Failure: an exception's kind, errno and message (include/ffnlab/failure.hpp).
#include "ffnlab/failure.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <system_error>

#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/parallel/group.hpp"
#include "json_keys.hpp"

namespace ffnlab {

Failure Failure::of(const std::exception& e) {
  using K = Kind;
  if (dynamic_cast<const Interrupted*>(&e)) return {K::interrupted, 0, e.what()};
  if (dynamic_cast<const UsageError*>(&e)) return {K::usage, 0, e.what()};
  if (const auto* s = dynamic_cast<const SystemError*>(&e))
    return {K::system, s->error_number(), e.what()};
  if (dynamic_cast<const Error*>(&e)) return {K::input, 0, e.what()};
  if (dynamic_cast<const std::bad_alloc*>(&e)) return {K::system, ENOMEM, "out of memory"};
  if (const auto* f = dynamic_cast<const std::filesystem::filesystem_error*>(&e))
    return {path_leads_nowhere(*f) ? K::input : K::system, f->code().value(),
            filesystem_error_text(*f)};
  if (const auto* s = dynamic_cast<const std::system_error*>(&e)) {  // fmt's failed writes
    const bool os = s->code().category() == std::generic_category() ||
                    s->code().category() == std::system_category();
    return {K::system, os ? s->code().value() : 0, fmt::format("[io] {}", e.what())};
  }
  // JSON that escaped its reader's checks (a config's, a checkpoint's): refused input, in
  // ffnlab's words rather than nlohmann's.
  if (const auto* j = dynamic_cast<const nlohmann::json::exception*>(&e))
    return {K::input, 0, fmt::format("[json] {}", json_error_text(*j))};
  return {K::system, 0, e.what()};
}

void Failure::raise(std::string_view prefix, std::string_view suffix) const {
  const std::string what = fmt::format("{}{}{}", prefix, message, suffix);
  switch (kind) {
    case Kind::interrupted:
      throw Interrupted(what);
    case Kind::usage:
      throw UsageError(what);
    case Kind::system:
      throw SystemError(what, error_number);
    case Kind::input:
      throw Error(what);
    case Kind::none:
      break;
  }
  throw Error(fmt::format("[failure] raised without a failure: {}", what));  // a caller's bug
}

RanksFailure any_rank_failed(ProcessGroup& group, const Failure& mine, const char* exchange) {
  // The highest-numbered rank that failed and the highest that a stop ended (-1: none).
  std::vector<std::int64_t> failed{mine.failed() ? group.rank() : -1,
                                   mine.kind == Failure::Kind::interrupted ? group.rank() : -1};
  group.allreduce_max(failed, exchange);
  if (failed[0] < 0) return {};
  // That rank's kind and errno (every rank knows which rank it is).
  std::vector<std::int64_t> code{0, 0};
  if (group.rank() == failed[0]) code = {static_cast<std::int64_t>(mine.kind), mine.error_number};
  group.allreduce_max(code, exchange);
  return {static_cast<int>(failed[0]), static_cast<Failure::Kind>(code[0]),
          static_cast<int>(code[1]), static_cast<int>(failed[1])};
}

void fail_together(ProcessGroup& group, const Failure& mine, const char* exchange,
                   std::string_view others) {
  const RanksFailure failed = any_rank_failed(group, mine, exchange);
  if (mine.failed()) mine.raise();
  if (failed.rank < 0) return;
  if (failed.stopped_rank >= 0)
    throw Interrupted(fmt::format(fmt::runtime(others), failed.stopped_rank));
  Failure{failed.kind, failed.error_number, fmt::format(fmt::runtime(others), failed.rank)}.raise();
}

nlohmann::json Failure::to_json() const {
  return {{"kind", static_cast<std::int64_t>(kind)}, {"errno", error_number}, {"message", message}};
}

Failure Failure::from_json(const nlohmann::json& j) {
  const std::int64_t k = j.at("kind");
  const bool known = k > 0 && k <= static_cast<std::int64_t>(Kind::interrupted);
  return {known ? static_cast<Kind>(k) : Kind::system, j.at("errno").get<int>(),
          j.at("message").get<std::string>()};
}

}  // namespace ffnlab
