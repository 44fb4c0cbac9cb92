// Checkpoints: DIR/checkpoint.json (configs, step, data) and DIR/weights-<step>.safetensors
// (parameters and their optimizer moments, all by name), written atomically with checkpoint.json
// last; reading checks every field of a file that may be hostile. Data parallel: the ranks
// compare their weights first and rank 0 writes.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/trainer.hpp"
#include "hash.hpp"
#include "json_keys.hpp"

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

bool is_checkpoint_file(std::string_view name) {
  return name == kCheckpointInfo ||
         (name.starts_with("weights-") && name.ends_with(".safetensors"));
}

// FNV-1a of the weights' bytes (its bits as a signed integer: min and max compare them).
std::vector<std::int64_t> weights_hash(const Tensor& values) {
  const std::uint64_t h = fnv1a64(values.f32(), static_cast<std::size_t>(values.nbytes()));
  return {static_cast<std::int64_t>(h)};
}

}  // namespace

void Trainer::save(const std::string& dir) {
  ProcessGroup* group = parallel_.group;
  if (!group) return write_checkpoint(dir);
  // Every rank must hold the same weights (they make the same updates from the same summed
  // gradients); a checkpoint of one rank's would otherwise hide a divergence.
  refresh_experts(ExpertState::with_moments);
  std::vector<std::int64_t> lo = weights_hash(model_.parameters().values()), hi = lo;
  group->allreduce_min(lo, "weights check");
  group->allreduce_max(hi, "weights check");
  check(lo == hi, "[dist] step {}: the ranks' weights differ; no checkpoint written", step_);
  // Rank 0 writes; every rank learns whether it could, so that all stop on a failed write.
  std::string failure;
  if (group->rank() == 0) try {
      write_checkpoint(dir);
    } catch (const Error& e) {
      failure = e.what();
    }
  group->broadcast(failure, "checkpoint");
  release_foreign_experts(ExpertState::with_moments);
  if (!failure.empty()) throw SystemError(failure);
}

void Trainer::write_checkpoint(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail_system("[checkpoint] cannot create '{}': {}", dir, ec.message());
  remove_stale_temporaries(dir, is_checkpoint_file);
  const std::string weights = fmt::format("weights-{:08d}.safetensors", step_);
  SafeTensorsWriter w;
  for (const Parameter& p : model_.parameters().list()) w.add(p.name, p.value);
  for (const Parameter& p : model_.parameters().list()) {
    if (!p.trainable) continue;  // state that no optimizer moves has no moments
    w.add(moment_name("m", p), optimizer_->m().view(p.offset, p.shape));
    if (optimizer_->v().defined())
      w.add(moment_name("v", p), optimizer_->v().view(p.offset, p.shape));
  }
  w.set_metadata("format", kFormat);
  w.set_metadata("step", std::to_string(step_));
  w.write((fs::path(dir) / weights).string());

  const json info = {{"format", kFormat},
                     {"step", step_},
                     {"optimizer_steps", optimizer_->steps()},
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
  const std::string text = info.dump(2) + "\n";
  write_file_atomic((fs::path(dir) / kCheckpointInfo).string(), text.data(), text.size());
  // The commit point has passed: older weights files are no longer referenced.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name != weights && name.rfind("weights-", 0) == 0 && e.path().extension() == ".safetensors")
      fs::remove(e.path(), ec);
  }
}

json read_checkpoint_info(const std::string& dir) {
  const fs::path path = fs::path(dir) / kCheckpointInfo;
  check(fs::exists(path), "[checkpoint] no checkpoint in '{}' ({} is missing)", dir, path.string());
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
  const std::string name = w.is_string() ? w.get<std::string>() : "";
  check(name.starts_with("weights-") && name.ends_with(".safetensors") &&
            name.find('/') == std::string::npos && name.size() < 64,
        "[checkpoint] {}: 'weights' must name a weights-*.safetensors file beside it",
        path.string());
  return info;
}

void Trainer::load(const std::string& dir) {
  const json info = read_checkpoint_info(dir);
  remove_stale_temporaries(dir, is_checkpoint_file);  // files of a run killed while saving
  const json mine = lm_config_to_json(model_.config());
  std::string diff;
  for (const auto& [k, v] : mine.items())
    if (!info["model"].contains(k) || info["model"][k] != v)
      diff += fmt::format("{}{} {} in the checkpoint, {} here", diff.empty() ? "" : "; ", k,
                          info["model"].value(k, json()).dump(), v.dump());
  check(diff.empty(), "[checkpoint] '{}' holds a model of another shape: {}", dir, diff);
  const SafeTensors st =
      SafeTensors::load((fs::path(dir) / info["weights"].get<std::string>()).string());
  for (Parameter& p : model_.parameters().list()) {
    check(st.contains(p.name), "[checkpoint] {}: no tensor '{}'", st.source(), p.name);
    check(st.info(p.name).shape == p.shape, "[checkpoint] {}: '{}' is {}, the model has {}",
          st.source(), p.name, shape_string(st.info(p.name).shape), shape_string(p.shape));
    st.copy_f32(p.name, p.value);
  }
  auto load_state = [&](const std::string& name, Tensor t) {
    check(st.contains(name) && shape_numel(st.info(name).shape) == t.numel(),
          "[checkpoint] {}: optimizer state '{}' is missing or of another size (optimizer {})",
          st.source(), name, enum_name(optimizer_->config().kind));
    st.copy_f32(name, t);
  };
  const bool v = optimizer_->v().defined();
  // An earlier checkpoint: the moments in the buffer's order, which the model check above (the
  // same config, so the same declaration order) makes this buffer's order.
  if (st.contains("optimizer.m")) {
    load_state("optimizer.m", optimizer_->m());
    if (v) load_state("optimizer.v", optimizer_->v());
  } else {
    for (const Parameter& p : model_.parameters().list()) {
      if (!p.trainable) continue;
      load_state(moment_name("m", p), optimizer_->m().view(p.offset, p.shape));
      if (v) load_state(moment_name("v", p), optimizer_->v().view(p.offset, p.shape));
    }
  }
  step_ = info["step"].get<std::int64_t>();
  release_foreign_experts(
      ExpertState::with_moments);  // expert parallel: this rank keeps its own experts only
  optimizer_->set_steps(
      info.contains("optimizer_steps") ? info["optimizer_steps"].get<std::int64_t>() : step_);
}

}  // namespace ffnlab
