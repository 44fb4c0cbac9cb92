// Hugging Face config.json -> FFNConfig for the MLP of one decoder layer.
// Supported model_type: llama, mistral, qwen2 (gate/up/down, SwiGLU by hidden_act, mlp_bias) and
// chatglm (fused dense_h_to_4h, ffn_hidden_size, add_bias_linear).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab {

bool is_hf_config(const nlohmann::json& j);  // has a "model_type"
FFNConfig hf_ffn_config(const nlohmann::json& j);

}  // namespace ffnlab
