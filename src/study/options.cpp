// The study's options, one row each (option_rows), and how a message or the report names them
// in the words of the front end that ran the study: `ffnlab evolve`'s flags or ffnlab.evolve's
// arguments.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "ffnlab/error.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/study/study.hpp"

namespace ffnlab::study {

namespace {

std::vector<OptionRow> make_rows() {
  using V = OptionRow::Value;
  constexpr bool kScale = true;  // sets the study's scale: the report's first line names it
  return {
      {"--out", &Options::out, V::path, 0, 0,
       "report folder: a new or empty folder, or an earlier report (which is replaced when the "
       "new one is complete); never the data, the current directory or a mount point"},
      {"--quick", &Options::quick, V::on, 0, 0,
       "small models and few steps (same code path; under a minute): checks the pipeline, "
       "measures nothing about the variants",
       kScale},
      {"--full", &Options::full, V::on, 0, 0,
       "the whole study: every variant (the whole GLU family, unless --variants says "
       "otherwise), MoE with 8 experts and top-2 at equal compute beside the fine-grained "
       "design, the router z-loss ablation, and the routing families on the masked objective "
       "too, over --seeds",
       kScale},
      {"--data", &Options::data, V::path, 0, 0, "a text file or a folder of them"},
      {"--seeds", &Options::seeds, V::count, 1, 1000,
       "paired LM seeds every comparison with ReLU trains before its first look (default 3; "
       "--quick 2)",
       kScale},
      {"--max-seeds", &Options::max_seeds, V::count, 1, 1000,
       "the cap of the sequential rule: a comparison still undecided trains one more seed per "
       "round up to this many (default 6; --quick 3; at least --seeds)",
       kScale},
      {"--routing-seeds", &Options::routing_seeds, V::count, 1, 1000,
       "LM seeds of each routing family (and with --full of top-k on the masked objective); "
       "default 1, which gives values but no interval; --full: --seeds; at most --seeds",
       kScale},
      {"--steps", &Options::steps, V::count, 1, 1e9,
       "optimizer steps per LM run (default 600; --quick 40)", kScale},
      {"--sizes", &Options::sizes, V::names, 0, 0,
       "train every variant at these sizes of the ladder too, comma-separated: xs (d_model 64, "
       "2 layers), s (128, 4: the study's LM), m (256, 6), l (512, 8); tokens grow with the "
       "parameters. Adds the section \"Across model sizes and tasks\": verdicts per size, the "
       "scaling figure, and whether each variant's gap to ReLU grows with size",
       kScale},
      {"--tasks", &Options::tasks, V::names, 0, 0,
       "tasks of that section, comma-separated: causal (next byte, the default) and masked (a "
       "bidirectional LM; dense variants only)",
       kScale},
      {"--margin", &Options::margin, V::real, 0, 1,
       "equivalence margin in bits/byte, fixed before the run: a variant is called equivalent "
       "to ReLU only when its paired difference is shown to lie within it",
       kScale},
      {"--sweep", &Options::sweep, V::on, 0, 0,
       "also train ReLU and SwiGLU LMs at d_ff/d_model = 1, 2, 4, 8 (8 more runs)", kScale},
      {"--variants", &Options::variants, V::names, 0, 0,
       fmt::format("comma-separated FFN variants, or 'all' ({}), relu among them (it comes "
                   "first: every comparison is against it); default: one per step of the "
                   "evolution, {} (with --full: all)",
                   join_names(variant_names()), fmt::join(default_variants(), ","))},
      {"--runs", &Options::runs, V::path, 0, 0,
       "the folder that keeps every finished LM run, one file each, for --resume (default: "
       "OUT.runs, beside the report)"},
      {"--resume", &Options::resume, V::on, 0, 0,
       "take the runs the --runs folder kept instead of training them again: a study that was "
       "stopped trains only what it lacks, and one with more seeds or variants reuses the runs "
       "it shares (each run is kept under its whole configuration, the data's fingerprint and "
       "its seed)"},
      {"--force", &Options::force, V::on, 0, 0,
       "start over: discard the runs the --runs folder keeps (a folder that keeps runs is "
       "refused without --resume or --force)"},
      {"--budget", &Options::budget_seconds, V::duration, 0, 1e9,
       "a wall-time budget (90s, 30m, 2h): the planner times this machine and chooses the "
       "sizes (unless --sizes), the seeds (unless --max-seeds) and the steps (unless --steps) "
       "that end within it even if no comparison decides before the cap, and says what it "
       "chose and why (not with --resume: resume with what it chose)"},
  };
}

// A flag's value as a Python literal, by its row: a count or a real as written, a list flag's
// comma-separated names as a list, anything else (a path) as an escaped string.
std::string python_value(const OptionRow& row, const std::string& value) {
  auto quoted = [](std::string_view v) {  // a control byte as \xNN: still one valid literal
    std::string out = "'";
    for (const char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f)
        out += fmt::format("\\x{:02x}", u);
      else
        out.append(c == '\\' || c == '\'' ? "\\" : "").push_back(c);
    }
    return out + "'";
  };
  if (row.value == OptionRow::Value::count || row.value == OptionRow::Value::real) return value;
  if (row.value == OptionRow::Value::names) {
    std::vector<std::string> items;
    for (std::size_t start = 0; start <= value.size();) {
      const std::size_t comma = std::min(value.find(',', start), value.size());
      items.push_back(quoted(std::string_view(value).substr(start, comma - start)));
      start = comma + 1;
    }
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
  return quoted(value);
}

// A flag's value as a shell word: as it is when it holds only characters the shell takes as
// they are, else in single quotes (a path with a space, a quote or a $ pastes as it was).
std::string shell_word(const std::string& value) {
  const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           (c != '\0' && std::strchr("_./,:=+-@%", c) != nullptr);
  });
  if (plain) return value;
  std::string out = "'";
  for (const char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The options that set the study's scale (their rows say so), those not at their defaults, as
// the report's first line names them.
std::vector<std::pair<std::string, std::string>> scale_args(const Options& o) {
  const Options defaults;
  std::vector<std::pair<std::string, std::string>> args;
  for (const OptionRow& row : option_rows()) {
    if (!row.sets_scale) continue;
    std::visit(
        [&]<class T>(T Options::*field) {
          if (o.*field == defaults.*field) return;
          if constexpr (std::is_same_v<T, bool>)
            args.emplace_back(row.flag, "");
          else if constexpr (std::is_same_v<T, std::vector<std::string>>)
            args.emplace_back(row.flag, fmt::format("{}", fmt::join(o.*field, ",")));
          else
            args.emplace_back(row.flag, fmt::format("{}", o.*field));
        },
        row.field);
  }
  return args;
}

}  // namespace

const std::vector<OptionRow>& option_rows() {
  static const std::vector<OptionRow> rows = make_rows();
  return rows;
}

const OptionRow& option_row(std::string_view flag) {
  for (const OptionRow& row : option_rows())
    if (row.flag == flag) return row;
  throw std::logic_error(fmt::format("study::option_row: no option {}", flag));
}

std::string argument_name(std::string_view flag) {
  std::string name(flag.substr(flag.starts_with("--") ? 2 : 0));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string option_name(const Options& o, std::string_view flag) {
  const OptionRow& row = option_row(flag);
  if (o.front_end == FrontEnd::command_line) return row.flag;
  return argument_name(flag) + (row.value == OptionRow::Value::on ? "=True" : "=");
}

std::string call_text(FrontEnd front_end,
                      const std::vector<std::pair<std::string, std::string>>& args) {
  std::vector<std::string> parts;
  for (const auto& [flag, value] : args) {
    const OptionRow& row = option_row(flag);
    if (front_end == FrontEnd::command_line)
      parts.push_back(value.empty() ? flag : fmt::format("{} {}", flag, shell_word(value)));
    else
      parts.push_back(
          fmt::format("{}={}", argument_name(flag),
                      row.value == OptionRow::Value::on ? "True" : python_value(row, value)));
  }
  return front_end == FrontEnd::command_line
             ? fmt::format("ffnlab evolve{}{}", parts.empty() ? "" : " ", fmt::join(parts, " "))
             : fmt::format("ffnlab.evolve({})", fmt::join(parts, ", "));
}

std::string scale_call(const Options& o) {
  return call_text(o.front_end, scale_args(o));
}

std::string full_study_call(const Options& o) {
  std::vector<std::pair<std::string, std::string>> args = scale_args(o);
  if (!o.full) args.emplace(args.begin() + (o.quick ? 1 : 0), "--full", "");
  args.emplace_back("--resume", "");
  const Options defaults;
  if (o.out != defaults.out) args.emplace_back("--out", o.out);
  if (!o.runs.empty()) args.emplace_back("--runs", o.runs);
  if (o.data != defaults.data) args.emplace_back("--data", o.data);
  return call_text(FrontEnd::command_line, args);
}

std::string resume_call(const Options& o) {
  std::string call =
      fmt::format("the same {} with {}", o.front_end == FrontEnd::command_line ? "command" : "call",
                  option_name(o, "--resume"));
  // Each of --force and --budget refuses --resume beside it.
  if (o.force) call += fmt::format(" in place of {}", option_name(o, "--force"));
  if (o.budget_seconds > 0)
    call += fmt::format(
        " and, in place of {}, the sizes, seeds and steps it chose (its plan's "
        "first line)",
        option_name(o, "--budget"));
  return call;
}

double parse_duration(std::string_view text) {
  const std::string t(text);
  std::size_t used = 0;
  double value = NAN;
  try {
    value = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = used > 0 ? t.substr(used) : "";
  const double scale = unit.empty() || unit == "s"    ? 1
                       : unit == "m" || unit == "min" ? 60
                       : unit == "h"                  ? 3600
                                                      : 0;
  const double most = option_row("--budget").hi;
  if (used == 0 || scale == 0 || !(value > 0) || !std::isfinite(value) || value * scale > most)
    throw Error(fmt::format(
        "[evolve] budget '{}' is not a duration: a positive number with s, m or h (90s, 30m, "
        "1.5h), or seconds",
        t));
  return value * scale;
}

}  // namespace ffnlab::study
