// ffnlab zoo: the FFN configurations of real models, with sources, costed by ffnlab.
#include <fmt/format.h>

#include "commands.hpp"
#include "ffnlab/analysis/zoo.hpp"
#include "ffnlab/study/zoo_table.hpp"
#include "launch.hpp"

namespace ffnlab::cli {

namespace {

void run_zoo(bool json) {
  if (json) {
    fmt::print("{}\n", study::zoo_table_json().dump(2));
    return;
  }
  const auto header = study::zoo_table_header();
  const auto rows = study::zoo_table_rows();
  // Columns but the source, aligned; the sources numbered below.
  std::vector<std::size_t> width(header.size() - 1, 0);
  for (std::size_t c = 0; c + 1 < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells, const std::string& tail) {
    std::string s;
    for (std::size_t c = 0; c + 1 < cells.size(); ++c)
      s += c < 2 ? fmt::format("{:<{}}  ", cells[c], width[c])
                 : fmt::format("{:>{}}  ", cells[c], width[c]);
    fmt::print("{}{}\n", s, tail);
  };
  fmt::print(
      "The FFN of real models, costed by ffnlab (one layer; FLOPs per token forward, "
      "matrix and elementwise; parameters include biases where the model has them).\n\n");
  line(header, "source");
  for (std::size_t i = 0; i < rows.size(); ++i) line(rows[i], fmt::format("[{}]", i + 1));
  fmt::print("\n");
  for (std::size_t i = 0; i < rows.size(); ++i)
    fmt::print("[{}] {}: {}\n", i + 1, rows[i][0], rows[i].back());
}

// The table's models for the help: "BERT-base, BERT-large, ...".
std::string model_names() {
  std::string out;
  for (const ZooModel& m : zoo_models()) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

}  // namespace

void add_zoo_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "zoo",
      fmt::format("The FFN configurations of real models ({}) with the source of every number, "
                  "and their parameters and FLOPs as ffnlab computes them.",
                  model_names()));
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([json] {
    require_one_process("zoo");
    run_zoo(*json);
  });
}

}  // namespace ffnlab::cli
