// Optimizers over one contiguous parameter buffer: SGD (with momentum), Adam (L2 weight decay
// added to the gradient, torch.optim.Adam) and AdamW (decoupled weight decay, torch.optim.AdamW),
// with the same arithmetic order as PyTorch's single-tensor implementation. Parameters that are
// not trainable are skipped; weight decay applies only where `decayed` says so (matrices, not
// norms or biases). One loop over contiguous runs of the buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/names.hpp"

namespace ffnlab {

enum class OptimizerKind : std::uint8_t { sgd, adam, adamw, count };
template <>
struct EnumNames<OptimizerKind> {
  static constexpr auto table = name_table<OptimizerKind>("optimizer", "optimizer",
                                                          {{OptimizerKind::sgd, "sgd"},
                                                           {OptimizerKind::adam, "adam"},
                                                           {OptimizerKind::adamw, "adamw"}});
};
static_assert(EnumNames<OptimizerKind>::table.complete());

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  float lr = 3e-3f;  // the peak learning rate (the schedule scales it)
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float momentum = 0.f;  // SGD only
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, ParameterSet& params,
            const std::function<bool(const Parameter&)>& decayed);

  // One update of every trainable parameter from params.grads() at learning rate `lr`.
  void step(float lr);

  const OptimizerConfig& config() const { return config_; }
  std::int64_t steps() const { return steps_; }
  // State for checkpoints: [count] each (v is empty for SGD; m is SGD's momentum buffer).
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }
  // Leaves the buffer's ranges [begin, end) out of every later step (expert parallelism: the
  // experts another rank trains).
  void exclude(const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges);

 private:
  struct Run {
    std::int64_t begin, end;
    bool decay;
  };
  OptimizerConfig config_;
  ParameterSet& params_;
  std::vector<Run> runs_;  // trainable ranges of the buffer, merged where neighbours agree
  Tensor m_, v_;
  std::int64_t steps_ = 0;
};

// √(Σ g²) over the buffer, summed in a fixed order (the same for any thread count).
double global_norm(const Tensor& buffer);
// buffer *= factor.
void scale_buffer(Tensor& buffer, float factor);

}  // namespace ffnlab
