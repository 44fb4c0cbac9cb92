// ParameterSet: contiguous parameter and gradient buffers with named views.
#include "ffnlab/layers/parameters.hpp"

#include "check.hpp"

namespace ffnlab {

void ParameterSet::declare(std::string name, Shape shape) {
  check(!values_.defined(), "[parameters] '{}' declared after allocate()", name);
  check(!contains(name), "[parameters] '{}' declared twice", name);
  const std::int64_t n = shape_numel(shape);
  params_.push_back(Parameter{std::move(name), std::move(shape), size_, {}, {}});
  size_ += n;
}

void ParameterSet::allocate() {
  values_ = Tensor({std::max<std::int64_t>(size_, 1)});
  grads_ = Tensor({std::max<std::int64_t>(size_, 1)});
  for (auto& p : params_) {
    p.value = values_.view(p.offset, p.shape);
    p.grad = grads_.view(p.offset, p.shape);
  }
}

bool ParameterSet::contains(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return true;
  return false;
}

Parameter& ParameterSet::at(std::string_view name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  fail("[parameters] no parameter named '{}'", name);
}
const Parameter& ParameterSet::at(std::string_view name) const {
  return const_cast<ParameterSet*>(this)->at(name);
}

Tensor ParameterSet::value_span(std::string_view first, Shape shape) {
  return values_.view(at(first).offset, std::move(shape));
}
Tensor ParameterSet::grad_span(std::string_view first, Shape shape) {
  return grads_.view(at(first).offset, std::move(shape));
}

void ParameterSet::zero_grad() {
  grads_.zero();
}

void init_uniform(Tensor& t, float bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  float* p = t.f32();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
}

}  // namespace ffnlab
