// Checkpoints, written atomically with checkpoint.json last, in one file or (a model holding only
// its rank's experts) in parts; reading checks every field of a file that may be hostile.
#include "ffnlab/train/checkpoint.hpp"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "check.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/json_text.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/train_config.hpp"
#include "hash.hpp"
#include "json_keys.hpp"
#include "ranges.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "ffnlab-checkpoint-1";

// Each trainable parameter's moments are stored under its name, so that a checkpoint does not
// depend on the buffer's layout; checkpoints written before kept them as two flat tensors
// ("optimizer.m", "optimizer.v") in the buffer's order, which load still reads.
std::string moment_name(const char* moment, const Parameter& p) {
  return fmt::format("optimizer.{}.{}", moment, p.name);
}

// A save's files: its main weights file, and rank q's expert shard (expert parallel).
std::string main_weights_name(const std::string& stem) {
  return stem + ".safetensors";
}
std::string shard_name(const std::string& stem, int q) {
  return fmt::format("{}-experts-{}.safetensors", stem, q);
}

// A weights file's name as checkpoint.json may give it: weights-*.safetensors beside it.
bool is_weights_name(const std::string& name) {
  return name.starts_with("weights-") && name.ends_with(".safetensors") &&
         name.find('/') == std::string::npos && name.size() < 64;
}

// The weights' hash over `ranges` of the buffer (splitmix64 folds the pieces' FNV-1a).
std::int64_t ranges_hash(const Tensor& values,
                         const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::uint64_t h = 0;
  for (const auto& [b, e] : ranges)
    h = splitmix64(h ^ fnv1a64(values.f32() + b, static_cast<std::size_t>(e - b) * sizeof(float)));
  return static_cast<std::int64_t>(h);
}

// The names of the weights files the committed checkpoint in `dir` lists: none where there is
// no checkpoint.json; nothing (not known) where there is one that cannot be read.
std::optional<std::set<std::string>> committed_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kCheckpointInfo, ec) && !ec) return std::set<std::string>{};
  try {
    const json info = read_checkpoint_info(dir);
    std::set<std::string> names{info["weights"].get<std::string>()};
    if (info.contains("shards"))
      for (const json& n : info["shards"]) names.insert(n.get<std::string>());
    return names;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The stem of a save's weights files at `step` in `dir`, of `parts` files (the main one and
// parts − 1 expert shards): "weights-00000020", or where the committed checkpoint lists a file
// of that stem (a save at its own step: a resume that saves its changed settings)
// "weights-00000020-r1" (or the next number free), so that no committed file is replaced before
// checkpoint.json names the new ones: a save that fails leaves the committed checkpoint whole.
// Where checkpoint.json cannot be read, every file in the folder counts as committed.
std::string weights_stem(const std::string& dir, std::int64_t step, int parts) {
  const std::optional<std::set<std::string>> committed = committed_files(dir);
  const auto taken = [&](const std::string& name) {
    std::error_code ec;
    return committed ? committed->contains(name) : fs::exists(fs::path(dir) / name, ec) || ec;
  };
  for (int revision = 0;; ++revision) {
    const std::string stem = revision == 0 ? fmt::format("weights-{:08d}", step)
                                           : fmt::format("weights-{:08d}-r{}", step, revision);
    bool free = !taken(main_weights_name(stem));
    for (int q = 1; q < parts && free; ++q) free = !taken(shard_name(stem, q));
    if (free) return stem;
  }
}

bool is_checkpoint_file(std::string_view name) {
  return name == kCheckpointInfo ||
         (name.starts_with("weights-") && name.ends_with(".safetensors"));
}

// While checkpoint files are written or read, the ranks that wait for the writers' or readers'
// results wait longer than --dist-timeout by a second for every 10 MB of the model's checkpoint
// (weights and optimizer moments): a large checkpoint on a slow shared file system is not a
// hung rank.
class FileWait {
 public:
  FileWait(ProcessGroup& group, TransformerLM& model) : group_(group) {
    group_.set_extra_wait(12.0 * static_cast<double>(model.parameters().count()) / 10e6);
  }
  ~FileWait() { group_.set_extra_wait(0); }
  FileWait(const FileWait&) = delete;
  FileWait& operator=(const FileWait&) = delete;

 private:
  ProcessGroup& group_;
};

// Rank 0's outcome of a write, to every rank: the message broadcast, its kind and errno beside
// it, so that every rank fails as rank 0 did (a stop as interrupted, exit 130, not as a failed
// write, exit 3). Another rank's `f` is not read.
Failure from_rank_zero(ProcessGroup& group, Failure f) {
  if (group.rank() != 0) f = {};
  group.broadcast(f.message, "checkpoint");
  std::vector<std::int64_t> code{static_cast<std::int64_t>(f.kind), f.error_number};
  group.allreduce_max(code, "checkpoint");  // the other ranks give zeros
  f.kind = static_cast<Failure::Kind>(code[0]);
  f.error_number = static_cast<int>(code[1]);
  return f;
}

// FNV-1a of the weights' bytes (its bits as a signed integer: min and max compare them).
std::vector<std::int64_t> weights_hash(const Tensor& values) {
  const std::uint64_t h = fnv1a64(values.f32(), static_cast<std::size_t>(values.nbytes()));
  return {static_cast<std::int64_t>(h)};
}

}  // namespace

void CheckpointIO::save(const std::string& dir, std::int64_t step) {
  ProcessGroup* group = plan_.group();
  if (!group) return write(dir, step);
  if (plan_.own_experts_only()) return save_in_parts(dir, step);
  // Every rank must hold the same weights (they make the same updates from the same summed
  // gradients); a checkpoint of one rank's would otherwise hide a divergence.
  plan_.refresh_experts(ExpertState::with_moments);
  std::vector<std::int64_t> lo = weights_hash(model_.parameters().values()), hi = lo;
  group->allreduce_min(lo, "weights check");
  group->allreduce_max(hi, "weights check");
  check(lo == hi, "[dist] step {}: the ranks' weights differ; this checkpoint is not written",
        step);
  // Rank 0 writes; every rank learns whether it could, so that all stop on a failed write.
  Failure failure;
  {
    const FileWait patience(*group, model_);
    if (group->rank() == 0) try {
        write(dir, step);
      } catch (const std::exception& e) {  // every rank must reach the exchanges below
        failure = Failure::of(e);
      }
    failure = from_rank_zero(*group, failure);
  }
  plan_.release_unheld_experts(ExpertState::with_moments, step);
  if (failure.failed()) failure.raise();
}

std::string CheckpointIO::new_token() {
  ProcessGroup& group = *plan_.group();
  std::string token;
  if (group.rank() == 0) {
    std::random_device random;
    const auto now =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    token = fmt::format("{:08x}{:08x}{:016x}", random(), random(), now);
  }
  group.broadcast(token, "checkpoint");
  return token;
}

void CheckpointIO::check_shared_folder(const std::string& dir) {
  if (!plan_.own_experts_only()) return;
  ProcessGroup& group = *plan_.group();
  const std::string token = new_token();
  const ProcessGroup& eg = plan_.expert_group();
  const auto probe = [&](int q) {
    return fs::path(dir) / fmt::format(".ffnlab-shared-{}-{}", token, q);
  };
  Failure prepared;
  if (group.rank() == 0) try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) fail_errno(ec.value(), "[checkpoint] cannot create '{}': {}", dir, ec.message());
    } catch (const std::exception& e) {  // every rank must reach the exchanges below
      prepared = Failure::of(e);
    }
  prepared = from_rank_zero(group, prepared);
  if (prepared.failed()) prepared.raise();
  // The ranks that write parts (rank q > 0 of the first expert group) each leave a file.
  const bool writes =
      (plan_.replicas() == nullptr || plan_.replicas()->rank() == 0) && eg.rank() > 0;
  Failure failure;
  if (writes) try {
      write_file_atomic(probe(eg.rank()).string(), token.data(), token.size());
    } catch (const std::exception& e) {
      failure = Failure::of(e);
    }
  // Each writer removes its own file once rank 0 has looked (whatever came of it): a folder the
  // ranks do not share keeps none of them either.
  const auto remove_mine = [&] {
    std::error_code ec;
    if (writes) fs::remove(probe(eg.rank()), ec);
  };
  const RanksFailure failed = any_rank_failed(group, failure, "checkpoint folder");
  if (failed.rank >= 0) {
    remove_mine();
    fail_together(group, failure, "checkpoint folder",
                  "[checkpoint] rank {} cannot write into the checkpoint folder (its message says "
                  "why); nothing was trained");
  }
  Failure seen;
  if (group.rank() == 0) try {
      std::vector<int> missing;
      for (int q = 1; q < eg.size(); ++q)
        if (!fs::exists(probe(q))) missing.push_back(q);
      if (!missing.empty())
        fail_system(
            "[checkpoint] rank {} of the expert group wrote a file into '{}' that rank 0 does not "
            "see there: an expert-parallel checkpoint needs a folder every rank shares; nothing "
            "was trained",
            missing.front(), dir);
    } catch (const std::exception& e) {
      seen = Failure::of(e);
    }
  seen = from_rank_zero(group, seen);
  remove_mine();
  if (seen.failed()) seen.raise();
}

void CheckpointIO::save_in_parts(const std::string& rank_dir, std::int64_t step) {
  ProcessGroup& group = *plan_.group();
  // Every part goes to rank 0's folder, whose checkpoint.json lists the parts as files beside
  // it: another rank's own --out (which may differ, or be relative to another directory) is
  // not where rank 0, or a resume, looks.
  // A token of this save that every part carries, and checkpoint.json too: rank 0 knows a part
  // it finds is this save's, not one an earlier attempt left, and a load that every file it
  // reads is. The parts' names are not the committed checkpoint's (weights_stem): that stays
  // whole until checkpoint.json names the new one.
  const ProcessGroup& eg = plan_.expert_group();
  std::string dir, stem;
  if (group.rank() == 0) {
    dir = absolute_or_as_given(rank_dir);
    stem = weights_stem(dir, step, eg.size());
  }
  group.broadcast(dir, "checkpoint");
  group.broadcast(stem, "checkpoint");
  const std::string attempt = new_token();
  check(ranks_hold_the_same_weights(),
        "[dist] step {}: the ranks' weights differ; this checkpoint is not written", step);

  // Rank 0 prepares the folder before anyone writes: it removes a killed run's temporaries.
  Failure prepared;
  if (group.rank() == 0) try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) fail_errno(ec.value(), "[checkpoint] cannot create '{}': {}", dir, ec.message());
      remove_stale_temporaries(dir, is_checkpoint_file);
    } catch (const std::exception& e) {  // every rank must reach the exchanges below
      prepared = Failure::of(e);
    }
  prepared = from_rank_zero(group, prepared);
  if (prepared.failed()) prepared.raise();

  const bool writes = plan_.replicas() == nullptr || plan_.replicas()->rank() == 0;  // group 0
  const std::string weights = main_weights_name(stem);
  std::optional<FileWait> patience(std::in_place, group, model_);  // until the last exchange
  Failure failure;
  if (writes) try {
      if (eg.rank() == 0)
        write_weights((fs::path(dir) / weights).string(), step,
                      [](const Parameter&) { return true; }, attempt);
      else
        write_weights((fs::path(dir) / shard_name(stem, eg.rank())).string(), step,
                      [&](const Parameter& p) { return plan_.is_expert(p); }, attempt);
    } catch (const std::exception& e) {  // every rank must reach the exchanges below
      failure = Failure::of(e);
    }
  // Whether any rank's part failed: all fail as it did.
  const RanksFailure failed = any_rank_failed(group, failure, "checkpoint");
  // Whether a part in the folder is this save's (an older one has another attempt, or none).
  const auto written_now = [&](const fs::path& part) {
    if (!fs::exists(part)) return false;
    const SafeTensors file = SafeTensors::load(part.string());
    const auto at = file.metadata().find("attempt");
    return at != file.metadata().end() && at->second == attempt;
  };
  // checkpoint.json last, once every part is written: until then the last one stands.
  Failure info_failure;
  if (failed.rank < 0 && group.rank() == 0) try {
      std::vector<std::string> shards;
      for (int q = 1; q < eg.size(); ++q) {
        shards.push_back(shard_name(stem, q));
        if (!written_now(fs::path(dir) / shards.back()))
          fail_system(
              "[checkpoint] this save's part of rank {} of the expert group is not in '{}' as "
              "rank 0 sees it: an expert-parallel checkpoint needs a folder every rank shares; "
              "this checkpoint is not written",
              q, dir);
      }
      write_info(dir, step, weights, shards, attempt);
    } catch (const std::exception& e) {  // every rank must reach the exchanges below
      info_failure = Failure::of(e);
    }
  info_failure = from_rank_zero(group, info_failure);
  patience.reset();
  if (failure.failed()) failure.raise();  // this rank's own part failed
  if (failed.rank >= 0) {                 // another rank's part: a stop ends every rank as one
    // (A stop on any rank outranks another's failure; the rank named is the highest-numbered
    // that failed.)
    if (failed.stopped_rank >= 0)
      throw Interrupted(
          "[checkpoint] a stop ended the writing of the experts' parts; this checkpoint is not "
          "written");
    Failure{failed.kind, failed.error_number,
            fmt::format("[checkpoint] rank {} could not write its experts (its message says "
                        "why); this checkpoint is not written",
                        failed.rank)}
        .raise();
  }
  if (info_failure.failed()) info_failure.raise();
}

void CheckpointIO::write(const std::string& dir, std::int64_t step) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail_errno(ec.value(), "[checkpoint] cannot create '{}': {}", dir, ec.message());
  remove_stale_temporaries(dir, is_checkpoint_file);
  const std::string weights = main_weights_name(weights_stem(dir, step, 1));
  write_weights((fs::path(dir) / weights).string(), step, [](const Parameter&) { return true; });
  write_info(dir, step, weights, {});
}

void CheckpointIO::write_weights(const std::string& path, std::int64_t step,
                                 const std::function<bool(const Parameter&)>& keep,
                                 const std::string& attempt) const {
  SafeTensorsWriter w;
  // Views: the file is written from the buffers (a checkpoint costs no copy of the model).
  for (const Parameter& p : model_.parameters().list())
    if (keep(p)) w.add_view(p.name, p.value);
  for (const Parameter& p : model_.parameters().list()) {
    if (!p.trainable || !keep(p)) continue;  // state that no optimizer moves has no moments
    w.add_view(moment_name("m", p), optimizer_.m().view(p.offset, p.shape));
    if (optimizer_.v().defined())
      w.add_view(moment_name("v", p), optimizer_.v().view(p.offset, p.shape));
  }
  w.set_metadata("format", kFormat);
  w.set_metadata("step", std::to_string(step));
  if (!attempt.empty()) w.set_metadata("attempt", attempt);
  w.write(path);
}

void CheckpointIO::write_info(const std::string& dir, std::int64_t step, const std::string& weights,
                              const std::vector<std::string>& shards,
                              const std::string& attempt) const {
  json info = {{"format", kFormat},
               {"step", step},
               {"optimizer_steps", optimizer_.steps()},
               {"weights", weights},
               {"data",
                {{"source", corpus_.source},
                 {"path", resolved_path(corpus_.source)},
                 {"val_fraction", corpus_.val_fraction},
                 {"bytes", corpus_.bytes.size()},
                 {"fingerprint", corpus_.fingerprint},
                 {"train_bytes", corpus_.train().size()}}},
               {"model", lm_config_to_json(model_.config())},
               {"train", train_config_to_json(config_)}};
  if (!shards.empty()) info["shards"] = shards;
  if (!attempt.empty()) info["attempt"] = attempt;
  // (A data path that is not UTF-8 is kept with U+FFFD in its place: a resume names the data.)
  const std::string text = json_text(info, 2) + "\n";
  write_file_atomic((fs::path(dir) / kCheckpointInfo).string(), text.data(), text.size());
  // The commit point has passed: older weights files are no longer referenced.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name != weights && std::find(shards.begin(), shards.end(), name) == shards.end() &&
        name.rfind("weights-", 0) == 0 && e.path().extension() == ".safetensors")
      fs::remove(e.path(), ec);
  }
}

std::string other_optimizer_state(const json& saved_train, bool sgd) {
  const std::string kind =
      saved_train.is_object() ? saved_train.value("optimizer", std::string()) : std::string();
  return kind.empty() || (kind == "sgd") == sgd ? std::string() : kind;
}

json read_checkpoint_info(const std::string& dir) {
  const fs::path path = fs::path(dir) / kCheckpointInfo;
  std::error_code ec;  // (a path the system cannot look at reads as missing; the read names why)
  check(fs::exists(path, ec) || ec, "[checkpoint] no checkpoint in '{}' ({} is missing)", dir,
        path.string());
  const auto bytes = read_regular_file(path.string(), "checkpoint", std::uint64_t{1} << 24);
  json info;
  try {
    info = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    fail("[checkpoint] {} is corrupt: not valid JSON", path.string());
  }
  // Every field is type-checked before it is read (the fuzzer found "format": true escaping as
  // nlohmann's type_error).
  check(info.is_object() && info.contains("format") && info["format"].is_string() &&
            info["format"] == kFormat && info.contains("weights") && info.contains("model") &&
            info.contains("train") && info.contains("step"),
        "[checkpoint] {} is not an ffnlab checkpoint", path.string());
  // Strict types and ranges: a hostile file must not set a negative step or name another file.
  const auto integer = [&](const char* key) {
    try {
      const auto v = json_value<std::int64_t>(info[key]);
      check_range(v, 0, limits::kSteps, "checkpoint", key);
      return v;
    } catch (const BadValue& e) {
      fail("[checkpoint] {}: '{}' {}", path.string(), key, e.problem);
    } catch (const Error& e) {
      fail("{} (in {})", e.what(), path.string());
    }
  };
  check(info["model"].is_object() && info["train"].is_object(),
        "[checkpoint] {}: 'model' and 'train' must be JSON objects", path.string());
  // Every checkpoint writes its model and settings whole; one without these keys would resume
  // with defaults in their place (a model of another shape, another batch).
  const std::vector<std::pair<const char*, std::vector<const char*>>> whole = {
      {"model", {"d_model", "layers", "heads", "vocab", "context", "ffn"}},
      {"train", {"steps", "batch", "seq", "lr"}}};
  for (const auto& [object, keys] : whole) {
    std::string missing;
    for (const char* key : keys)
      if (!info[object].contains(key))
        missing += fmt::format("{}{}", missing.empty() ? "" : ", ", key);
    check(missing.empty(),
          "[checkpoint] {}: '{}' lacks {} (a checkpoint holds its model and "
          "training settings whole)",
          path.string(), object, missing);
  }
  if (info.contains("data")) {
    const json& d = info["data"];
    const auto is = [&](const char* key, bool (json::*type)() const noexcept) {
      return !d.contains(key) || (d[key].*type)();
    };
    const bool fraction_ok =
        !d.contains("val_fraction") ||
        (d["val_fraction"].is_number() && d["val_fraction"].get<double>() >= 0.0 &&
         d["val_fraction"].get<double>() < 1.0);
    check(d.is_object() && is("source", &json::is_string) && is("path", &json::is_string) &&
              is("fingerprint", &json::is_string) && fraction_ok &&
              is("bytes", &json::is_number_unsigned) &&
              is("train_bytes", &json::is_number_unsigned),
          "[checkpoint] {}: 'data' must be an object of its source, fingerprint and byte counts",
          path.string());
  }
  integer("step");
  if (info.contains("optimizer_steps")) integer("optimizer_steps");
  const json& w = info["weights"];
  check(w.is_string() && is_weights_name(w.get<std::string>()),
        "[checkpoint] {}: 'weights' must name a weights-*.safetensors file beside it",
        path.string());
  if (info.contains("shards")) {
    const json& s = info["shards"];
    check(s.is_array() && s.size() <= static_cast<std::size_t>(limits::kExperts) &&
              std::all_of(s.begin(), s.end(),
                          [](const json& n) {
                            return n.is_string() && is_weights_name(n.get<std::string>());
                          }),
          "[checkpoint] {}: 'shards' must list weights-*.safetensors files beside it",
          path.string());
  }
  check(!info.contains("attempt") ||
            (info["attempt"].is_string() && info["attempt"].get<std::string>().size() <= 64),
        "[checkpoint] {}: 'attempt' must be a string of at most 64 characters (the save its files "
        "carry)",
        path.string());
  return info;
}

bool CheckpointIO::ranks_hold_the_same_weights() {
  ProcessGroup& group = *plan_.group();
  const auto& expert_ranges = plan_.expert_ranges();
  // The dense part is the same on every rank, an expert on each of its holders (one a replica).
  std::vector<std::pair<std::int64_t, std::int64_t>> dense;
  for_each_outside(0, model_.parameters().count(), expert_ranges,
                   [&](std::int64_t b, std::int64_t e) { dense.emplace_back(b, e); });
  const auto same_everywhere = [&](ProcessGroup& g, const auto& ranges) {
    std::vector<std::int64_t> lo{ranges_hash(model_.parameters().values(), ranges)}, hi = lo;
    g.allreduce_min(lo, "weights check");
    g.allreduce_max(hi, "weights check");
    return lo == hi;
  };
  bool same = same_everywhere(group, dense);
  if (ProcessGroup* replicas = plan_.replicas())
    same = same_everywhere(*replicas, expert_ranges) && same;
  std::vector<std::int64_t> differs{same ? 0 : 1};
  group.allreduce_max(differs, "weights check");
  return differs[0] == 0;
}

std::int64_t CheckpointIO::load(const std::string& dir) {
  ProcessGroup* group = plan_.group();
  if (!group) return read(dir);
  // Every rank reads its own folder (one they share, or a copy each). All learn whether every
  // rank could, so that none waits in the first step for a rank that failed, and whether they
  // hold the same state: ranks that resumed different checkpoints would train on apart.
  std::int64_t step = -1;
  const FileWait patience(*group, model_);  // a rank reading a large checkpoint is not hung
  fail_together_around(group, "checkpoint",
                       "[checkpoint] rank {} could not read its checkpoint (its message says why)",
                       [&] { step = read(dir); });
  // (The optimizer's own count sets Adam's bias correction.)
  std::vector<std::int64_t> lo{step, optimizer_.steps()}, hi = lo;
  group->allreduce_min(lo, "checkpoint");
  group->allreduce_max(hi, "checkpoint");
  check(lo[0] == hi[0],
        "[dist] the ranks resumed checkpoints of different steps ({} to {}): every rank resumes "
        "the same checkpoint",
        lo[0], hi[0]);
  check(lo[1] == hi[1],
        "[dist] the ranks resumed checkpoints of step {} whose optimizers counted other steps ({} "
        "to {}): every rank resumes the same checkpoint",
        step, lo[1], hi[1]);
  check(ranks_hold_the_same_weights(),
        "[dist] the ranks resumed checkpoints of step {} whose weights differ: every rank resumes "
        "the same checkpoint",
        step);
  return step;
}

std::int64_t CheckpointIO::read(const std::string& dir) {
  const json info = read_checkpoint_info(dir);
  remove_stale_temporaries(dir, is_checkpoint_file);  // files of a run killed while saving
  const json mine = lm_config_to_json(model_.config());
  // The checkpoint's model as it is written now: an older checkpoint holds a float as its double
  // (0.019999999552965164 for 0.02).
  json saved;
  try {
    saved = lm_config_to_json(lm_config_from_json(info["model"]));
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(), (fs::path(dir) / "checkpoint.json").string()));
  }
  std::string diff;
  for (const auto& [k, v] : mine.items())
    if (!saved.contains(k) || saved[k] != v)
      diff += fmt::format("{}{} {} in the checkpoint, {} here", diff.empty() ? "" : "; ", k,
                          saved.value(k, json()).dump(), v.dump());
  check(diff.empty(), "[checkpoint] '{}' holds a model of another shape: {}", dir, diff);
  // The weights file and the expert shards beside it (an expert-parallel run's): each tensor is
  // read by name from the file that holds it, whatever layout wrote them. One file is mapped at a
  // time and only its pages this model reads are touched, so a rank's memory (and address space)
  // holds its own part of the checkpoint, not all of it.
  const std::string main_file = (fs::path(dir) / info["weights"].get<std::string>()).string();
  std::vector<std::string> files{main_file};
  if (info.contains("shards"))
    for (const json& name : info["shards"])
      files.push_back((fs::path(dir) / name.get<std::string>()).string());
  const bool v = optimizer_.v().defined();
  // The moments are read when they are this optimizer's kind of state: Adam's and AdamW's two,
  // or SGD's momentum. A run forced onto the other kind starts its state afresh (zero moments,
  // step count 0; the run's note says so) instead of reading Adam's mean as SGD's momentum.
  const bool fresh_state = !other_optimizer_state(info["train"], !v).empty();
  // What is still to read: each parameter's value, and its moments (trainable ones).
  struct Wanted {
    std::string name;
    Tensor t;
    bool moment;
  };
  std::vector<Wanted> wanted;
  for (Parameter& p : model_.parameters().list()) {
    wanted.push_back({p.name, p.value, false});
    if (!p.trainable || fresh_state) continue;
    wanted.push_back({moment_name("m", p), optimizer_.m().view(p.offset, p.shape), true});
    if (v) wanted.push_back({moment_name("v", p), optimizer_.v().view(p.offset, p.shape), true});
  }
  // Where a tensor was looked for: the file that holds it, or (missing) every file.
  const std::string every_file = files.size() == 1
                                     ? main_file
                                     : fmt::format("{} and its {} expert part{}", main_file,
                                                   files.size() - 1, files.size() == 2 ? "" : "s");
  const auto state_error = [&](const std::string& where, const std::string& name) {
    return fmt::format(
        "[checkpoint] {}: optimizer state '{}' is missing or of another size (optimizer {})", where,
        name, enum_name(optimizer_.config().kind));
  };
  // A checkpoint saved in parts names its save: every file it lists carries the same.
  const std::string attempt = info.value("attempt", std::string());
  for (const std::string& path : files) {
    const SafeTensors f = SafeTensors::load(path);
    if (!attempt.empty()) {
      const auto at = f.metadata().find("attempt");
      check(at != f.metadata().end() && at->second == attempt,
            "[checkpoint] {} is not of the save {} names (its 'attempt' differs): the folder "
            "mixes the files of two saves",
            f.source(), (fs::path(dir) / kCheckpointInfo).string());
    }
    // An earlier checkpoint: the moments in the buffer's order, which the model check above
    // (the same config, so the same declaration order) makes this buffer's order — of a model
    // that holds every expert.
    if (f.contains("optimizer.m") && !fresh_state) {
      check(!plan_.own_experts_only(),
            "[checkpoint] {} keeps the optimizer's moments in one process's layout (an earlier "
            "format): resume it once without --expert-parallel; its next checkpoint resumes on "
            "any layout",
            f.source());
      std::erase_if(wanted, [](const Wanted& w) { return w.moment; });
      for (auto [name, t] :
           {std::pair{"optimizer.m", optimizer_.m()}, std::pair{"optimizer.v", optimizer_.v()}}) {
        if (!t.defined()) continue;
        check(f.contains(name) && shape_numel(f.info(name).shape) == t.numel(), "{}",
              state_error(f.source(), name));
        f.copy_f32(name, t);
      }
    }
    std::erase_if(wanted, [&](Wanted& w) {
      if (!f.contains(w.name)) return false;
      if (w.moment)
        check(shape_numel(f.info(w.name).shape) == w.t.numel(), "{}",
              state_error(f.source(), w.name));
      else
        check(f.info(w.name).shape == w.t.shape(), "[checkpoint] {}: '{}' is {}, the model has {}",
              f.source(), w.name, shape_string(f.info(w.name).shape), shape_string(w.t.shape()));
      f.copy_f32(w.name, w.t);
      return true;
    });
  }
  if (!wanted.empty()) {
    if (wanted.front().moment) fail("{}", state_error(every_file, wanted.front().name));
    fail("[checkpoint] {}: no tensor '{}'", every_file, wanted.front().name);
  }
  const auto step = info["step"].get<std::int64_t>();
  if (fresh_state) {  // (before the release below: zeros written after it would bring back the
    optimizer_.m().zero();  // pages it gives back)
    if (v) optimizer_.v().zero();
  }
  // Expert parallel: this rank keeps its own experts only.
  plan_.release_unheld_experts(ExpertState::with_moments, step);
  if (fresh_state) {
    optimizer_.set_steps(0);
  } else {
    optimizer_.set_steps(
        info.contains("optimizer_steps") ? info["optimizer_steps"].get<std::int64_t>() : step);
  }
  return step;
}

}  // namespace ffnlab
