// Scalar reference of the dense FFN family (plain, GLU, multi-branch), in any floating type,
// built only from the scalar op references. The fast DenseFFN is tested against it, and it is
// itself checked by central differences in double precision (tests/unit/test_dense_ffn.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/ops/ref/glu_ref.hpp"
#include "ffnlab/ops/ref/linear_ref.hpp"

namespace ffnlab::ref {

template <typename T>
struct DenseFFN {
  FFNConfig config;
  std::vector<T> w_in, b_in;    // [P, D], [P] with P = F, 2F or 2nF ([g_0; u_0; g_1; ...])
  std::vector<T> w_out, b_out;  // [D, F], [D]
  // saved by forward
  std::vector<T> a, h;  // [T, P], [T, F]

  int branches() const { return config.gated_branches(); }
  std::int64_t in_width() const {
    return branches() == 0 ? config.d_ff : 2 * branches() * config.d_ff;
  }

  void forward(std::vector<T>& y, const std::vector<T>& x, std::int64_t tokens) {
    const std::int64_t D = config.d_model, F = config.d_ff, P = in_width();
    a.assign(tokens * P, T(0));
    h.assign(tokens * F, T(0));
    y.assign(tokens * D, T(0));
    linear_forward<T>(a.data(), x.data(), w_in.data(), config.bias ? b_in.data() : nullptr, tokens,
                      D, P);
    if (branches() == 0)
      activation_forward<T>(h.data(), a.data(), tokens * F, config.act);
    else
      glu_forward<T>(h.data(), a.data(), tokens, F, branches(), config.act);
    linear_forward<T>(y.data(), h.data(), w_out.data(), config.bias ? b_out.data() : nullptr,
                      tokens, F, D);
  }

  // dx overwritten; parameter gradients (sized like the parameters) accumulated.
  void backward(std::vector<T>& dx, std::vector<T>& dw_in, std::vector<T>& db_in,
                std::vector<T>& dw_out, std::vector<T>& db_out, const std::vector<T>& dy,
                const std::vector<T>& x, std::int64_t tokens) const {
    const std::int64_t D = config.d_model, F = config.d_ff, P = in_width();
    std::vector<T> dh(tokens * F), da(tokens * P);
    dx.assign(tokens * D, T(0));
    linear_backward<T>(dh.data(), dw_out.data(), config.bias ? db_out.data() : nullptr, dy.data(),
                       h.data(), w_out.data(), tokens, F, D);
    if (branches() == 0)
      activation_backward<T>(da.data(), dh.data(), a.data(), tokens * F, config.act);
    else
      glu_backward<T>(da.data(), dh.data(), a.data(), tokens, F, branches(), config.act);
    linear_backward<T>(dx.data(), dw_in.data(), config.bias ? db_in.data() : nullptr, da.data(),
                       x.data(), w_in.data(), tokens, D, P);
  }
};

}  // namespace ffnlab::ref
