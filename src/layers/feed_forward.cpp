// make_ffn: the one factory of FFN layers.
#include "ffnlab/layers/feed_forward.hpp"

#include "check.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/moe_ffn.hpp"

namespace ffnlab {

std::unique_ptr<FeedForward> make_ffn(const FFNConfig& config, std::uint64_t seed,
                                      HeldExperts held) {
  validate(config);
  switch (config.kind) {
    case FFNKind::plain:
    case FFNKind::glu:
    case FFNKind::multi_branch:
      return std::make_unique<DenseFFN>(config, seed);
    case FFNKind::moe:
      return std::make_unique<MoEFFN>(config, seed, held);
    case FFNKind::count:
      break;
  }
  fail("[ffn] invalid kind");
}

}  // namespace ffnlab
