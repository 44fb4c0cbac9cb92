// A rank that joins an MPI job and then fails it, for the failure tests of data-parallel
// training (tests/parallel/test_distributed.cpp): `stray_rank silent` initialises MPI and never
// takes part in a collective (a hung rank); `stray_rank die` initialises MPI and exits with
// status 1 without finalising (a crashed rank).
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <thread>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc > 1 && std::strcmp(argv[1], "die") == 0) return 1;
  std::this_thread::sleep_for(std::chrono::seconds(120));
  MPI_Finalize();
  return 0;
}
