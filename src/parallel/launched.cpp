// Whether an MPI launcher started this process: what its environment says, whatever the build.
#include <cstdlib>

#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab {

namespace {

// What launchers set in each process they start, in one table: the variables that say a launcher
// started it (OpenMPI's mpirun, MPICH's PMI, PMIx launchers such as srun --mpi=pmix), and those
// that say how many processes it started (Slurm's for srun, which sets no PMI size).
struct LauncherVariable {
  const char* name;
  bool launched, size;
};
constexpr LauncherVariable kVariables[] = {
    {"OMPI_COMM_WORLD_SIZE", true, true},
    {"PMI_SIZE", true, true},
    {"PMIX_RANK", true, false},
    {"SLURM_NTASKS", false, true},
};

}  // namespace

bool mpi_launched() {
  for (const LauncherVariable& v : kVariables)
    if (v.launched && std::getenv(v.name) != nullptr) return true;
  return false;
}

int launched_world_size() {
  for (const LauncherVariable& v : kVariables)
    if (const char* value = v.size ? std::getenv(v.name) : nullptr) {
      const int n = std::atoi(value);
      if (n > 0) return n;
    }
  return 0;
}

}  // namespace ffnlab
