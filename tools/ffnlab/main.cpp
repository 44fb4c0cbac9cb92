// ffnlab: the command-line lab for Transformer FFN layers. Every error is one line on stderr,
// "ffnlab: error: ...", and the exit status says what kind it was (docs/cli.md, "Exit status"):
// 1 bad input, 2 usage, 3 system failure (I/O, memory), 130 interrupted.
#include <cstdio>
#include <filesystem>
#include <new>
#include <string>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/error.hpp"
#include "interrupt.hpp"

namespace {

// One line: a message with a newline in it (a file name, a library's text) is cut there.
int report(const char* kind, const std::string& message, int status) {
  std::string line = message.substr(0, message.find('\n'));
  if (line.size() > 2000) line = line.substr(0, 2000) + "...";
  std::fprintf(stderr, "ffnlab: %s: %s\n", kind, line.c_str());
  return status;
}

}  // namespace

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
  } catch (const CLI::ParseError& e) {
    return report("usage error", e.what(), kExitUsage);
  } catch (const UsageError& e) {
    return report("usage error", e.what(), kExitUsage);
  } catch (const Interrupted& e) {
    return report("interrupted", e.what(), kExitInterrupted);
  } catch (const ffnlab::SystemError& e) {
    return report("error", e.what(), kExitSystem);
  } catch (const ffnlab::Error& e) {
    return report("error", e.what(), kExitInput);
  } catch (const std::bad_alloc&) {
    return report("error", "out of memory", kExitSystem);
  } catch (const std::filesystem::filesystem_error& e) {
    return report("error", e.what(), kExitSystem);
  } catch (const std::exception& e) {
    return report("error", e.what(), kExitSystem);
  }
  return 0;
}
