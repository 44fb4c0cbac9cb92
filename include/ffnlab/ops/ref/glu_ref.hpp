// Scalar reference for the gated product (see ops/glu.hpp), in any floating type.
#pragma once

#include <cstdint>

#include "ffnlab/ops/ref/activation_ref.hpp"

namespace ffnlab::ref {

template <typename T>
void glu_forward(T* h, const T* a, std::int64_t tokens, std::int64_t F, int branches, Act act) {
  const std::int64_t P = 2 * F * branches;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t f = 0; f < F; ++f) {
      T acc = T(0);
      for (int b = 0; b < branches; ++b) {
        const T g = a[t * P + 2 * b * F + f], u = a[t * P + 2 * b * F + F + f];
        acc += activation<T>(act.kind, g, T(act.beta)) * u;
      }
      h[t * F + f] = acc;
    }
}

template <typename T>
void glu_backward(T* da, const T* dh, const T* a, std::int64_t tokens, std::int64_t F, int branches,
                  Act act) {
  const std::int64_t P = 2 * F * branches;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int b = 0; b < branches; ++b)
      for (std::int64_t f = 0; f < F; ++f) {
        const std::int64_t gi = t * P + 2 * b * F + f, ui = gi + F;
        const T d = dh[t * F + f];
        da[gi] = d * a[ui] * activation_grad<T>(act.kind, a[gi], T(act.beta));
        da[ui] = d * activation<T>(act.kind, a[gi], T(act.beta));
      }
}

}  // namespace ffnlab::ref
