// ParameterSet: contiguous parameter and gradient buffers with named views.
#include "ffnlab/layers/parameters.hpp"

#include <algorithm>

#include "check.hpp"
#include "ffnlab/limits.hpp"

namespace ffnlab {

void ParameterSet::declare(std::string name, Shape shape, bool trainable) {
  check(!values_.defined(), "[parameters] '{}' declared after allocate()", name);
  check(!contains(name), "[parameters] '{}' declared twice", name);
  const std::int64_t n = shape_numel(shape);
  const std::int64_t end = checked_add(size_, n, "[parameters] parameter count");
  check(end <= limits::kElements, "[parameters] more than 2^40 parameters (at '{}')", name);
  index_.emplace(name, params_.size());
  params_.push_back(Parameter{std::move(name), std::move(shape), size_, {}, {}, trainable});
  size_ = end;
}

void ParameterSet::allocate() {
  values_ = Tensor({std::max<std::int64_t>(size_, 1)});
  grads_ = Tensor({std::max<std::int64_t>(size_, 1)});
  for (auto& p : params_) {
    p.value = values_.view(p.offset, p.shape);
    p.grad = grads_.view(p.offset, p.shape);
  }
}

void ParameterSet::declare_all(const ParameterSet& child, const std::string& prefix) {
  for (const auto& p : child.list()) declare(prefix + p.name, p.shape, p.trainable);
}

namespace {

// The offset of a child's parameters in the parent, checking that they were declared in order.
std::int64_t child_offset(const ParameterSet& parent, const ParameterSet& child,
                          const std::string& prefix) {
  check(!child.list().empty(), "[parameters] the child has no parameters");
  const std::int64_t begin = parent.at(prefix + child.list().front().name).offset;
  for (const auto& p : child.list())
    check(parent.at(prefix + p.name).offset - begin == p.offset,
          "[parameters] '{}' was not declared with declare_all()", prefix + p.name);
  return begin;
}

}  // namespace

Tensor ParameterSet::child_values(const ParameterSet& child, const std::string& prefix) {
  check(values_.defined(), "[parameters] child_values() needs allocate() first");
  return values_.view(child_offset(*this, child, prefix), {child.count()});
}

Tensor ParameterSet::child_grads(const ParameterSet& child, const std::string& prefix) {
  check(grads_.defined(), "[parameters] child_grads() needs allocate() first");
  return grads_.view(child_offset(*this, child, prefix), {child.count()});
}

void ParameterSet::move_to(Tensor values, Tensor grads) {
  check(values.numel() == size_ && grads.numel() == size_,
        "[parameters] move_to needs {} elements, got {} and {}", size_, values.numel(),
        grads.numel());
  std::copy(values_.f32(), values_.f32() + size_, values.f32());
  std::copy(grads_.f32(), grads_.f32() + size_, grads.f32());
  values_ = values;
  grads_ = grads;
  for (auto& p : params_) {
    p.value = values_.view(p.offset, p.shape);
    p.grad = grads_.view(p.offset, p.shape);
  }
}

bool ParameterSet::contains(std::string_view name) const {
  return index_.find(name) != index_.end();
}

Parameter& ParameterSet::at(std::string_view name) {
  const auto it = index_.find(name);
  if (it == index_.end()) fail("[parameters] no parameter named '{}'", name);
  return params_[it->second];
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

void init_uniform_part(Tensor& part, float bound, std::mt19937_64& rng, std::int64_t first,
                       std::int64_t total) {
  check(first >= 0 && first + part.numel() <= total, "[init] draws [{}, {}) of {}", first,
        first + part.numel(), total);
  std::uniform_real_distribution<float> dist(-bound, bound);
  float* p = part.f32();
  for (std::int64_t i = 0; i < total; ++i) {
    const float v = dist(rng);
    if (i >= first && i < first + part.numel()) p[i - first] = v;
  }
}

void init_normal(Tensor& t, float std, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, std);
  float* p = t.f32();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
}

Tensor random_normal(Shape shape, std::uint64_t seed, float std) {
  Tensor t(std::move(shape));
  std::mt19937_64 rng(seed);
  init_normal(t, std, rng);
  return t;
}

}  // namespace ffnlab
