// The model flags of `ffnlab train`: --variant, --model-config, the FFN's flags, --ffn-config
// and the model's own, all generated from the config key rows but the two files; the model they
// describe for a new run, and their check against a resumed run's model.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/trainer.hpp"
#include "key_flags.hpp"

namespace ffnlab::cli {

class ModelFlags {
 public:
  void add(CLI::App& cmd, const std::string& group);

  // A new run's model for the training settings `t` (the objective, --seq): the flags', or
  // --model-config's file. Throws UsageError for a flag beside a file that sets its key.
  LMConfig model(const TrainConfig& t) const;

  // When resuming (the run folder `resume`), the model is the checkpoint's. The model flags
  // given are laid over its JSON with the rules of a new run (a preset replaces the keys it
  // sets, a routing brings its defaults) and must leave it as it is: Error naming each
  // difference by its flag. A flag not given is not compared: its default is not the user's word.
  void check_resumed(const LMConfig& saved, const TrainConfig& t, const std::string& resume) const;

 private:
  LMConfig model_of_file(Objective objective) const;
  std::string differences(const LMConfig& asked, const LMConfig& saved) const;

  KeyFlags flags_;  // --variant, the FFN's flags (keys "ffn.*") and the model's own
  std::string model_config_, ffn_config_;
};

}  // namespace ffnlab::cli
