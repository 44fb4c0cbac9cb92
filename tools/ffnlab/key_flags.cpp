// Command-line flags generated from the config key rows.
#include "key_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/names.hpp"

namespace ffnlab::cli {

namespace {

using json = nlohmann::json;
using Value = ConfigFlag::Value;

// A default as the help shows it: a real with six significant digits (0.95 for 0.95f).
std::string shown(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    std::ostringstream s;
    s << v.get<double>();
    return s.str();
  }
  return v.dump();
}

void set_at(json& j, std::string_view key, json value) {
  json* at = &j;
  for (auto dot = key.find('.'); dot != std::string_view::npos; dot = key.find('.')) {
    at = &(*at)[std::string(key.substr(0, dot))];
    key = key.substr(dot + 1);
  }
  (*at)[std::string(key)] = std::move(value);
}

void differences(const json& a, const json& b, const std::string& at,
                 std::vector<JsonDifference>& out) {
  if (a.is_object() && b.is_object()) {
    std::map<std::string, int> keys;
    for (const auto& [k, v] : a.items()) keys[k] |= 1;
    for (const auto& [k, v] : b.items()) keys[k] |= 2;
    for (const auto& [k, sides] : keys) {
      const std::string key = at.empty() ? k : at + "." + k;
      if (sides == 3)
        differences(a.at(k), b.at(k), key, out);
      else
        out.push_back({key, sides & 1 ? a.at(k) : json(), sides & 2 ? b.at(k) : json()});
    }
  } else if (a != b) {
    out.push_back({at, a, b});
  }
}

}  // namespace

std::vector<ConfigFlag> select_flags(const std::vector<ConfigFlag>& rows,
                                     const std::vector<std::string>& names) {
  std::vector<ConfigFlag> out;
  for (const auto& row : rows)
    if (std::find(names.begin(), names.end(), row.name) != names.end()) out.push_back(row);
  return out;
}

std::vector<JsonDifference> json_differences(const json& left, const json& right) {
  std::vector<JsonDifference> out;
  differences(left, right, "", out);
  return out;
}

void KeyFlags::add(CLI::App& cmd, const std::vector<ConfigFlag>& rows, const std::string& group,
                   const std::string& prefix, const std::map<std::string, FlagChange>& changes,
                   const std::vector<std::string>& skip) {
  for (const ConfigFlag& row : rows) {
    if (std::find(skip.begin(), skip.end(), row.name) != skip.end()) continue;
    Entry& e = entries_.emplace_back();
    e.row = row;
    e.row.key = prefix + row.key;
    for (auto& p : e.row.presets) p = prefix + p;
    const auto change = changes.find(row.name);
    const FlagChange* c = change == changes.end() ? nullptr : &change->second;
    if (c && !c->help.empty()) e.row.help = c->help;
    if (c && c->lo) e.row.lo = *c->lo;
    CLI::Option* o = nullptr;
    // (A switch takes no value: run_program sees to that for every program.)
    if (row.value == Value::on || row.value == Value::off) {
      o = cmd.add_flag(row.name, e.on, e.row.help);
    } else if (row.value == Value::both) {  // --x, and --no-x for false
      if (row.name.find(',') != std::string::npos)
        throw std::logic_error("a two-sense switch has one name: " + row.name);
      o = cmd.add_flag(row.name + ",!--no-" + row.name.substr(2), e.on, e.row.help);
    } else {
      std::string def = row.default_value.is_null() ? "" : shown(row.default_value);
      if (c && c->default_value) def = *c->default_value;
      e.text = def;
      o = cmd.add_option(row.name, e.text, e.row.help);
      if (c && !c->shown) def.clear();
      if (!def.empty()) o->default_str(def);
      if (row.value == Value::integer) {
        o->type_name(e.row.ranged ? "INT" : "UINT");
        o->check(e.row.ranged ? int_in(static_cast<std::int64_t>(e.row.lo),
                                       static_cast<std::int64_t>(e.row.hi))
                              : any_count());
      } else if (row.value == Value::real) {
        o->type_name("FLOAT");
        if (e.row.ranged) o->check(real_in(e.row.lo, e.row.hi, e.row.hi_open, e.row.lo_open));
      } else if (row.value == Value::name && row.known) {
        o->check(CLI::Validator(
            [known = row.known, names = join_names(row.names)](std::string& text) -> std::string {
              if (known(text)) return {};
              return fmt::format("'{}' is not one of {}", text.substr(0, 40), names);
            },
            ""));
      }
    }
    o->group(group);
    e.option = o;
  }
}

bool KeyFlags::given(std::string_view flag) const {
  for (const Entry& e : entries_)
    if (e.option->get_name() == flag) return e.option->count() > 0;
  return false;
}

bool KeyFlags::key_given(std::string_view key) const {
  for (const Entry& e : entries_)
    if (e.row.key == key) return e.option->count() > 0;
  return false;
}

std::vector<const ConfigFlag*> KeyFlags::given_flags() const {
  std::vector<const ConfigFlag*> out;
  for (const Entry& e : entries_)
    if (e.option->count() > 0) out.push_back(&e.row);
  return out;
}

const ConfigFlag* KeyFlags::flag_of_key(std::string_view key) const {
  for (const Entry& e : entries_)
    if (e.row.key == key) return &e.row;
  return nullptr;
}

std::string KeyFlags::given_name(const ConfigFlag& flag) const {
  if (flag.value == Value::both) {
    const std::string written = as_written(flag);
    return written.substr(0, written.find(' '));
  }
  return flag.name.substr(0, flag.name.find(','));
}

std::string KeyFlags::as_written(const ConfigFlag& flag) const {
  for (const Entry& e : entries_) {
    if (&e.row != &flag) continue;
    if (e.row.value == Value::both)
      return e.on ? e.row.name : fmt::format("--no-{}", e.row.name.substr(2));
    if (e.row.value == Value::on || e.row.value == Value::off) return e.option->get_name();
    return fmt::format("{} {}", e.option->get_name(), e.text);
  }
  return flag.name;
}

json KeyFlags::value_of(const Entry& e) const {
  const bool given = e.option->count() > 0;
  switch (e.row.value) {
    case Value::on:
      return given ? json(true) : e.row.default_value;
    case Value::off:
      return given ? json(false) : e.row.default_value;
    case Value::both:
      return given ? json(e.on) : e.row.default_value;
    case Value::name:
      return e.text;
    case Value::real:
      return static_cast<double>(std::strtold(e.text.c_str(), nullptr));
    case Value::integer: {
      std::int64_t v = 0;
      const char* end = e.text.data() + e.text.size();
      if (const auto [ptr, ec] = std::from_chars(e.text.data(), end, v);
          ec == std::errc() && ptr == end)
        return v;
      std::uint64_t u = 0;
      std::from_chars(e.text.data(), end, u);  // checked by the flag's validator
      return u;
    }
  }
  return nullptr;
}

json KeyFlags::values(const std::string& under, bool given_only) const {
  json out = json::object();
  for (const Entry& e : entries_) {
    if (e.row.key.rfind(under, 0) != 0 || (given_only && e.option->count() == 0)) continue;
    set_at(out, std::string_view(e.row.key).substr(under.size()), value_of(e));
  }
  return out;
}

void add_layer_flags(CLI::App& cmd, KeyFlags& flags, std::string& file, const std::string& group,
                     const std::string& prefix, const std::map<std::string, FlagChange>& changes) {
  flags.add(cmd, ffn_config_flags(), group, prefix, changes, {"--variant"});
  cmd.add_option("--ffn-config", file,
                 "a layer config file instead of the variant and the flags above (ffnlab JSON, "
                 "docs/config.md, or a Hugging Face config.json); its d_model is the width "
                 "(--d-model may repeat it, not change it)")
      ->check(named_path())
      ->group(group);
}

void refuse_unused_layer_flags(const KeyFlags& flags, const std::string& prefix, bool file,
                               std::string_view routing) {
  for (const ConfigFlag* f : flags.given_flags()) {
    if (f->key.rfind(prefix, 0) != 0) continue;
    const std::string name = flags.given_name(*f);
    // (--d-model stays: it is also the model's width, which the layer's must match.)
    if (file && name != "--d-model")
      throw UsageError(fmt::format(
          "{}: does not apply with a layer config file, which describes the whole layer (set "
          "it there)",
          name));
    if (!f->routing.empty() && f->routing != routing)
      throw UsageError(
          fmt::format("{}: applies to --routing {} only, not {}", name, f->routing, routing));
  }
}

void refuse_flags_no_layer_reads(const KeyFlags& flags, const std::string& prefix,
                                 const std::vector<FFNConfig>& layers,
                                 std::string_view layers_text) {
  const auto any = [&](FFNKind kind) {
    return std::any_of(layers.begin(), layers.end(),
                       [&](const FFNConfig& c) { return c.kind == kind; });
  };
  for (const ConfigFlag* f : flags.given_flags()) {
    if (f->key.rfind(prefix, 0) != 0) continue;
    const std::string_view key = std::string_view(f->key).substr(prefix.size());
    if (key.starts_with("moe.") && !any(FFNKind::moe))
      throw UsageError(fmt::format("{}: applies to an MoE layer (variant moe), and {} has none",
                                   flags.given_name(*f), layers_text));
    if (key == "branches" && !any(FFNKind::multi_branch))
      throw UsageError(fmt::format("{}: applies to the gated FFN (variant gated), and {} has none",
                                   flags.given_name(*f), layers_text));
  }
}

void refuse_flags_no_variant_reads(const KeyFlags& flags, const std::vector<std::string>& names) {
  std::vector<FFNConfig> layers;
  for (const std::string& name : names) layers.push_back(variant_config(name, 1, 1, false));
  refuse_flags_no_layer_reads(flags, "", layers, "--variants " + join_names(names, ","));
}

namespace {
// The layer's JSON the flags describe (layer_config without a file).
json layer_json(const KeyFlags& flags, const std::string& prefix, const std::string& variant) {
  json j = flags.values(prefix);
  refuse_unused_layer_flags(flags, prefix, false, j["moe"]["routing"].get<std::string>());
  if (!variant.empty()) j["variant"] = variant;
  // The keys of another kind of layer hold their defaults (refuse_flags_no_layer_reads refuses
  // them given): a config does not carry them.
  const FFNKind kind = variant_config(j["variant"].get<std::string>(), 1, 1, false).kind;
  if (kind != FFNKind::moe) j.erase("moe");
  if (kind != FFNKind::multi_branch) j.erase("branches");
  if (kind == FFNKind::moe) {
    const json defaults = routing_defaults(j["moe"]["routing"].get<std::string>());
    for (const auto& [key, value] : defaults.items())
      if (!flags.key_given(prefix + "moe." + key)) j["moe"][key] = value;
  }
  if (j["d_ff"] == 0)  // the variant's own width
    j["d_ff"] = train_ffn(j["variant"].get<std::string>(), j["d_model"].get<std::int64_t>(), 0,
                          j["bias"].get<bool>())
                    .d_ff;
  return j;
}
}  // namespace

FFNConfig layer_config(const KeyFlags& flags, const std::string& prefix, const std::string& file,
                       const std::string& variant, std::int64_t model_d_model) {
  if (!file.empty()) {
    refuse_unused_layer_flags(flags, prefix, true, "");
    return read_ffn_config_file(file, model_d_model);
  }
  return config_from_json(layer_json(flags, prefix, variant));
}

void refuse_flags_beside_layer_file(const KeyFlags& flags, const CLI::Option& variants,
                                    const std::string& file, const FFNConfig& layer) {
  if (variants.count() > 0)
    throw UsageError("--variants: does not apply with a layer config file, which is the one layer");
  refuse_other_width(flags, "", file, layer);
}

void refuse_other_width(const KeyFlags& flags, const std::string& prefix, const std::string& file,
                        const FFNConfig& layer) {
  if (!flags.key_given(prefix + "d_model")) return;
  const auto d_model = flags.values(prefix)["d_model"].get<std::int64_t>();
  if (d_model != layer.d_model)
    throw UsageError(
        fmt::format("--d-model {}: the layer of {} has d_model {}", d_model, file, layer.d_model));
}

std::string value_text(const json& v) {
  if (v.is_null()) return "absent";
  if (v.is_structured()) {  // a whole object: its start
    const std::string text = v.dump();
    return text.size() > 60 ? text.substr(0, 57) + "..." : text;
  }
  if (!v.is_number_float()) return v.dump();
  const double d = v.get<double>();
  const auto f = static_cast<float>(d);
  return static_cast<double>(f) == d ? fmt::format("{}", f) : fmt::format("{}", d);
}

CLI::Option* add_variants_flag(CLI::App& cmd, std::string& variants) {
  return cmd
      .add_option("--variants", variants,
                  "comma-separated FFN variants, or 'all' (" + join_names(variant_names()) + ")")
      ->capture_default_str();
}

}  // namespace ffnlab::cli
