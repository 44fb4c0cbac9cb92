// ffnlab: the command-line lab for Transformer FFN layers. Every error is one line on stderr,
// "ffnlab: error: ...", and the exit status says what kind it was (docs/hardening.md, "Exit
// status"): 1 bad input, 2 usage, 3 system failure (I/O, memory), 130 interrupted.
#include "commands.hpp"
#include "common.hpp"

namespace {

// CLI11's help, with a two-sense switch named "--x,--no-x" rather than "--x,--no-x{false}" (the
// value its negated name stores is no part of what a user types).
class Help : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, is_positional);
    for (std::size_t at; (at = name.find("{false}")) != std::string::npos;) name.erase(at, 7);
    return name;
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace ffnlab::cli;
  CLI::App app{
      "ffnlab: fast, correct feed-forward (dense and MoE) layers of Transformers, measured.\n"
      "Run 'ffnlab COMMAND --help' for a command's options.\n"
      "Exit status: 0 done, 1 bad input (a file, config or value), 2 usage (a flag), 3 system "
      "failure (a read or write, memory), 130 interrupted.",
      "ffnlab"};
  app.require_subcommand(1);
  app.formatter(std::make_shared<Help>());  // (before the commands, which take it)
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
