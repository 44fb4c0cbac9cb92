// Layer: what every layer with parameters shares: its ParameterSet, and moving those parameters
// into a bigger buffer (a Transformer keeps all of its layers' parameters in one buffer, so that
// the optimizer, clipping and checkpoints are one loop each).
#pragma once

#include "ffnlab/layers/parameters.hpp"

namespace ffnlab {

class Layer {
 public:
  virtual ~Layer() = default;

  virtual ParameterSet& parameters() = 0;

  // Moves the parameters into `values` / `grads` (views of a bigger buffer, count() elements).
  void move_parameters(Tensor values, Tensor grads) {
    parameters().move_to(std::move(values), std::move(grads));
    bind_parameters();
  }

 protected:
  // Re-takes the layer's views of its parameters after they moved.
  virtual void bind_parameters() = 0;
};

}  // namespace ffnlab
