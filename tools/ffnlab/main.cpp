// ffnlab: the command-line lab for Transformer FFN layers. Errors become one line on stderr and
// exit status 1; usage errors exit 2 (CLI11's convention is 1xx, mapped below).
#include <cstdio>

#include "commands.hpp"
#include "ffnlab/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "ffnlab: fast, correct feed-forward (dense and MoE) layers of Transformers, measured.\n"
      "Run 'ffnlab COMMAND --help' for a command's options."};
  app.require_subcommand(1);
  ffnlab::cli::add_params_command(app);
  ffnlab::cli::add_run_command(app);
  ffnlab::cli::add_train_command(app);
  ffnlab::cli::add_toy_command(app);
  ffnlab::cli::add_evolve_command(app);
  ffnlab::cli::add_zoo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const ffnlab::Error& e) {
    std::fprintf(stderr, "ffnlab: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ffnlab: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
