// The model flags of `ffnlab train` and the model they describe.
#include "model_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab::cli {

namespace {

using json = nlohmann::json;

// The model's JSON from its flags: the FFN's width is the model's and --context 0 is --seq. (A
// new run's model then takes its objective's keys, set_objective_keys; a resumed model is the
// checkpoint's, whatever the objective: the driver compares that setting.)
json model_json(const json& given, const TrainConfig& t) {
  json m = given;
  if (m.contains("ffn") && m["ffn"].contains("d_model")) m["d_model"] = m["ffn"]["d_model"];
  if (m.value("context", -1) == 0) m["context"] = t.seq;
  return m;
}

// The layer flags' defaults of `train`: a small model, each variant at its own width, and the
// load-balancing loss on where the routing takes one.
std::map<std::string, FlagChange> train_layer_defaults() {
  std::vector<std::string> without;  // the routings whose defaults drop the loss
  for (const auto& name : routing_names())
    if (routing_defaults(name).contains("aux_coef")) without.push_back(name);
  const std::string last = without.back();
  without.pop_back();
  return {{"--d-model", {.default_value = "128"}},
          {"--d-ff",
           {.default_value = "0",
            .lo = 0,
            .help = "FFN hidden width F (0: 4·D; for the GLU kinds the multiple of 8 closest to "
                    "the parameters of the ReLU FFN of 4·D, about 8/3·D)"}},
          {"--aux-coef",
           {.default_value = fmt::format("{}", kTrainAuxCoef),
            .help = fmt::format("MoE: load-balancing loss coefficient (default 0 with --routing "
                                "{} or {}, which refuse it)",
                                join_names(without), last)}}};
}

}  // namespace

void ModelFlags::add(CLI::App& cmd, const std::string& group) {
  flags_.add(cmd, select_flags(ffn_config_flags(), {"--variant"}), group, "ffn.",
             {{"--variant", {.default_value = "relu"}}});
  cmd.add_option("--model-config", model_config_,
                 "whole-model JSON (docs/config.md) instead of the model flags")
      ->check(named_path())
      ->group(group);
  add_layer_flags(cmd, flags_, ffn_config_, group, "ffn.", train_layer_defaults());
  flags_.add(cmd, lm_config_flags(), group, "",
             {{"--context",
               {.default_value = "0",
                .shown = false,
                .lo = 0,
                .help = "longest sequence (default: --seq)"}}});
}

// The model a file describes, with the objective's keys where the file leaves them out (as for
// the flags' model and Python's): no model flag may stand beside it. (A layer flag beside a
// layer file is refused by refuse_unused_layer_flags.)
LMConfig ModelFlags::model_of_file(Objective objective) const {
  for (const ConfigFlag* f : flags_.given_flags())
    throw UsageError(fmt::format(
        "{}: does not apply with --model-config, whose file describes the whole model (set it "
        "there)",
        flags_.given_name(*f)));
  if (!ffn_config_.empty())
    throw UsageError(
        "--ffn-config: does not apply with --model-config, whose file describes the whole model "
        "(set it there)");
  nlohmann::json file;
  LMConfig c = read_lm_config_file(model_config_, &file);
  try {
    set_objective_keys(c, objective, given_model_keys(file));
    validate(c);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(), model_config_));
  }
  return c;
}

// A new run's model: the flags', or --model-config's file.
LMConfig ModelFlags::model(const TrainConfig& t) const {
  if (!model_config_.empty()) return model_of_file(t.objective);
  if (ffn_config_.empty()) {  // (a layer file's own kind is checked by layer_config)
    const std::string variant = flags_.values("ffn.")["variant"].get<std::string>();
    refuse_flags_no_layer_reads(flags_, "ffn.", {variant_config(variant, 1, 1, false)},
                                "--variant " + variant);
  }
  // A layer file's width is the model's; one that names none takes --d-model's.
  const FFNConfig layer =
      layer_config(flags_, "ffn.", ffn_config_, "", flags_.values("ffn.")["d_model"]);
  json m = model_json(flags_.values(), t);
  m.erase("ffn");
  if (!ffn_config_.empty()) {
    refuse_other_width(flags_, "ffn.", ffn_config_, layer);
    m["d_model"] = layer.d_model;
  }
  LMConfig c = lm_config_from_json(m);
  set_objective_keys(c, t.objective, {.positions = flags_.given("--positions")});
  c.ffn = layer;
  validate(c);
  return c;
}

// How the model the given flags ask for differs from the checkpoint's, by the flags whose keys
// differ (a preset by its name, a switch in its own sense); when only keys that no flag set
// differ (the consequences of a flag: keys printed for one routing only), by those keys.
std::string ModelFlags::differences(const LMConfig& asked, const LMConfig& saved) const {
  const auto given = flags_.given_flags();
  std::string by_flag, by_key;
  std::set<const ConfigFlag*> named;
  for (const auto& d : json_differences(lm_config_to_json(asked), lm_config_to_json(saved))) {
    // --d-model sets the model's width too; a preset, the keys it sets.
    const ConfigFlag* f = flags_.flag_of_key(d.key == "d_model" ? "ffn.d_model" : d.key);
    for (const ConfigFlag* g : given)
      if (std::find(g->presets.begin(), g->presets.end(), d.key) != g->presets.end()) f = g;
    if (!f || std::find(given.begin(), given.end(), f) == given.end()) {
      by_key += fmt::format("{}{} would be {}, the checkpoint has {}", by_key.empty() ? "" : "; ",
                            d.key, value_text(d.left), value_text(d.right));
      continue;
    }
    if (!named.insert(f).second) continue;
    json left = d.left.is_null() ? f->default_value : d.left;  // not printed: the default
    json right = d.right.is_null() ? f->default_value : d.right;
    if (!f->presets.empty()) {
      left = variant_name(asked.ffn);
      right = variant_name(saved.ffn);
    } else if (f->value == ConfigFlag::Value::off) {
      left = !left.get<bool>();
      right = !right.get<bool>();
    }
    by_flag += fmt::format("{}{} gives {}, the checkpoint has {}", by_flag.empty() ? "" : "; ",
                           flags_.given_name(*f), value_text(left), value_text(right));
  }
  return by_flag.empty() ? by_key : by_flag;
}

void ModelFlags::check_resumed(const LMConfig& saved, const TrainConfig& t,
                               const std::string& resume) const {
  const auto given = flags_.given_flags();
  if (given.empty() && model_config_.empty() && ffn_config_.empty()) return;
  const json before = lm_config_to_json(saved);
  LMConfig asked;
  try {
    if (!model_config_.empty()) {
      asked = model_of_file(t.objective);
    } else {
      json m = before;
      if (!ffn_config_.empty()) {  // as in model(): the file's width is the model's
        const std::int64_t d_model = flags_.key_given("ffn.d_model")
                                         ? flags_.values("ffn.")["d_model"].get<std::int64_t>()
                                         : saved.d_model;
        const FFNConfig layer = read_ffn_config_file(ffn_config_, d_model);
        refuse_other_width(flags_, "ffn.", ffn_config_, layer);
        m["ffn"] = config_to_json(layer);
        m["d_model"] = layer.d_model;
      }
      for (const ConfigFlag* f : given)
        for (const auto& key : f->presets) m["ffn"].erase(key.substr(4));
      json patch = model_json(flags_.values("", true), t);
      if (patch.contains("ffn") && patch["ffn"].value("d_ff", -1) == 0) {
        patch["ffn"].erase("d_ff");  // the variant's own width
        m["ffn"].erase("d_ff");
      }
      m.merge_patch(patch);
      // Keys of another kind of layer (the checkpoint's MoE keys under a --variant that is not
      // an MoE) are not carried over; such keys given as flags are refused.
      json shape = m["ffn"];
      shape.erase("moe");
      shape.erase("branches");
      const FFNConfig asked_layer = config_from_json(shape);
      refuse_flags_no_layer_reads(flags_, "ffn.", {asked_layer},
                                  flags_.given("--variant")
                                      ? "--variant " + variant_name(asked_layer)
                                      : "the checkpoint's " + variant_name(asked_layer) + " layer");
      if (asked_layer.kind != FFNKind::moe) m["ffn"].erase("moe");
      if (asked_layer.kind != FFNKind::multi_branch) m["ffn"].erase("branches");
      const std::string routing = m["ffn"].contains("moe") && m["ffn"]["moe"].contains("routing")
                                      ? m["ffn"]["moe"]["routing"].get<std::string>()
                                      : "topk";
      refuse_unused_layer_flags(flags_, "ffn.", !ffn_config_.empty(), routing);
      // A routing brings its defaults when it changes the checkpoint's (the same routing given
      // again changes nothing: an older checkpoint keeps what it was trained with).
      const json& saved_ffn = before.at("ffn");
      const std::string saved_routing =
          saved_ffn.contains("moe") && saved_ffn.at("moe").contains("routing")
              ? saved_ffn.at("moe").at("routing").get<std::string>()
              : "topk";
      if (flags_.key_given("ffn.moe.routing") && routing != saved_routing) {
        const json defaults = routing_defaults(routing);
        for (const auto& [key, value] : defaults.items())
          if (!flags_.key_given("ffn.moe." + key)) m["ffn"]["moe"][key] = value;
      }
      asked = lm_config_from_json(m);
    }
  } catch (const UsageError& e) {  // a flag that means nothing for that layer: a usage error
    throw UsageError(fmt::format(
        "[train] resuming {}: {} (a resumed run keeps its model; leave the model flags out)",
        resume, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format(
        "[train] resuming {}: the model flags do not fit the checkpoint's model: {} (a resumed "
        "run keeps its model; leave the model flags out)",
        resume, e.what()));
  }
  const std::string diff = differences(asked, saved);
  if (!diff.empty())
    throw Error(fmt::format(
        "[train] resuming {}: the model flags do not match the checkpoint's model: {} (a resumed "
        "run keeps its model; leave the model flags out)",
        resume, diff));
}

}  // namespace ffnlab::cli
