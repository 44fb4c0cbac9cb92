// JSON as text that is always valid UTF-8. A string ffnlab writes into JSON may hold bytes that
// are not UTF-8 (a file or folder name on Linux); nlohmann's writer would throw on them
// ("[json.exception.type_error.316]") after the work that produced the JSON was done. Every JSON
// ffnlab writes or sends goes through json_text, which writes such bytes as U+FFFD instead.
#pragma once

#include <string>

namespace ffnlab {

// j's text (indent as nlohmann's dump: -1 on one line), bytes that are not UTF-8 as U+FFFD.
template <typename Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ffnlab
