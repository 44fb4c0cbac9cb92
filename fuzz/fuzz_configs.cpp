// libFuzzer target: ffnlab's own configs. The same JSON is read as a layer config (docs/config.md),
// a model config and a training config. Whatever is accepted must be costed without overflow, and
// a small accepted layer must run forward and backward, and inference from f32 and bf16 weights;
// anything else must be an ffnlab::Error.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/trainer.hpp"

namespace {

void layer(const nlohmann::json& j) {
  const ffnlab::FFNConfig c = ffnlab::config_from_json(j);
  const ffnlab::FFNCost cost = ffnlab::ffn_cost(c, 16);
  if (cost.params > (1 << 16)) return;  // built and run only when small
  auto ffn = ffnlab::make_ffn(c, 1);
  const ffnlab::Tensor x = ffnlab::random_normal({3, c.d_model}, 2);
  ffnlab::Tensor y, dx;
  ffn->forward(y, x, true);
  ffn->backward(dx, x);
  // Inference of 3 tokens takes the streaming decode path (ops/few_rows), from f32 and bf16.
  ffn->forward(y, x, false);
  ffn->set_inference_weights(ffnlab::DType::bf16);
  ffn->forward(y, x, false);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    layer(j);
  } catch (const ffnlab::Error&) {
  }
  try {
    const ffnlab::LMConfig m = ffnlab::lm_config_from_json(j);
    (void)ffnlab::transformer_cost(m, 1);
  } catch (const ffnlab::Error&) {
  }
  try {
    (void)ffnlab::train_config_from_json(j);
  } catch (const ffnlab::Error&) {
  }
  return 0;
}
