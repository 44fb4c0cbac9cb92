// Running a command's work in one process, or as one rank of the MPI world that mpirun started.
#pragma once

#include <functional>
#include <string_view>

#include "ffnlab/parallel/group.hpp"

namespace ffnlab::cli {

// Calls work(nullptr) in one process, or work(world) on each rank when mpirun started more than
// one (ranks wait `dist_timeout` seconds for each other in one exchange). A rank that fails says
// why and ends every rank (they would wait for it) with its exit status. Throws Error when mpirun
// started several processes of a build without MPI: each would work alone.
void run_launched(double dist_timeout, const std::function<void(ProcessGroup*)>& work);
// For a command that runs in one process (params, run, toy, zoo, bench): UsageError when an
// MPI launcher says it started more than one process, each of which would run it (the same
// output N times, N timings sharing the cores).
void require_one_process(std::string_view command);

}  // namespace ffnlab::cli
