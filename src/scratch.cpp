// scratch(): one grow-on-change tensor per slot and thread.
#include "ffnlab/scratch.hpp"

#include <array>

namespace ffnlab {

Tensor& scratch(Scratch slot) {
  thread_local std::array<Tensor, static_cast<std::size_t>(Scratch::count)> slots;
  return slots[static_cast<std::size_t>(slot)];
}

Tensor& scratch(Scratch slot, const Shape& shape) {
  Tensor& t = scratch(slot);
  t.ensure(shape);
  return t;
}

}  // namespace ffnlab
