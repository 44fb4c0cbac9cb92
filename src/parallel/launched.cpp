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

int launched_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      if (n > 0) return n;
    }
  return 0;
}

}  // namespace ffnlab
