// ParameterSet: a layer's parameters in one contiguous f32 buffer, with a gradient buffer of the
// same layout, and named views into both. The optimizer and checkpointing are then one loop.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

struct Parameter {
  std::string name;  // Hugging Face naming, e.g. "gate_proj.weight"
  Shape shape;
  std::int64_t offset;    // elements into the buffer
  Tensor value;           // view into values()
  Tensor grad;            // view into grads()
  bool trainable = true;  // false: state kept with the weights but not moved by the optimizer
                          // (the aux-loss-free balancing bias); its gradient stays zero
};

class ParameterSet {
 public:
  // Declares parameters in buffer order; then allocate() once.
  void declare(std::string name, Shape shape, bool trainable = true);
  void allocate();
  // Declares every parameter of `child` under `prefix`. After allocate(), child_values/grads
  // are the part of this buffer the child's parameters belong in (FeedForward::move_parameters
  // moves them there), so that a layer built from other layers (MoE with a shared expert, a
  // Transformer) still keeps one contiguous buffer.
  void declare_all(const ParameterSet& child, const std::string& prefix);
  Tensor child_values(const ParameterSet& child, const std::string& prefix);
  Tensor child_grads(const ParameterSet& child, const std::string& prefix);

  const std::vector<Parameter>& list() const { return params_; }
  std::vector<Parameter>& list() { return params_; }
  const Parameter& at(std::string_view name) const;
  Parameter& at(std::string_view name);
  bool contains(std::string_view name) const;

  std::int64_t count() const { return size_; }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  // A view spanning `shape` from a parameter's start, across its neighbours in the buffer
  // (gate_proj and up_proj declared one after the other read as one [2F, D] matrix).
  Tensor value_span(std::string_view first, Shape shape);
  Tensor grad_span(std::string_view first, Shape shape);

  void zero_grad();

  // Re-points every view into `values` / `grads` (1-D, count() elements), copying the current
  // values and gradients there first.
  void move_to(Tensor values, Tensor grads);

 private:
  // Transparent hashing: at() and contains() look names up without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<Parameter> params_;
  std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_;  // name -> i
  std::int64_t size_ = 0;
  Tensor values_, grads_;
};

// torch.nn.Linear's default initialisation: U(-1/√in, 1/√in) for weight and bias.
void init_uniform(Tensor& t, float bound, std::mt19937_64& rng);
// Draws [first, first + part.numel()) of `total` U(-bound, bound) draws from rng, the others
// drawn and dropped: a part of a stack (an expert-parallel rank's experts) gets the values it
// has in the whole stack.
void init_uniform_part(Tensor& part, float bound, std::mt19937_64& rng, std::int64_t first,
                       std::int64_t total);
// N(0, std²) for every element (embeddings; GPT-2's initialisation of every matrix).
void init_normal(Tensor& t, float std, std::mt19937_64& rng);
// A new tensor of N(0, std²) values from `seed` (benchmark and measurement inputs).
Tensor random_normal(Shape shape, std::uint64_t seed, float std = 1.0f);

}  // namespace ffnlab
