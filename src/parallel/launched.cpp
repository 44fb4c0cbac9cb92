// Whether an MPI launcher started this process: what its environment says, whatever the build.
#include <cstdlib>

#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab {

bool mpi_launched() {
  // OpenMPI's mpirun, then the PMI/PMIx variables of MPICH's launchers and Slurm's srun.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace ffnlab
