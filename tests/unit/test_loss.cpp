// Cross-entropy and MSE: fast against the double reference, gradients against central
// differences of the reference.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ffnlab/ops/ref/loss_ref.hpp"

using namespace ffnlab;

// With ignore = true every third target is kIgnoreTarget (the masked objective's unmasked
// positions): the mean is over the others, and the ignored rows get no gradient.
TEST(CrossEntropy, MatchesReferenceAndCentralDifferences) {
  for (bool ignore : {false, true})
    for (auto [rows, vocab] : {std::pair<std::int64_t, std::int64_t>{6, 11}, {1, 256}, {40, 3}}) {
      const std::int64_t T = rows, V = vocab;  // captured below (clang 14 cannot capture bindings)
      const Tensor logits = test::random_tensor({T, V}, 7 + T, 3.0f);
      std::vector<std::int32_t> targets(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t)
        targets[t] =
            ignore && t % 3 == 1 ? kIgnoreTarget : static_cast<std::int32_t>((t * 7 + 3) % V);
      Tensor probs, dlogits;
      const double loss = cross_entropy_forward(probs, logits, targets);
      cross_entropy_backward(dlogits, probs, targets, 0.5f);
      auto l64 = test::to_vector<double>(logits);
      auto ref_loss = [&] {
        return 0.5 * ref::cross_entropy<double>(l64.data(), targets.data(), T, V);
      };
      EXPECT_NEAR(loss * 0.5, ref_loss(), 1e-6 * std::max(1.0, ref_loss()));
      test::expect_gradient(l64, test::to_vector<double>(dlogits), ref_loss,
                            test::sample_indices(l64.size(), 60), 1e-6, 1e-4, "dlogits");
      if (ignore && T > 1) {
        EXPECT_EQ(counted_targets(targets), T - (T + 1) / 3);
        for (std::int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits.f32()[V + v], 0.f);  // row 1
      }
    }
}

TEST(CrossEntropy, EveryTargetIgnoredIsNoLoss) {
  Tensor probs, dlogits;
  const Tensor logits = test::random_tensor({3, 5}, 4);
  const std::vector<std::int32_t> none(3, kIgnoreTarget);
  EXPECT_EQ(cross_entropy_forward(probs, logits, none), 0.0);
  cross_entropy_backward(dlogits, probs, none, 1.f);
  for (std::int64_t i = 0; i < dlogits.numel(); ++i) EXPECT_EQ(dlogits.f32()[i], 0.f);
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  Tensor probs;
  const Tensor logits({2, 4});
  const std::vector<std::int32_t> bad{1, 4}, negative{1, -2};
  EXPECT_THROW(cross_entropy_forward(probs, logits, bad), Error);
  EXPECT_THROW(cross_entropy_forward(probs, logits, negative), Error);
  const std::vector<std::int32_t> short_targets{1};
  EXPECT_THROW(cross_entropy_forward(probs, logits, short_targets), Error);
  // No vocabulary: every target ignored still has no row to take a maximum of.
  const std::vector<std::int32_t> ignored{kIgnoreTarget, kIgnoreTarget};
  EXPECT_NE(test::error_of([&] {
              cross_entropy_forward(probs, Tensor({2, 0}), ignored);
            }).find("have no vocabulary"),
            std::string::npos);
}

TEST(Mse, MatchesReferenceAndCentralDifferences) {
  const Tensor y = test::random_tensor({3, 5}, 1), target = test::random_tensor({3, 5}, 2);
  Tensor dy;
  const double loss = mse_forward(y, target);
  mse_backward(dy, y, target, 1.f);
  auto y64 = test::to_vector<double>(y);
  const auto t64 = test::to_vector<double>(target);
  auto ref_loss = [&] { return ref::mse<double>(y64.data(), t64.data(), 15); };
  EXPECT_NEAR(loss, ref_loss(), 1e-6);
  test::expect_gradient(y64, test::to_vector<double>(dy), ref_loss, test::sample_indices(15, 15),
                        1e-6, 1e-4, "dy");
}
