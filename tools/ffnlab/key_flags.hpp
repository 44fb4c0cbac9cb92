// Command-line flags generated from the config key rows (ffnlab/config_flags.hpp): a command
// registers rows, and reads back every value, or the given ones, as JSON at the rows' keys,
// which the config readers then judge. No flag of a config key is written here or in a command.
#pragma once

#include <CLI/CLI.hpp>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/config_flags.hpp"
#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab::cli {

// What a command changes of a row.
struct FlagChange {
  std::optional<std::string> default_value = std::nullopt;  // used when not given
  bool shown = true;                                        // the default in the help
  std::optional<double> lo = std::nullopt;  // a lower bound of the command's own (d_ff 0)
  std::string help = "";                    // replaces the row's help when not empty
};

// The rows named, in their order.
std::vector<ConfigFlag> select_flags(const std::vector<ConfigFlag>& rows,
                                     const std::vector<std::string>& names);

class KeyFlags {
 public:
  // Registers a flag for each row (but those in `skip`) in `group`, its key placed under
  // `prefix` ("ffn.").
  void add(CLI::App& cmd, const std::vector<ConfigFlag>& rows, const std::string& group,
           const std::string& prefix = "", const std::map<std::string, FlagChange>& changes = {},
           const std::vector<std::string>& skip = {});

  bool given(std::string_view flag) const;
  bool key_given(std::string_view key) const;
  // The flags given, in the order they were registered.
  std::vector<const ConfigFlag*> given_flags() const;
  // The registered flag of a key (null: none).
  const ConfigFlag* flag_of_key(std::string_view key) const;
  // "--lr 0.5": a given flag as its user wrote it.
  std::string as_written(const ConfigFlag& flag) const;
  // The flag's name as given, for messages: its first name, or the sense a two-sense switch was
  // given in (--no-normalize).
  std::string given_name(const ConfigFlag& flag) const;

  // Every flag's value (given, or its default) at its key, the keys under `under` only and
  // relative to it ("ffn.": the layer's keys); given_only: the flags given.
  nlohmann::json values(const std::string& under = "", bool given_only = false) const;

 private:
  struct Entry {
    ConfigFlag row;  // its key with the prefix
    std::string text;
    bool on = false;
    CLI::Option* option = nullptr;
  };
  nlohmann::json value_of(const Entry& e) const;
  std::deque<Entry> entries_;  // CLI11 holds pointers into them
};

// The FFN layer's flags of a command: every row of ffn_config_flags() but --variant (a command
// takes variants its own way), placed under `prefix`, and --ffn-config into `file`.
void add_layer_flags(CLI::App& cmd, KeyFlags& flags, std::string& file, const std::string& group,
                     const std::string& prefix = "",
                     const std::map<std::string, FlagChange>& changes = {});

// Throws UsageError for a flag given that the layer would not read: any FFN flag (keys under
// `prefix`) but --d-model beside a layer file, a routing family's flag under another routing.
void refuse_unused_layer_flags(const KeyFlags& flags, const std::string& prefix, bool file,
                               std::string_view routing);

// Throws UsageError for a layer flag (keys under `prefix`) that none of `layers` reads: an MoE
// flag when no layer is an MoE, --branches when none is the gated FFN. `layers_text` names the
// layers in the message ("--variant relu", "--variants relu,gelu").
void refuse_flags_no_layer_reads(const KeyFlags& flags, const std::string& prefix,
                                 const std::vector<FFNConfig>& layers,
                                 std::string_view layers_text);

// The same for the commands that take --variants (params, toy): the layers of those names.
void refuse_flags_no_variant_reads(const KeyFlags& flags, const std::vector<std::string>& names);

// The layer the flags describe for `variant` (the flags' own --variant when empty), or
// --ffn-config's file when `file` is set. Of the flags: every FFN flag's value, d_ff 0 as the
// variant's default width (default_d_ff), and the routing's defaults (routing_defaults) for the
// MoE keys not given. Throws UsageError for a routing family's flag given under another
// routing, and for FFN flags beside --ffn-config. `model_d_model` > 0: the file is a model's
// layer, and takes that width where it names none (read_ffn_config_file).
FFNConfig layer_config(const KeyFlags& flags, const std::string& prefix, const std::string& file,
                       const std::string& variant, std::int64_t model_d_model = 0);

// For the commands that run or cost one layer per variant (params, toy), beside a layer config
// file: --variants (the file is the one layer) and a --d-model other than the file's layer's are
// refused (UsageError).
void refuse_flags_beside_layer_file(const KeyFlags& flags, const CLI::Option& variants,
                                    const std::string& file, const FFNConfig& layer);
// A layer file fixes the width: the --d-model of flags under `prefix` may repeat its d_model,
// not change it (UsageError).
void refuse_other_width(const KeyFlags& flags, const std::string& prefix, const std::string& file,
                        const FFNConfig& layer);

// Where two JSON objects differ, by dotted key in sorted order (null: the side has no value).
struct JsonDifference {
  std::string key;
  nlohmann::json left, right;
};
std::vector<JsonDifference> json_differences(const nlohmann::json& left,
                                             const nlohmann::json& right);

// A value in a message: a real as the float or double it is (0.01, not 0.009999999776482582),
// anything else as JSON ("absent" for null).
std::string value_text(const nlohmann::json& v);

// --variants LIST (comma-separated or 'all'), its help built from the variant table.
CLI::Option* add_variants_flag(CLI::App& cmd, std::string& variants);

}  // namespace ffnlab::cli
