// Loading FFN layers from files: a config file (Hugging Face or ffnlab's own) and weights in
// safetensors under Hugging Face parameter names, with an optional prefix.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/parameters.hpp"

namespace ffnlab {

// A Hugging Face config.json (recognised by "model_type") or ffnlab's own layer config. With
// `model_d_model` > 0, the layer of a model of that width: an ffnlab config that names no
// d_model takes it (ffn_in_model); without, its missing keys are the layer defaults.
FFNConfig read_ffn_config_file(const std::string& path, std::int64_t model_d_model = 0);
// A whole model's config (docs/config.md): "[train] path: ..." for a file that is not one.
// `file`, when given, receives the file's JSON, for a caller that completes what the file leaves
// out (the objective's keys: set_objective_keys with given_model_keys).
LMConfig read_lm_config_file(const std::string& path, nlohmann::json* file = nullptr);

// Copies every parameter from `file`, where parameter "up_proj.weight" is stored as
// prefix + "up_proj.weight". A missing tensor, a shape mismatch or a tensor under the prefix
// that is no parameter of the layer (a bias the config leaves out, say) throws "[weights] ...".
void load_parameters(ParameterSet& params, const SafeTensors& file, const std::string& prefix);

}  // namespace ffnlab
