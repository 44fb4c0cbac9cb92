// ffnlab: the command-line lab for Transformer FFN layers. Every error is one line on stderr,
// "ffnlab: error: ...", and the exit status says what kind it was (docs/hardening.md, "Exit
// status"): 1 bad input, 2 usage, 3 system failure (I/O, memory), 130 interrupted.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/error.hpp"

int main(int argc, char** argv) {
  using namespace ffnlab::cli;
  CLI::App app{
      "ffnlab: fast, correct feed-forward (dense and MoE) layers of Transformers, measured.\n"
      "Run 'ffnlab COMMAND --help' for a command's options.\n"
      "Exit status: 0 done, 1 bad input (a file, config or value), 2 usage (a flag), 3 system "
      "failure (a read or write, memory), 130 interrupted."};
  app.require_subcommand(1);
  add_params_command(app);
  add_run_command(app);
  add_train_command(app);
  add_toy_command(app);
  add_evolve_command(app);
  add_zoo_command(app);
  add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (...) {
    return report_error(std::current_exception());
  }
  // What a command printed must have reached stdout: a full disk or a closed pipe behind it is
  // a failure (exit 3), not a success with the output lost.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int error = errno;  // 0: an earlier write failed, and its error number is gone
    return report_error(std::make_exception_ptr(ffnlab::SystemError(
        std::string("[io] cannot write to standard output") +
        (error ? std::string(": ") + std::strerror(error) : std::string(" (a write failed)")))));
  }
  return 0;
}
