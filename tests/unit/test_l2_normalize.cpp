// Row-wise L2 normalisation (Soft MoE's): fast forward against the double reference; fast
// backward (dv and the scale's gradient) against central differences of the reference.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/l2_normalize.hpp"
#include "ffnlab/ops/ref/l2_normalize_ref.hpp"

using namespace ffnlab;

TEST(L2Normalize, MatchesReferenceAndCentralDifferences) {
  std::uint64_t seed = 1;
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{5, 24}, {3, 7}, {1, 130}})
    for (float scale : {1.0f, 2.5f}) {
      const std::int64_t R = rows, D = cols;  // (clang 14: no capture of structured bindings)
      const Tensor v = test::random_tensor({R, D}, seed++, 1.5f);
      const Tensor dy = test::random_tensor({R, D}, seed++);
      Tensor y, dv({R, D});
      std::vector<float> inv;
      l2_normalize_forward(y, inv, v, scale);
      float dscale = 0.f;
      l2_normalize_backward(dv, &dscale, dy, v, inv, scale);

      auto v64 = test::to_vector<double>(v), g64 = test::to_vector<double>(dy);
      std::vector<double> s64{scale}, ry(static_cast<std::size_t>(R * D));
      auto loss = [&] {  // L = Σ y ⊙ dy
        ref::l2_normalize_forward<double>(ry.data(), v64.data(), R, D, s64[0], kL2NormalizeEps);
        double l = 0;
        for (std::size_t i = 0; i < ry.size(); ++i) l += ry[i] * g64[i];
        return l;
      };
      loss();
      const std::string what = std::to_string(R) + "x" + std::to_string(D);
      EXPECT_LT(test::scaled_error(y.f32(), ry.data(), y.numel()), 2e-6) << what;
      test::expect_gradient(v64, test::to_vector<double>(dv), loss,
                            test::sample_indices(v64.size(), 40), 2e-5, 1e-4,
                            (what + " dv").c_str());
      test::expect_gradient(s64, {static_cast<double>(dscale)}, loss, {0}, 2e-5, 1e-4,
                            (what + " dscale").c_str());
    }
}

TEST(L2Normalize, BackwardAccumulatesAndChecksShapes) {
  const Tensor v = test::random_tensor({4, 8}, 3), dy = test::random_tensor({4, 8}, 4);
  Tensor y, dv1({4, 8}), dv2({4, 8});
  std::vector<float> inv;
  l2_normalize_forward(y, inv, v, 1.0f);
  l2_normalize_backward(dv1, nullptr, dy, v, inv, 1.0f);
  dv2.fill(1.f);
  float dscale = 2.f;
  l2_normalize_backward(dv2, &dscale, dy, v, inv, 1.0f);
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(dv2.f32()[i], dv1.f32()[i] + 1.f);
  EXPECT_NE(dscale, 2.f);
  Tensor wrong({3, 8});
  EXPECT_THROW(l2_normalize_backward(wrong, nullptr, dy, v, inv, 1.0f), Error);
  EXPECT_THROW(l2_normalize_forward(y, inv, Tensor({8}), 1.0f), Error);
}
