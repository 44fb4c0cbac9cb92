// One key table per config struct drives its JSON reading, writing and unknown-key errors:
//
//   constexpr std::array kKeys{field<TrainConfig, &TrainConfig::steps>("steps"), ...};
//   read_keys(kKeys, config, j, "train");   // table order; "[train] unknown key 'x' (known: ...)"
//   json j = write_keys(kKeys, config);
//
// A field's JSON form follows its type: enums by their name (names.hpp), everything else as
// nlohmann converts it. Keys whose reading or printing is not one field take their own
// functions (JsonKey's members).
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "check.hpp"
#include "ffnlab/names.hpp"

namespace ffnlab {

template <typename C>
struct JsonKey {
  const char* name;
  void (*read)(C&, const nlohmann::json&);
  nlohmann::json (*write)(const C&) = nullptr;  // null: accepted on input, never printed
  bool (*printed)(const C&) = nullptr;          // null: always printed
};

template <typename T>
T json_value(const nlohmann::json& j) {
  if constexpr (std::is_enum_v<T>)
    return parse_enum<T>(j.get<std::string>());
  else
    return j.get<T>();
}

template <typename T>
nlohmann::json json_of(const T& value) {
  if constexpr (std::is_enum_v<T>)
    return enum_name(value);
  else
    return value;
}

// The key for one member of C (which may be a member of a base of C).
// `printed` (optional) says when the key is written.
template <typename C, auto Member>
constexpr JsonKey<C> field(const char* name, bool (*printed)(const C&) = nullptr) {
  return {name,
          [](C& c, const nlohmann::json& j) {
            auto& f = c.*Member;
            f = json_value<std::remove_cvref_t<decltype(f)>>(j);
          },
          [](const C& c) { return json_of(c.*Member); }, printed};
}

// Reads every key of `keys` that j has, in table order (so a key that sets defaults, such as a
// preset, comes first). `scope` prefixes errors; `prefix` names a nested object ("moe.").
template <typename C, std::size_t N>
void read_keys(const std::array<JsonKey<C>, N>& keys, C& c, const nlohmann::json& j,
               std::string_view scope, std::string_view prefix = "") {
  check(j.is_object(), "[{}] {} must be a JSON object", scope,
        prefix.empty() ? "the config" : fmt::format("'{}'", prefix.substr(0, prefix.size() - 1)));
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const auto& k : keys) known |= key == k.name;
    if (!known) {
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "" : ", ") + std::string(k.name);
      fail("[{}] unknown key '{}{}' (known: {})", scope, prefix, key, list);
    }
  }
  for (const auto& k : keys) {
    if (!j.contains(k.name)) continue;
    try {
      k.read(c, j.at(k.name));
    } catch (const nlohmann::json::exception& e) {
      fail("[{}] key '{}{}': {}", scope, prefix, k.name, e.what());
    }
  }
}

template <typename C, std::size_t N>
nlohmann::json write_keys(const std::array<JsonKey<C>, N>& keys, const C& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : keys)
    if (k.write && (!k.printed || k.printed(c))) j[k.name] = k.write(c);
  return j;
}

}  // namespace ffnlab
