// A program outside the project that uses the installed library through find_package(ffnlab).
#include <cstdio>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/layers/feed_forward.hpp"
int main() {
  auto ffn = ffnlab::make_ffn(ffnlab::variant_config("swiglu", 16, 32, false));
  ffnlab::Tensor x({3, 16}), y;
  ffn->forward(y, x, false);
  std::printf("%lld %lld\n", (long long)ffn->parameters().count(), (long long)y.dim(0));
}
