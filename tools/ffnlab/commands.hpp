// The subcommands of the ffnlab program; each registers itself on the CLI11 app.
// Shared pieces: common.hpp (threads, variant lists, formatting), ffn_flags.hpp (the FFN-layer
// flags), progress.hpp (progress display).
#pragma once

#include <CLI/CLI.hpp>

namespace ffnlab::cli {

void add_params_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_toy_command(CLI::App& app);
void add_evolve_command(CLI::App& app);
void add_zoo_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace ffnlab::cli
