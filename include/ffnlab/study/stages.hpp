// The study's stages, in order: the one table that says what each stage computes, the training
// steps it plans (for the progress bar and its ETA), the figures it draws, its key in
// results.json and its section of REPORT.md. Section numbers and cross-references ("section 4")
// come from this table; no heading is written by hand.
//
// Adding a stage: write src/study/<stage>.cpp with its run, to_json and markdown functions (and
// figures, if any), its result struct in results.hpp, its test in tests/unit/test_study.cpp, and
// one row in the table (stages.cpp). CONTRIBUTING.md walks through it.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/study/study.hpp"

namespace ffnlab::study {

class Sections;

struct Figure {
  std::string_view name;  // NAME.png, with NAME.gp and its CSV beside it
  void (*draw)(const Study&);
  std::string_view caption;  // what it plots and how to read it, below it in its section
};

// A stage's markdown may put this line after its main text: what follows it is the section's
// detail (long tables, one-seed material, how it was measured), which the report moves to its
// appendix under the section's name, so that each section reads as its finding.
inline constexpr std::string_view kDetails = "\n<!-- details -->\n";

struct Stage {
  std::string_view key;      // results.json's key, and how cross-references name the stage
  std::string_view section;  // its REPORT.md section; empty: it continues the section before
  bool numbered;             // "## 4. Training dynamics" or "## Sweep ..."
  // Training steps it will take (0 for a stage that trains nothing).
  std::int64_t (*planned_steps)(const Study&);
  void (*run)(Study&);  // computes its result into study.results, writes its CSV
  // Its results.json entry; null when the stage did not run.
  nlohmann::ordered_json (*to_json)(const Results&);
  // Its section's body (the heading comes from the table); empty when the stage did not run.
  std::string (*markdown)(const Study&, const Sections&);
  std::vector<Figure> figures;
};

const std::vector<Stage>& stages();

// Section numbers by stage key, from the table: what the report's cross-references use.
class Sections {
 public:
  explicit Sections(const std::vector<Stage>& table);
  int number(std::string_view key) const;  // the section the stage is in (from 1)
  // The title of the section the stage is in ("Training dynamics" for "training").
  std::string_view title(std::string_view key) const;
  std::string ref(std::string_view key) const;  // "section 4"; Error for an unnumbered stage
  // "## 4. Training dynamics\n\n" (or "## Sweep...\n\n"); empty for a stage that continues.
  std::string heading(std::string_view key) const;

 private:
  const std::vector<Stage>& table_;
};

}  // namespace ffnlab::study
