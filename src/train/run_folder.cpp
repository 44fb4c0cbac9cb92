// A training run's folder: its logs, its summary, and resuming from its checkpoint.
#include "ffnlab/train/run_folder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "check.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/json_text.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The largest log a resume reads back (a row is about a hundred bytes).
constexpr std::uint64_t kMaxLogBytes = std::uint64_t{1} << 36;

// A log cut back to step `from`: the header, then its rows up to that step (also handed to
// `rows`, when given). A log that is there but cannot be read fails, naming why: its rows are
// never replaced by the header alone.
std::string log_up_to(const fs::path& path, const std::string& header, std::int64_t from,
                      std::vector<std::string>* rows = nullptr) {
  std::string kept = header;
  std::error_code ec;
  const std::vector<std::uint8_t> bytes =
      fs::exists(path, ec) || ec ? read_regular_file(path.string(), "train", kMaxLogBytes)
                                 : std::vector<std::uint8_t>{};
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  for (bool first = true;; first = false) {
    const std::size_t eol = text.find('\n');
    if (eol == std::string_view::npos) break;  // no line end: a row cut off by a run that died
    const std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol + 1);
    if (first) continue;  // the header
    std::int64_t step = 0;
    const auto [end, parsed] = std::from_chars(line.data(), line.data() + line.size(), step);
    if (parsed == std::errc() && end != line.data() && end < line.data() + line.size() &&
        *end == ',' && step <= from) {
      kept.append(line).append("\n");
      if (rows) rows->push_back(std::string(line));
    }
  }
  return kept;
}

// The log rewritten as `kept` (log_up_to's), open to append to.
std::ofstream continue_log(const fs::path& path, const std::string& kept) {
  write_file_atomic(path.string(), kept.data(), kept.size());
  errno = 0;  // what the open sets, if it fails, is the reason given (check_written)
  return std::ofstream(path, std::ios::app);
}

// An eval_log.csv row (eval_csv_header()), or nothing when it does not read as one.
std::optional<EvalLog> eval_row(const std::string& line) {
  EvalLog e;
  const char* p = line.data();
  const char* const end = line.data() + line.size();
  const auto field = [&](auto& value) {
    const auto [next, ec] = std::from_chars(p, end, value);
    if (ec != std::errc()) return false;
    p = next < end && *next == ',' ? next + 1 : next;
    return true;
  };
  if (field(e.step) && field(e.loss) && field(e.bits_per_byte) && field(e.tokens) && p == end)
    return e;
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& run_file_names() {
  static const std::vector<std::string> names{"checkpoint",    "summary.json", "sample.txt",
                                              "train_log.csv", "eval_log.csv", "layer_log.csv"};
  return names;
}

std::string run_folder_conflict(const std::string& dir, const std::string& data,
                                std::string_view out_name, std::string_view data_name) {
  if (path_within(dir, data))
    return fmt::format(
        "[train] {} '{}' is or lies inside the {} '{}': the run's files would become part of "
        "its data; choose another place",
        out_name, dir, data_name, data);
  for (const std::string& name : run_file_names())
    if (path_within(data, (fs::path(dir) / name).string()))
      return fmt::format(
          "[train] {} '{}' is or lies inside '{}', which a run in {} '{}' writes or removes; "
          "choose another place",
          data_name, data, (fs::path(dir) / name).string(), out_name, dir);
  return "";
}

void open_run_folder(const std::string& dir, bool continued) {
  ensure_writable_dir(dir, "train");
  remove_stale_temporaries(dir, [](std::string_view name) {  // (the checkpoint's: its own)
    const auto& names = run_file_names();
    return name != "checkpoint" && std::find(names.begin(), names.end(), name) != names.end();
  });
  if (continued) return;
  std::error_code ec;
  for (const char* name : {"summary.json", "sample.txt"}) {
    fs::remove(fs::path(dir) / name, ec);
    if (ec)
      fail_errno(ec.value(), "[train] cannot remove the earlier run's '{}' ({})",
                 (fs::path(dir) / name).string(), ec.message());
  }
  fs::remove_all(fs::path(dir) / "checkpoint", ec);
  if (ec)
    fail_errno(ec.value(), "[train] cannot remove the earlier run's checkpoint in '{}' ({})", dir,
               ec.message());
}

namespace {
// A log stream that failed (to open, or to write a row: a full disk) is an error naming the file
// and the system's reason: errno, cleared before the write (write_now below) and read at once,
// before any other call can change it.
void check_written(const std::ofstream& log, const fs::path& path) {
  if (log.good()) return;
  const int error = errno;
  throw SystemError(fmt::format("[train] writing '{}' failed ({})", path.string(),
                                error != 0 ? std::strerror(error) : "the stream failed"),
                    error);
}

// Writes `text` to `log` now (flushed), then checks it.
void write_now(std::ofstream& log, const std::string& text, const fs::path& path) {
  errno = 0;
  log << text << std::flush;
  check_written(log, path);
}

// A new log: its header only (a run that dies at once leaves its headers).
std::ofstream new_log(const fs::path& path, const std::string& header) {
  errno = 0;
  std::ofstream log(path, std::ios::trunc);
  check_written(log, path);
  write_now(log, header, path);
  return log;
}
}  // namespace

TrainLogs::TrainLogs(const std::string& dir, bool continued, std::int64_t from_step, bool layers)
    : dir_(dir) {
  const fs::path steps = fs::path(dir) / "train_log.csv", evals = fs::path(dir) / "eval_log.csv",
                 per_layer = fs::path(dir) / "layer_log.csv";
  if (continued) {
    // Every log is read before any is rewritten: one that cannot be read leaves them all as
    // they were. A layer log the run does not write on is kept up to the checkpoint.
    std::error_code ec;
    const bool layer_log = layers || fs::exists(per_layer, ec) || ec;
    std::vector<std::string> rows;
    const std::string kept_steps = log_up_to(steps, step_csv_header(), from_step);
    const std::string kept_evals = log_up_to(evals, eval_csv_header(), from_step, &rows);
    const std::string kept_layers =
        layer_log ? log_up_to(per_layer, layer_csv_header(), from_step) : "";
    steps_ = continue_log(steps, kept_steps);
    check_written(steps_, steps);
    evals_ = continue_log(evals, kept_evals);
    check_written(evals_, evals);
    for (const std::string& row : rows)
      if (const auto e = eval_row(row)) earlier_.push_back(*e);
    if (layers) {
      layers_ = continue_log(per_layer, kept_layers);
      check_written(layers_, per_layer);
    } else if (layer_log) {
      continue_log(per_layer, kept_layers);
    }
  } else {
    steps_ = new_log(steps, step_csv_header());
    evals_ = new_log(evals, eval_csv_header());
    if (layers) {
      layers_ = new_log(per_layer, layer_csv_header());
    } else {
      std::error_code ec;  // an earlier run's, which this run does not continue
      fs::remove(per_layer, ec);
    }
  }
}

void TrainLogs::add(const StepLog& s) {
  write_now(steps_, step_csv_row(s), fs::path(dir_) / "train_log.csv");
  if (layers_.is_open()) write_now(layers_, layer_csv_rows(s), fs::path(dir_) / "layer_log.csv");
}

void TrainLogs::add(const EvalLog& e) {
  write_now(evals_, eval_csv_row(e), fs::path(dir_) / "eval_log.csv");
}

double late_experts_per_token(const std::vector<StepLog>& steps) {
  const std::size_t n = steps.size(), late = (n + 3) / 4;  // the last quarter, at least one
  double sum = 0;
  for (std::size_t i = n - late; i < n; ++i) sum += steps[i].experts_per_token;
  return late > 0 ? sum / static_cast<double>(late) : 0.0;
}

json routing_summary(const std::vector<StepLog>& steps, const std::vector<FFNStats>& layers) {
  json per_layer = json::array();
  for (const FFNStats& s : layers)
    if (s.num_experts > 0)
      per_layer.push_back(
          {{"experts_per_token", s.experts_per_token}, {"tokens_by_experts", s.tokens_by_experts}});
  if (per_layer.empty()) return nullptr;
  json out = {{"experts_per_token", late_experts_per_token(steps)},
              {"layers", std::move(per_layer)}};
  if (!steps.empty() && steps.back().l1_coef > 0) out["l1_coef"] = steps.back().l1_coef;
  return out;
}

json summary_json(const RunSummary& r, const Corpus& corpus) {
  json evaluations = json::array();
  for (const EvalLog& e : r.evaluations) evaluations.push_back(json(to_json(e)));
  json summary = {{"model", lm_config_to_json(r.model)},
                  {"train", train_config_to_json(r.train)},
                  {"parameters", r.params},
                  {"data",
                   {{"source", corpus.source},
                    {"fingerprint", corpus.fingerprint},
                    {"files", corpus.files.size()},
                    {"bytes", corpus.bytes.size()},
                    {"train_bytes", corpus.train().size()},
                    {"validation_bytes", corpus.validation().size()}}},
                  {"steps", r.steps},
                  {"median_tokens_per_second", r.median_tokens_per_second},
                  {"evaluations", evaluations},
                  {"sample", r.sample}};
  if (r.bare_products_gflops > 0) {
    // null where it cannot be true (flop_utilisation): a step above its own products' rate.
    const double u = flop_utilisation(r.matrix_gflops, r.bare_products_gflops);
    summary["utilisation"] = {{"matrix_gflops_per_second", r.matrix_gflops},
                              {"bare_products_gflops_per_second", r.bare_products_gflops},
                              {"model_flop_utilisation", std::isnan(u) ? json() : json(u)}};
  }
  if (!r.routing.is_null()) summary["routing"] = r.routing;
  return summary;
}

void write_summary(const std::string& dir, const json& summary) {
  // The sample is raw bytes; JSON needs UTF-8, so invalid sequences become U+FFFD there.
  const std::string s = json_text(summary, 2) + "\n";
  write_file_atomic((fs::path(dir) / "summary.json").string(), s.data(), s.size());
}

json read_summary(const std::string& dir) {
  try {
    const auto bytes = read_regular_file((fs::path(dir) / "summary.json").string(), "train",
                                         std::uint64_t{1} << 26);
    const json summary = json::parse(bytes.begin(), bytes.end(), nullptr, false);
    return summary.is_object() ? summary : json();
  } catch (const Error&) {
    return json();
  }
}

bool run_finished(const std::string& dir, std::int64_t step, std::int64_t steps) {
  if (step != steps) return false;
  // The summary of a run of these steps: a run extended in place (--steps) and stopped between
  // its last checkpoint and its new summary still holds the shorter run's. (A summary that
  // cannot be read reads as missing: the run writes it again.)
  const json summary = read_summary(dir);
  return summary.is_object() && summary.value("steps", json()) == json(steps);
}

ResumePoint read_resume_point(const std::string& run_dir) {
  ResumePoint p;
  p.checkpoint_dir = (fs::path(run_dir) / "checkpoint").string();
  p.info = read_checkpoint_info(p.checkpoint_dir);
  try {
    p.model = lm_config_from_json(p.info["model"]);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(),
                            (fs::path(p.checkpoint_dir) / "checkpoint.json").string()));
  }
  return p;
}

TrainConfig resumed_settings(const ResumePoint& point, const TrainConfig& given,
                             std::span<const std::string> keys,
                             std::vector<SettingChange>& changes) {
  // f(), its error naming the checkpoint's file.
  const auto in_file = [&](auto f) {
    try {
      return f();
    } catch (const Error& e) {
      throw Error(fmt::format("{} (in {}; a setting given with the resume replaces the file's)",
                              e.what(),
                              (fs::path(point.checkpoint_dir) / "checkpoint.json").string()));
    }
  };
  const json asked = train_config_to_json(given);
  json merged = point.info["train"];
  // The checkpoint's settings as they are written now, so that a setting given as it was compares
  // equal: an older checkpoint holds a float as its double (0.003000000026077032 for 0.003).
  // (Unvalidated: a given setting may replace one outside today's range; the merge is checked.)
  const json saved = in_file([&] { return train_settings_as_written(merged); });
  // (A key the file lacks, from before the key existed, holds its default there: the run trained
  // with it, and another value given is a change like any other.)
  for (const std::string& key : keys) {
    if (!saved.contains(key) || !asked.contains(key) || saved[key] == asked[key]) continue;
    if (key != "steps") changes.push_back({key, saved[key], asked[key]});
    merged[key] = asked[key];
  }
  return in_file([&] { return train_config_from_json(merged); });
}

std::string checkpoint_data_path(const ResumePoint& point, const std::string& fallback) {
  const json& d = point.info.value("data", json::object());
  return d.value("path", d.value("source", fallback));
}

double checkpoint_val_fraction(const ResumePoint& point, double fallback) {
  return point.info.value("data", json::object()).value("val_fraction", fallback);
}

DataMismatch data_mismatch(const ResumePoint& point, const Corpus& corpus) {
  const json& d = point.info.value("data", json::object());
  const std::string fingerprint = d.value("fingerprint", "");
  const auto train_bytes = d.value("train_bytes", std::int64_t{-1});
  if (!fingerprint.empty() && fingerprint != corpus.fingerprint)
    return {fmt::format("'{}' ({}) is not the data the checkpoint was trained on ('{}', {})",
                        corpus.source, corpus.fingerprint, d.value("source", "?"), fingerprint),
            false};
  if (train_bytes >= 0 && train_bytes != static_cast<std::int64_t>(corpus.train().size()))
    return {fmt::format("the training part is {} bytes, the checkpoint's was {}",
                        corpus.train().size(), train_bytes),
            true};
  return {};
}

}  // namespace ffnlab
