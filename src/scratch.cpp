// scratch(): one grow-on-change tensor per slot and thread.
#include "ffnlab/scratch.hpp"

#include <array>

namespace ffnlab {

namespace {

std::array<Tensor, static_cast<std::size_t>(Scratch::count)>& slots() {
  thread_local std::array<Tensor, static_cast<std::size_t>(Scratch::count)> mine;
  return mine;
}

}  // namespace

Tensor& scratch(Scratch slot) {
  return slots()[static_cast<std::size_t>(slot)];
}

void release_scratch() {
  for (Tensor& t : slots()) t = Tensor();
}

Tensor& scratch(Scratch slot, const Shape& shape) {
  Tensor& t = scratch(slot);
  t.ensure(shape);
  return t;
}

}  // namespace ffnlab
