// One process, or a rank of the MPI world.
#include "launch.hpp"

#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/parallel/mpi.hpp"
#include "interrupt.hpp"

namespace ffnlab::cli {

namespace {

// Started by mpirun: the MPI world (every rank a slice of each batch); else null.
std::unique_ptr<MpiWorld> join_world(double dist_timeout) {
  if (!mpi_launched()) return nullptr;
  const int size = launched_world_size();
  if (!mpi_available() && size != 1)
    throw Error(fmt::format(
        "[dist] started by an MPI launcher as one of {} processes, but this ffnlab was built "
        "without MPI: each would train alone; rebuild with -DFFNLAB_MPI=ON (the release preset "
        "does)",
        size > 0 ? std::to_string(size) : "several"));
  if (!mpi_available()) return nullptr;
  return mpi_world(dist_timeout);
}

}  // namespace

void run_launched(double dist_timeout, const std::function<void(ProcessGroup*)>& work) {
  const std::unique_ptr<MpiWorld> world = join_world(dist_timeout);
  if (!world || world->size() == 1) return work(nullptr);
  // When mpirun ends the job it stops reading the ranks' output and sends SIGTERM a second
  // later: the stop signal makes the output non-blocking (a line that cannot go out is
  // dropped: Progress), so that rank 0 reaches its checkpoint instead of blocking on a full
  // pipe, and a closed output ends no rank (docs/distributed.md, "Ctrl-C or SIGTERM").
  InterruptGuard::nonblocking_output_on_stop();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);
  try {
    // Every rank allocates its own model: the ranks on a machine share its memory, and each
    // checks what it needs against its share. (An exchange: a failure ends every rank, below.)
    share_memory_among(world->ranks_on_this_node());
    work(world.get());
  } catch (...) {
    // One rank failed: say why, then end every rank (they would wait for this one). Interrupted
    // too: mpirun, which forwarded the signal, is ending the job and does not let MPI finalise
    // (a finalising rank's message would be lost); the checkpoint is written by then.
    const int status = report_error(std::current_exception());
    world->abort(status);
  }
}

void require_one_process(std::string_view command) {
  // Refused only when the launcher says it started several (one whose count is unknown may
  // have started this one alone).
  const int size = launched_world_size();
  if (!mpi_launched() || size <= 1) return;
  throw UsageError(fmt::format(
      "[dist] ffnlab {} runs in one process, but an MPI launcher started it as one of {} "
      "processes, each of which would run it: drop mpirun (train and evolve run over ranks)",
      command, size));
}

}  // namespace ffnlab::cli
