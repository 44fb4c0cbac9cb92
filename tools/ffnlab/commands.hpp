// The subcommands of the ffnlab program; each registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace ffnlab::cli {

void add_params_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_toy_command(CLI::App& app);

// --threads N: sets OpenMP's thread count (0 keeps OMP_NUM_THREADS or the default).
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

// "relu,swiglu" -> {"relu", "swiglu"}; "all" -> every named variant (ffnlab::variant_names()).
std::vector<std::string> variant_list(const std::string& spec);

}  // namespace ffnlab::cli
