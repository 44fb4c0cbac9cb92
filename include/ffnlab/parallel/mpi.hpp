// The MPI implementation of ProcessGroup (ffnlab/parallel/group.hpp): MPI_COMM_WORLD of a program
// started by mpirun. Built with FFNLAB_MPI (Debian's OpenMPI); without it, mpi_available() is
// false and mpi_world() throws, so a program can say why it cannot run distributed.
//
// Failure behaviour: MPI calls return their errors (MPI_ERRORS_RETURN), which become
// SystemError; every collective is started non-blocking and waited for with a deadline, so a
// rank that stops answering makes the others fail with "[dist] ... no answer" after
// `timeout_seconds` instead of hanging. After an error, abort() ends every rank. A caller that
// goes on instead gets SystemError at once from every later exchange of the world and of the
// groups split from it (MPI may still be running the failed one, which cannot be cancelled: a
// next exchange would pair with it), and the world is then not finalised when destroyed.
#pragma once

#include <memory>

#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

// Whether this ffnlab was built with MPI.
bool mpi_available();
// Whether this process was started by an MPI launcher (mpirun, srun): its environment says so.
bool mpi_launched();
// The number of processes the launcher started, as its environment says (OpenMPI's
// OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, Slurm's SLURM_NTASKS); 0 when it does not say.
int launched_world_size();

class MpiWorld : public ProcessGroup {
 public:
  // Abandons every rank of the job with `code` (MPI_Abort). For use after an error on one rank,
  // so that the others do not wait for it.
  virtual void abort(int code) noexcept = 0;
  // The ranks on this rank's machine (node), this one included: they share its memory.
  virtual int ranks_on_this_node() = 0;
};

// Initialises MPI (once per process) and returns the world. MPI is finalised when the returned
// object is destroyed. Throws SystemError when MPI cannot start, Error when built without MPI.
std::unique_ptr<MpiWorld> mpi_world(double timeout_seconds);

}  // namespace ffnlab
