// The command-line flags of the config keys. Each row of a config's key table (the FFN layer's,
// its MoE's, the language model's, the training settings') may name a flag with its help and
// range; these functions list them, and the front ends generate their flags from the lists, so
// that a key and its flag are written in one place (CONTRIBUTING.md, "Add a router option").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/ops/router.hpp"

namespace ffnlab {

struct ConfigFlag {
  enum class Value : std::uint8_t {
    integer,  // a JSON integer (range: lo..hi; none: any non-negative one)
    real,     // a JSON number in the range
    name,     // one of `names`
    on,       // a switch: given, the key is true
    off,      // a switch: given, the key is false (--no-bias)
    both,     // a switch in both senses: --normalize sets the key true, --no-normalize false
  };
  std::string name;  // "--top-k" (aliases after a comma: "--no-bias,--no-ffn-bias")
  std::string key;   // its key in the config's JSON, nested with dots: "moe.top_k"
  std::string help;
  Value value = Value::integer;
  nlohmann::json default_value;    // the key's value in a default config (null: none)
  std::vector<std::string> names;  // Value::name: the values
  // Value::name of an enum key: whether a name (or an alias) reads as one (null: not checked
  // where the flag is read, only by the config's reader).
  bool (*known)(std::string_view) = nullptr;
  bool ranged = false;
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  std::string routing;  // read only under this MoE routing ("" : under any)
  // A preset (--variant): the keys it sets, beside the other keys of its config.
  std::vector<std::string> presets;
};

// The FFN layer's flags, then its MoE's (keys "moe.*"), in help order. --d-model is the layer's
// width, which a language model shares.
std::vector<ConfigFlag> ffn_config_flags();
// The language model's own flags (its FFN's are ffn_config_flags', under "ffn.").
std::vector<ConfigFlag> lm_config_flags();
// The training settings' flags (keys of train_config_to_json).
std::vector<ConfigFlag> train_config_flags();

// What a routing changes of the MoE keys a command line or a config file leaves out, as keys of
// the "moe" object (its RoutingFamily::defaults): top-p's, ReLU's and expert choice's weights are
// not divided by their sum, and the load-balancing loss is for routings that choose by score.
// (By value: routing_defaults in layers/moe/routing_family.hpp.)
nlohmann::json routing_defaults(std::string_view routing);

}  // namespace ffnlab
