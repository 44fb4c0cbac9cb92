// FeedForward: the one interface of every FFN layer, dense or MoE, and its factory.
#pragma once

#include <cstdint>
#include <memory>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

// Measured on the last training forward.
struct FFNStats {
  std::int64_t tokens = 0;
  double zero_fraction = 0.0;  // fraction of exactly-zero hidden activations h [T, F]
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;

  virtual const FFNConfig& config() const = 0;
  // y [T, D] = FFN(x [T, D]); y is resized if needed. With train = true the activations that
  // backward needs are saved; x is kept by reference, so it must not change until backward.
  virtual void forward(Tensor& y, const Tensor& x, bool train) = 0;
  // dx [T, D] (overwritten; resized if needed) from dy [T, D] of the last training forward.
  // Parameter gradients accumulate into parameters().grads().
  virtual void backward(Tensor& dx, const Tensor& dy) = 0;
  virtual ParameterSet& parameters() = 0;
  virtual FFNStats stats() const = 0;

  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

 protected:
  Precision precision_ = Precision::f32;
};

// Builds the layer a config describes, initialised like torch.nn.Linear from `seed`.
// Throws "[ffn] ..." for an invalid config.
std::unique_ptr<FeedForward> make_ffn(const FFNConfig& config, std::uint64_t seed = 0);

}  // namespace ffnlab
