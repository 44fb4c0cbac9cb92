// scratch(): one grow-on-change tensor per slot and thread.
#include "ffnlab/scratch.hpp"

#include <array>

namespace ffnlab {

Tensor& scratch(Scratch slot, const Shape& shape) {
  thread_local std::array<Tensor, static_cast<std::size_t>(Scratch::count)> slots;
  Tensor& t = slots[static_cast<std::size_t>(slot)];
  t.ensure(shape);
  return t;
}

}  // namespace ffnlab
