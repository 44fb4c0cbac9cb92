// Built without FFNLAB_MPI: no distributed training, and a clear message for whoever asks.
#include "check.hpp"
#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab {

bool mpi_available() {
  return false;
}

std::unique_ptr<MpiWorld> mpi_world(double /*timeout_seconds*/) {
  fail(
      "[dist] this ffnlab was built without MPI; rebuild with -DFFNLAB_MPI=ON (the release "
      "preset does) after scripts/install-deps.sh");
}

}  // namespace ffnlab
