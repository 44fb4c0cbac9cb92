// ffnlab: the command-line lab for Transformer FFN layers. Every error is one line on stderr,
// "ffnlab: error: ...", and the exit status says what kind it was (docs/hardening.md, "Exit
// status"): 1 bad input, 2 usage, 3 system failure (I/O, memory), 130 interrupted.
#include "commands.hpp"
#include "common.hpp"

int main(int argc, char** argv) {
  using namespace ffnlab::cli;
  CLI::App app{
      "ffnlab: fast, correct feed-forward (dense and MoE) layers of Transformers, measured.\n"
      "Run 'ffnlab COMMAND --help' for a command's options.\n"
      "Exit status: 0 done, 1 bad input (a file, config or value), 2 usage (a flag), 3 system "
      "failure (a read or write, memory), 130 interrupted.",
      "ffnlab"};
  app.require_subcommand(1);
  add_params_command(app);
  add_run_command(app);
  add_train_command(app);
  add_toy_command(app);
  add_evolve_command(app);
  add_zoo_command(app);
  add_bench_command(app);
  // Parses, runs the command, and maps every exception to one line and an exit status.
  return run_program("ffnlab", app, argc, argv);
}
