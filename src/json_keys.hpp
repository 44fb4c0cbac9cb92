// One key table per config struct drives its JSON reading, writing and unknown-key errors:
//
//   constexpr std::array kKeys{field<TrainConfig, &TrainConfig::steps>("steps"), ...};
//   read_keys(kKeys, config, j, "train");   // table order; "[train] unknown key 'x' (known: ...)"
//   json j = write_keys(kKeys, config);
//
// A field's JSON form follows its type: enums by their name (names.hpp), everything else as
// nlohmann converts it. Keys whose reading or printing is not one field take their own
// functions (JsonKey's members).
//
// A key that a command line sets names its flag in its row (KeyFlag): the flag's name, help and
// range. The front ends generate their flags from these rows (ffnlab/config_flags.hpp), so that
// a key and its flag are written in one place.
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "check.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/io/json_text.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"

namespace ffnlab {

// A key's command-line flag.
struct KeyFlag {
  const char* name = nullptr;  // "--top-k" (aliases after a comma: "--no-bias,--no-ffn-bias")
  const char* help = "";       // "{names}" and "{names or}": the names of an enum key's values
  double lo = 0, hi = 0;       // the values' range; none when both are 0
  bool lo_open = false, hi_open = false;
  bool negated = false;           // a switch that sets a key true by default to false (--no-bias)
  bool both = false;              // a switch in both senses: --x sets the key true, --no-x false
  const char* routing = nullptr;  // read only under this MoE routing (a routing family's own)
  const char* presets = nullptr;  // a preset: the keys it sets ("kind,activation,swish_beta")
};

template <typename C>
struct JsonKey {
  const char* name;
  void (*read)(C&, const nlohmann::json&);
  nlohmann::json (*write)(const C&) = nullptr;    // null: accepted on input, never printed
  bool (*printed)(const C&) = nullptr;            // null: always printed
  KeyFlag flag{};                                 // flag.name null: no flag
  std::vector<std::string> (*names)() = nullptr;  // an enum key: its values' names
  bool (*known)(std::string_view) = nullptr;      // an enum key: whether it reads a name
  // A number key: "= v must be in [lo, hi]" when its value lies outside flag's range, else "".
  std::string (*outside)(const C&, const KeyFlag&) = nullptr;
};

// A value of the wrong JSON type or out of the C++ type's range. read_keys (and the Hugging Face
// reader) turn it into an Error naming the file's key: "[lm] key 'layers' must be an integer".
struct BadValue {
  std::string problem;
};

// The JSON text of a value for an error message, cut short.
inline std::string json_excerpt(const nlohmann::json& j) {
  std::string s = json_text(j);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// JSON text parsed, or Error "[scope] source: not valid JSON (at line L, column C: what)" in
// ffnlab's words: nlohmann's own message ("[json.exception.parse_error.101] ...") never reaches
// a user. NaN and Infinity are not JSON, and a number too large for a double (1e400) is refused
// by the parser ("number overflow parsing '1e400'").
// nlohmann's parse error in ffnlab's words: "line 1, column 9: syntax error ..." without the
// "[json.exception.parse_error.101] parse error at " prefix (also for a SAX parser's errors).
inline std::string json_error_text(const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (const auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
  if (what.rfind("parse error at ", 0) == 0) what = what.substr(15);
  return what;
}

inline nlohmann::json parse_json_text(std::string_view text, std::string_view scope,
                                      std::string_view source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (1e400)
    fail("[{}] {}: not valid JSON ({})", scope, source, json_error_text(e));
  }
}

// The value of j as a T, strictly: integers must be JSON integers in T's range (13.9 is not an
// integer; 2^32 + 2 is not an int), floats JSON numbers finite as T and not 0 in T unless 0
// (1e-50 is no float), booleans true or false,
// enums their names. Throws BadValue otherwise.
template <typename T>
T json_value(const nlohmann::json& j) {
  const auto bad = [&](std::string_view expected) {
    return BadValue{fmt::format("must be {}, got {}", expected, json_excerpt(j))};
  };
  if constexpr (std::is_enum_v<T>) {
    if (!j.is_string()) throw bad("a name (a string)");
    return parse_enum<T>(j.get<std::string>());
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) throw bad("true or false");
    return j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    using L = std::numeric_limits<T>;
    const auto range = [&] {
      return BadValue{fmt::format("= {} is out of range (at most {}{})", json_excerpt(j),
                                  static_cast<std::uint64_t>(L::max()),
                                  L::is_signed ? "" : ", not negative")};
    };
    if (!j.is_number_integer()) throw bad(L::is_signed ? "an integer" : "a non-negative integer");
    if (j.is_number_unsigned()) {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(L::max())) throw range();
      return static_cast<T>(u);
    }
    const auto v = j.get<std::int64_t>();
    if (v < 0 && !L::is_signed) throw range();
    if (L::is_signed &&
        (v < static_cast<std::int64_t>(L::min()) || v > static_cast<std::int64_t>(L::max())))
      throw range();
    return static_cast<T>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) throw bad("a number");
    const double v = j.get<double>();
    if (!std::isfinite(v))  // not from parsed text (which refuses 1e400), but from a json value
      throw BadValue{"must be a finite number, got one beyond the range of a double"};
    if (!std::isfinite(static_cast<T>(v)))
      throw BadValue{fmt::format("must be a finite number within the range of a {}, got {}",
                                 sizeof(T) == 4 ? "float (about 3.4e38)" : "double",
                                 json_excerpt(j))};
    // Nor may a value other than 0 become 0 in T: clip 1e-50 would turn clipping off.
    if (v != 0 && static_cast<T>(v) == 0)
      throw BadValue{fmt::format("must be 0 or a number that {} holds as other than 0, got {}",
                                 sizeof(T) == 4 ? "a float (from about 1.4e-45)" : "a double",
                                 json_excerpt(j))};
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) throw bad("a string");
    return j.get<std::string>();
  } else {
    return j.get<T>();
  }
}

// A float as the shortest decimal that reads back as it: 0.003, not 0.003000000026077032 (the
// double it widens to), so that a setting reads in a file as it was given. (A value whose decimal
// would not come back through a double stays that double.)
inline nlohmann::json json_float(float f) {
  char text[32];
  const auto written = std::to_chars(text, text + sizeof text, f);
  double d = 0;
  const auto read = std::from_chars(text, written.ptr, d);
  if (written.ec != std::errc() || read.ec != std::errc() || static_cast<float>(d) != f)
    return static_cast<double>(f);
  return d;
}

template <typename T>
nlohmann::json json_of(const T& value) {
  if constexpr (std::is_enum_v<T>)
    return enum_name(value);
  else if constexpr (std::is_same_v<T, float>)
    return json_float(value);
  else
    return value;
}

// The names of an enum's values, for a key of that type (null for other types).
template <typename T>
constexpr std::vector<std::string> (*names_of())() {
  if constexpr (std::is_enum_v<T>)
    return [] { return enum_names<T>(); };
  else
    return nullptr;
}

// Whether a name (or an alias) reads as one of an enum's values, for a key of that type.
template <typename T>
constexpr bool (*known_of())(std::string_view) {
  if constexpr (std::is_enum_v<T>)
    return [](std::string_view text) { return EnumNames<T>::table.find(text).has_value(); };
  else
    return nullptr;
}

// "= v must be in R" when v lies outside the range of f, "" when inside or not a number. A float
// compares with the bounds rounded to float, as the command line's check does (--top-p 1e-6 is
// the float nearest 1e-6, a little below it).
template <typename T>
std::string outside_range(const T& v, const KeyFlag& f) {
  if constexpr (std::is_floating_point_v<T>) {
    const T lo = static_cast<T>(f.lo), hi = static_cast<T>(f.hi);
    if ((f.lo_open ? v > lo : v >= lo) && (f.hi_open ? v < hi : v <= hi)) return {};  // NaN: out
    return fmt::format("= {} must be in {}", v,
                       range_text(f.lo, f.hi, f.lo_open, f.hi_open, false));
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const auto x = static_cast<double>(v);  // exact: every bound is below 2^53
    if (x >= f.lo && x <= f.hi) return {};
    return fmt::format("= {} must be in {}", v, range_text(f.lo, f.hi, false, false, true));
  } else {
    return {};
  }
}

// The member at the end of a path of member pointers: o.*a, (o.*a).*b, ...
template <auto First, auto... Rest, typename O>
constexpr auto& member_at(O& o) {
  if constexpr (sizeof...(Rest) == 0)
    return o.*First;
  else
    return member_at<Rest...>(o.*First);
}

// The key for one member of C (which may be a member of a base of C), or of a member's member
// (a path: field<C, &C::optimizer, &OptimizerConfig::lr>).
// `printed` (optional) says when the key is written; `flag` (optional) is its command-line flag.
template <typename C, auto... Path>
constexpr JsonKey<C> field(const char* name, bool (*printed)(const C&) = nullptr,
                           KeyFlag flag = {}) {
  using T = std::remove_cvref_t<decltype(member_at<Path...>(std::declval<C&>()))>;
  return {name,
          [](C& c, const nlohmann::json& j) { member_at<Path...>(c) = json_value<T>(j); },
          [](const C& c) { return json_of(member_at<Path...>(c)); },
          printed,
          flag,
          names_of<T>(),
          known_of<T>(),
          [](const C& c, const KeyFlag& f) { return outside_range(member_at<Path...>(c), f); }};
}
template <typename C, auto... Path>
constexpr JsonKey<C> field(const char* name, KeyFlag flag) {
  return field<C, Path...>(name, nullptr, flag);
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
      // The key as JSON writes it: a NUL or another control byte in it stays visible.
      const std::string shown = json_text(nlohmann::json(key));
      fail("[{}] unknown key '{}{}' (known: {})", scope, prefix, shown.substr(1, shown.size() - 2),
           list);
    }
  }
  for (const auto& k : keys) {
    if (!j.contains(k.name)) continue;
    try {
      k.read(c, j.at(k.name));
    } catch (const BadValue& e) {
      fail("[{}] key '{}{}' {}", scope, prefix, k.name, e.problem);
    } catch (const nlohmann::json::exception& e) {
      fail("[{}] key '{}{}' has the wrong type", scope, prefix, k.name);
    }
  }
}

// Refuses a value outside its key's range: the range its row gives its flag, which the command
// line checks as it reads the flag and this checks for every front end (a config file, Python,
// the C++ API): "[train] batch = 0 must be in [1, 2^32]". Every key is checked, also one c's kind
// or routing does not read (its default lies in its range).
template <typename C, std::size_t N>
void check_key_ranges(const std::array<JsonKey<C>, N>& keys, const C& c, std::string_view scope) {
  for (const auto& k : keys) {
    if (!k.outside || (k.flag.lo == 0 && k.flag.hi == 0)) continue;
    const std::string outside = k.outside(c, k.flag);
    check(outside.empty(), "[{}] {} {}", scope, k.name, outside);
  }
}

template <typename C, std::size_t N>
nlohmann::json write_keys(const std::array<JsonKey<C>, N>& keys, const C& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : keys)
    if (k.write && (!k.printed || k.printed(c))) j[k.name] = k.write(c);
  return j;
}

// The flags of the rows of `keys` that have one, their keys prefixed with `prefix` ("moe."), their
// defaults those of `defaults`.
template <typename C, std::size_t N>
std::vector<ConfigFlag> flags_of(const std::array<JsonKey<C>, N>& keys, const C& defaults,
                                 std::string_view prefix = "") {
  std::vector<ConfigFlag> out;
  for (const auto& k : keys) {
    if (k.flag.name == nullptr) continue;
    ConfigFlag f;
    f.name = k.flag.name;
    f.key = std::string(prefix) + k.name;
    if (k.write) f.default_value = k.write(defaults);
    if (k.names) f.names = k.names();
    f.known = k.known;
    f.help = k.flag.help;
    for (const auto& [mark, sep] : {std::pair{"{names}", ", "}, std::pair{"{names or}", " or "}})
      if (const auto at = f.help.find(mark); at != std::string::npos)
        f.help.replace(at, std::string_view(mark).size(), join_names(f.names, sep));
    using V = ConfigFlag::Value;
    if (f.default_value.is_boolean())
      f.value = k.flag.both ? V::both : k.flag.negated ? V::off : V::on;
    else if (k.names)
      f.value = V::name;
    else if (f.default_value.is_number_integer())
      f.value = V::integer;
    else
      f.value = V::real;
    f.ranged = k.flag.lo != 0 || k.flag.hi != 0;
    f.lo = k.flag.lo;
    f.hi = k.flag.hi;
    f.lo_open = k.flag.lo_open;
    f.hi_open = k.flag.hi_open;
    if (k.flag.routing) f.routing = k.flag.routing;
    if (k.flag.presets) {
      std::string_view list = k.flag.presets;
      while (!list.empty()) {
        const auto comma = list.find(',');
        f.presets.emplace_back(prefix.empty() ? "" : prefix);
        f.presets.back() += list.substr(0, comma);
        list = comma == std::string_view::npos ? "" : list.substr(comma + 1);
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace ffnlab
