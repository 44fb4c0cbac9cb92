// A study run as data: its job and its record to and from JSON, and the key that names a
// finished run (see study.hpp). What the run store keeps and what ranks send each other.
#include <fmt/format.h>

#include <filesystem>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/study/study.hpp"
#include "ffnlab/train/step_log.hpp"
#include "hash.hpp"

namespace ffnlab::study {

nlohmann::json job_to_json(const Study& st, const RunJob& job) {
  TrainConfig train = job.settings ? *job.settings : st.scale.train;
  train.seed = job.seed;
  return {{"label", job.label},
          {"seed", job.seed},
          {"probe", enum_name(job.probe)},
          {"model", lm_config_to_json(job.model)},
          {"train", train_config_to_json(train)},
          {"validation_tokens", st.scale.validation_tokens}};
}

RunJob job_from_json(const nlohmann::json& j) {
  RunJob job;
  job.label = j.at("label");
  job.seed = j.at("seed");
  job.probe = parse_enum<Probe>(j.at("probe").get<std::string>());
  job.model = lm_config_from_json(j.at("model"));
  job.settings = train_config_from_json(j.at("train"));
  return job;
}

nlohmann::json job_as_written_now(const nlohmann::json& job) {
  try {
    nlohmann::json j = job;
    j["model"] = lm_config_to_json(lm_config_from_json(job.at("model")));
    j["train"] = train_config_to_json(train_config_from_json(job.at("train")));
    return j;
  } catch (const nlohmann::json::exception&) {
    return job;
  } catch (const Error&) {
    return job;
  }
}

std::string run_key(const nlohmann::json& job, const std::string& data_fingerprint) {
  const std::string text = job.dump() + "\n" + data_fingerprint;
  return fmt::format("{:016x}", fnv1a64(text.data(), text.size()));
}

nlohmann::json record_to_json(const RunRecord& r) {
  nlohmann::json steps = nlohmann::json::array(), evals = nlohmann::json::array();
  for (const StepLog& s : r.steps) steps.push_back(nlohmann::json(to_json(s)));
  for (const EvalLog& e : r.evals) evals.push_back(nlohmann::json(to_json(e)));
  return {{"variant", r.variant},
          {"seed", r.seed},
          {"d_ff", r.d_ff},
          {"params", r.params},
          {"steps", std::move(steps)},
          {"evals", std::move(evals)},
          {"val_bits_per_byte", r.val_bits_per_byte},
          {"median_tokens_per_second", r.median_tokens_per_second},
          {"matrix_gflops", r.matrix_gflops},
          {"bare_products_gflops", r.bare_products_gflops},
          {"gathered", r.gathered}};
}

RunRecord record_from_json(const nlohmann::json& j) {
  RunRecord r;
  r.variant = j.at("variant");
  r.seed = j.at("seed");
  r.d_ff = j.at("d_ff");
  r.params = j.at("params");
  for (const auto& s : j.at("steps")) r.steps.push_back(step_from_json(s));
  for (const auto& e : j.at("evals")) r.evals.push_back(eval_from_json(e));
  r.val_bits_per_byte = j.at("val_bits_per_byte");
  r.median_tokens_per_second = j.at("median_tokens_per_second");
  r.matrix_gflops = j.at("matrix_gflops");
  r.bare_products_gflops = j.at("bare_products_gflops");
  r.gathered = j.at("gathered");
  return r;
}

}  // namespace ffnlab::study

namespace ffnlab::study {

namespace {

namespace fs = std::filesystem;

// The file that marks a folder as a run store: only such a folder's records are ever removed.
constexpr const char* kStoreMarker = ".ffnlab-runs";
constexpr const char* kStoreMarkerText = "ffnlab evolve's finished runs, one file each\n";

bool is_record_file(const fs::path& p) {
  return p.extension() == ".cbor";
}

// The records in `dir`. Never throws: a count for a message or a check, which an unreadable
// folder makes 0.
std::int64_t count_records(const std::string& dir) {
  std::int64_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    n += is_record_file(it->path());
  return n;
}

}  // namespace

RunStore::RunStore(std::string dir, bool resume, std::string data_fingerprint)
    : dir_(std::move(dir)), fingerprint_(std::move(data_fingerprint)) {
  const bool exists = fs::exists(dir_);
  if (exists && !fs::is_directory(dir_))
    throw Error(fmt::format("[evolve] the run store '{}' is not a folder", dir_));
  const bool marked = exists && fs::exists(fs::path(dir_) / kStoreMarker);
  if (exists && !marked && !fs::is_empty(dir_))
    throw Error(fmt::format(
        "[evolve] '{}' holds files but is not a run store of ffnlab evolve (no {} in it)", dir_,
        kStoreMarker));
  ensure_writable_dir(dir_, "evolve");
  if (!marked) {
    const std::string marker = (fs::path(dir_) / kStoreMarker).string();
    write_file_atomic(marker, kStoreMarkerText, std::char_traits<char>::length(kStoreMarkerText));
  }
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (!is_record_file(e.path())) continue;
    if (!resume) {
      fs::remove(e.path());
      continue;
    }
    kept_.emplace(e.path().stem().string(), e.path().string());
  }
}

// A record an older ffnlab wrote is named by its job's text then: on the first run not found
// by its file name, every record is read once and indexed by the key of its job as written
// now. A file named by today's key is found first, so it wins over an older copy of its job.
// One that cannot be read, or is far larger than a record, is left out (find() names it when
// its run is asked for by its file name).
void RunStore::index_older_records() const {
  if (older_indexed_) return;
  older_indexed_ = true;
  constexpr std::uint64_t kMaxRecordBytes = std::uint64_t{256} << 20;
  for (const auto& [name, path] : kept_) {
    try {
      const nlohmann::json stored =
          nlohmann::json::from_cbor(read_regular_file(path, "evolve", kMaxRecordBytes));
      const std::string key = run_key(job_as_written_now(stored.at("job")), stored.at("data"));
      if (key != name) older_.emplace(key, path);
    } catch (const nlohmann::json::exception&) {
    } catch (const Error&) {
    }
  }
}

void check_run_store(const Options& o) {
  const std::string dir = runs_dir(o);
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kStoreMarker, ec)) {
    if (fs::is_directory(dir, ec) && !fs::is_empty(dir, ec))
      throw Error(fmt::format(
          "[evolve] '{}' holds files but is not a run store of ffnlab evolve (no {} in it): give "
          "another {} folder",
          dir, kStoreMarker, option_name(o, "--runs")));
    return;  // new or empty
  }
  if (o.resume || o.force) return;
  const std::int64_t kept = count_records(dir);
  if (kept == 0) return;
  const std::string resume = option_name(o, "--resume");
  // A budgeted study cannot resume (check_options): its way back is the plan it printed.
  const std::string take =
      o.budget_seconds > 0
          ? fmt::format(
                "to take them, give what the budget chose (sizes, seeds, steps) with {} "
                "instead of the budget",
                resume)
          : fmt::format("{} takes those this study shares and trains the rest", resume);
  throw UsageError(fmt::format(
      "[evolve] the run store '{}' keeps {} finished run{} of an earlier study: {}; {} discards "
      "them and starts over; or give another {}",
      dir, kept, kept == 1 ? "" : "s", take, option_name(o, "--force"), option_name(o, "--runs")));
}

std::int64_t RunStore::size() const {
  return enabled() ? count_records(dir_) : 0;
}

std::optional<RunRecord> RunStore::find(const nlohmann::json& job) const {
  const std::string key = run_key(job, fingerprint_);
  auto kept = kept_.find(key);
  if (kept == kept_.end()) {
    index_older_records();
    kept = older_.find(key);
    if (kept == older_.end()) return std::nullopt;
  }
  const std::string& path = kept->second;
  const std::vector<std::uint8_t> bytes = read_regular_file(path, "evolve");
  // A file that is not CBOR, or not a record (a key missing, a value of another type): the
  // library's reader errors, not another failure (memory) dressed as a bad file.
  const auto unreadable = [&](const char* why) {
    return Error(
        fmt::format("[evolve] the run store's '{}' cannot be read ({}): remove it, and "
                    "the resumed study trains that run again",
                    path, why));
  };
  try {
    const nlohmann::json stored = nlohmann::json::from_cbor(bytes);
    // The key names the job; a different job under it (a collision, or a file copied from
    // elsewhere) is trained again, not taken.
    if (job_as_written_now(stored.at("job")) != job || stored.at("data") != fingerprint_)
      return std::nullopt;
    return record_from_json(stored.at("record"));
  } catch (const nlohmann::json::exception& e) {
    throw unreadable(e.what());
  } catch (const Error& e) {
    throw unreadable(e.what());
  }
}

void RunStore::put(const nlohmann::json& job, const RunRecord& record) const {
  const std::string key = run_key(job, fingerprint_);
  const nlohmann::json stored{
      {"job", job}, {"data", fingerprint_}, {"record", record_to_json(record)}};
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(stored);
  write_file_atomic((fs::path(dir_) / (key + ".cbor")).string(), bytes.data(), bytes.size());
}

}  // namespace ffnlab::study
