// Names of ffnlab's closed sets: one mechanism for every enum.
//
// Each enum `E` (with a last member `count`) has, next to its declaration, a specialisation
//   template <> struct EnumNames<E> { static constexpr auto table = name_table<E>(...); };
// whose first `E::count` rows give the canonical names in enum order and whose further rows are
// aliases. `static_assert(EnumNames<E>::table.complete())` beside it fails the build when a
// value has no name. Then, for every enum alike:
//   enum_name(value)          the canonical name              "swiglu"
//   parse_enum<E>(text)       name or alias -> value, else Error "[ffn] unknown kind 'x' (known:
//   ...)" enum_names<E>()           the canonical names, in order (help text, "known:" lists)
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/error.hpp"

namespace ffnlab {

template <typename E>
struct NameRow {
  E value;
  const char* name;
};

template <typename E, std::size_t N>
struct NameTable {
  const char* scope;  // the error prefix: "[scope] unknown what 'x' (known: ...)"
  const char* what;
  std::array<NameRow<E>, N> rows;

  static constexpr std::size_t count = static_cast<std::size_t>(E::count);

  // Every value has its canonical row, in enum order, before any alias.
  constexpr bool complete() const {
    if (N < count) return false;
    for (std::size_t i = 0; i < count; ++i)
      if (static_cast<std::size_t>(rows[i].value) != i) return false;
    for (std::size_t i = count; i < N; ++i)
      if (static_cast<std::size_t>(rows[i].value) >= count) return false;
    return true;
  }

  const char* name(E value) const {
    const auto i = static_cast<std::size_t>(value);
    return i < count ? rows[i].name : "?";
  }

  // The value a name (or an alias) reads as; none for another name.
  std::optional<E> find(std::string_view text) const {
    for (const auto& row : rows)
      if (text == row.name) return row.value;
    return std::nullopt;
  }

  E parse(std::string_view text) const {
    if (const std::optional<E> value = find(text)) return *value;
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, falsely) on "literal" + string.
    std::string message = "[";
    message.append(scope).append("] unknown ").append(what).append(" '").append(text);
    message.append("' (known: ");
    for (std::size_t i = 0; i < N; ++i) message.append(i ? ", " : "").append(rows[i].name);
    message.append(")");
    throw Error(message);
  }

  std::vector<std::string> canonical() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < count; ++i) out.emplace_back(rows[i].name);
    return out;
  }
};

template <typename E, std::size_t N>
constexpr NameTable<E, N> name_table(const char* scope, const char* what,
                                     const NameRow<E> (&rows)[N]) {
  NameTable<E, N> t{scope, what, {}};
  for (std::size_t i = 0; i < N; ++i) t.rows[i] = rows[i];
  return t;
}

// Specialised beside each enum; see the top of this file.
template <typename E>
struct EnumNames;

template <typename E>
const char* enum_name(E value) {
  return EnumNames<E>::table.name(value);
}

template <typename E>
E parse_enum(std::string_view text) {
  return EnumNames<E>::table.parse(text);
}

template <typename E>
std::vector<std::string> enum_names() {
  return EnumNames<E>::table.canonical();
}

// "a, b, c": a list for help text.
inline std::string join_names(const std::vector<std::string>& names, std::string_view sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out.append(i ? sep : "").append(names[i]);
  return out;
}

}  // namespace ffnlab
