// An exchange after a failed one, for tests/parallel/test_distributed.cpp: rank 0 of 2 waits
// for an exchange that rank 1 never joins; after the timeout, its next exchange and one in a
// group split before must fail at once, saying an earlier one failed (MPI may still be running
// the first: a next exchange would pair with it). Rank 1 sleeps until the job is ended. Any
// arguments are ignored.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "ffnlab/parallel/mpi.hpp"

int main() {
  const auto world = ffnlab::mpi_world(1.0);
  const auto group = world->split(0, "split");
  if (world->rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  std::vector<std::int64_t> v{1};
  const auto attempt = [&](ffnlab::ProcessGroup& g, const char* label, const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g.allreduce_sum(v, what);
      std::printf("%s: done\n", label);
    } catch (const std::exception& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s (%s): %s\n", label, s < 0.5 ? "at once" : "after waiting", e.what());
    }
    std::fflush(stdout);
  };
  attempt(*world, "first", "first");
  attempt(*world, "second", "second");
  attempt(*group, "group", "group");
  return 0;  // (the world is not finalised after a failed exchange: mpirun ends the job)
}
