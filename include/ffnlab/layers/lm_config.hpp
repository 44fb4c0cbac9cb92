// LMConfig: a byte-level (or any-vocabulary) Transformer language model around one FFN config.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/ops/norm.hpp"

namespace ffnlab {

enum class PositionKind : std::uint8_t { learned, sinusoidal, rope, none, count };
template <>
struct EnumNames<PositionKind> {
  static constexpr auto table = name_table<PositionKind>("lm", "positions",
                                                         {{PositionKind::learned, "learned"},
                                                          {PositionKind::sinusoidal, "sinusoidal"},
                                                          {PositionKind::rope, "rope"},
                                                          {PositionKind::none, "none"}});
};
static_assert(EnumNames<PositionKind>::table.complete());

struct LMConfig {
  std::int64_t vocab = 256;    // V
  std::int64_t d_model = 128;  // D
  int layers = 4;              // L
  std::int64_t heads = 4;      // H
  std::int64_t context = 128;  // longest sequence S (the learned position table's rows)
  PositionKind positions = PositionKind::learned;
  float rope_theta = 10000.f;
  NormKind norm = NormKind::layernorm;
  float norm_eps = 1e-5f;
  bool pre_norm = true;    // false: post-norm (the original Transformer, the tutorial's encoder)
  bool final_norm = true;  // a norm after the last block (pre-norm models have one)
  bool tied_head = true;   // the LM head is the token embedding, transposed
  bool attn_bias = true;   // biases of q/k/v/o
  bool causal = true;      // false: bidirectional attention (the tutorial's encoder)
  float dropout = 0.f;     // after the embeddings and on each residual branch
  // Initialisation: every matrix (embeddings, projections, router) N(0, init_std) and every bias
  // zero, as GPT-2 does; 0 keeps torch.nn's defaults (Linear U(±1/√in), embeddings N(0, 0.02)).
  // Measured on the reference configuration (docs/training.md): PyTorch reaches 3.13 bits/byte
  // after 600 steps with 0.02 and 3.62 with torch's defaults (bench/torch_train.py --init).
  float init_std = 0.02f;
  FFNConfig ffn;  // every block's FFN; ffn.d_model == d_model
};

// Throws "[lm] ..." naming the first thing that makes no sense.
void validate(const LMConfig& config);

// The tutorial's 6-layer encoder: d_model 512, 8 heads, ReLU FFN 2048 with biases,
// post-norm, bidirectional, sinusoidal positions, sequences of 100 tokens; with the residual
// around attention that the tutorial's code forgot. No dropout (set it where it matters).
LMConfig tutorial_encoder_config();

// JSON: {"vocab": 256, ..., "ffn": {<docs/config.md>}}. Unknown keys are an error.
LMConfig lm_config_from_json(const nlohmann::json& j);
// A model's FFN from its layer JSON (the model config's "ffn", or a layer file given to a
// model): one that names no d_model takes the model's, and one without d_ff the variant's own
// width at it (default_d_ff, as `ffnlab train --variant` builds it).
FFNConfig ffn_in_model(const nlohmann::json& ffn, std::int64_t d_model);
nlohmann::json lm_config_to_json(const LMConfig& config);

}  // namespace ffnlab
