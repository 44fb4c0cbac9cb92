// The registration table's lookup: RoutingKind's values, in order, to each family's
// family_of<> (defined in the family's own file), and the properties asked of a family.
#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "check.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

template <std::size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  return std::array{&family_of<static_cast<RoutingKind>(I)>...};
}
constexpr auto kFamilies =
    make_table(std::make_index_sequence<static_cast<std::size_t>(RoutingKind::count)>());

}  // namespace

const RoutingFamily& routing_family(RoutingKind kind) {
  const auto i = static_cast<std::size_t>(kind);
  check(i < kFamilies.size(), "[moe] invalid routing {}", i);
  return kFamilies[i]();
}

bool set_routing(RouterConfig& m, std::string_view name) {
  for (const auto& known : enum_names<RoutingKind>())
    if (known == name) {
      m.routing = parse_enum<RoutingKind>(name);
      return true;
    }
  return false;
}

std::vector<std::string> routing_names() {
  return enum_names<RoutingKind>();
}

bool looks_at_whole_sequence(RoutingKind kind) {
  return routing_family(kind).whole_sequence;
}

bool splits_experts(RoutingKind kind) {
  return routing_family(kind).splits_experts;
}

std::vector<std::string> unused_keys(RoutingKind kind) {
  std::vector<std::string> out;
  std::string_view list = routing_family(kind).unused;
  while (!list.empty()) {
    const auto comma = list.find(',');
    out.emplace_back(list.substr(0, comma));
    list = comma == std::string_view::npos ? "" : list.substr(comma + 1);
  }
  return out;
}

bool routing_reads(RoutingKind kind, std::string_view key) {
  for (const auto& k : unused_keys(kind))
    if (k == key) return false;
  return true;
}

nlohmann::json routing_defaults(RoutingKind routing) {
  return nlohmann::json::parse(routing_family(routing).defaults);
}

bool reads_token_ids(const FFNConfig& config) {
  return config.kind == FFNKind::moe && routing_family(config.moe.routing).needs_token_ids;
}

nlohmann::json routing_defaults(std::string_view routing) {
  return routing_defaults(parse_enum<RoutingKind>(routing));
}

}  // namespace ffnlab
