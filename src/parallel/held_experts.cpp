// Which experts a rank holds under expert parallelism.
#include "check.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

HeldExperts held_by_rank(int experts, int ranks, int rank) {
  check(ranks > 0 && experts % ranks == 0,
        "[dist] {} experts cannot be split evenly over {} ranks (expert parallelism)", experts,
        ranks);
  const int count = experts / ranks;
  return {rank * count, count};
}

}  // namespace ffnlab
