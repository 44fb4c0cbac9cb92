// Config files and weight loading for FFN layers.
#include "ffnlab/io/ffn_io.hpp"

#include <cstring>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/hf_config.hpp"
#include "json_keys.hpp"

namespace ffnlab {

FFNConfig read_ffn_config_file(const std::string& path, std::int64_t model_d_model) {
  const auto bytes = read_regular_file(path, "config", std::uint64_t{1} << 24);
  const nlohmann::json j = parse_json_text(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "config", path);
  try {
    if (is_hf_config(j)) return hf_ffn_config(j);
    return model_d_model > 0 ? ffn_in_model(j, model_d_model) : config_from_json(j);
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), path);
  }
}

LMConfig read_lm_config_file(const std::string& path, nlohmann::json* file) {
  const auto bytes = read_regular_file(path, "train", std::uint64_t{1} << 24);
  const nlohmann::json j = parse_json_text(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "train", path);
  if (file) *file = j;
  try {
    return lm_config_from_json(j);
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), path);
  }
}

void load_parameters(ParameterSet& params, const SafeTensors& file, const std::string& prefix) {
  for (auto& p : params.list()) {
    const std::string name = prefix + p.name;
    if (!file.contains(name)) {
      std::string some;
      int shown = 0;
      for (const auto& n : file.names()) {
        if (shown++ == 4) {
          some += ", ...";
          break;
        }
        some += (some.empty() ? "" : ", ") + n;
      }
      fail("[weights] {}: missing tensor '{}' (the file has: {}{})", file.source(), name,
           some.empty() ? "nothing" : some, prefix.empty() ? "; a --prefix may be needed" : "");
    }
    const auto& info = file.info(name);
    check(info.shape == p.shape, "[weights] {}: tensor '{}' has shape {}, the layer needs {}",
          file.source(), name, shape_string(info.shape), shape_string(p.shape));
  }
  // A tensor under the prefix that no parameter reads is a layer the config does not describe
  // (biases, shared experts, another expert count): loading the rest would compute another layer.
  std::string unread;
  int count = 0;
  for (const auto& n : file.names()) {
    if (n.compare(0, prefix.size(), prefix) != 0 || params.contains(n.substr(prefix.size())))
      continue;
    if (count++ < 4) unread += (unread.empty() ? "'" : ", '") + n + "'";
  }
  if (count > 0)
    fail("[weights] {}: {} tensor{} {} {} no parameter of this layer ({}{}): {}", file.source(),
         count, count == 1 ? "" : "s",
         prefix.empty() ? "of the file" : fmt::format("under the prefix '{}'", prefix),
         count == 1 ? "is" : "are", unread, count > 4 ? ", ..." : "",
         prefix.empty() ? "the file holds more than this layer (a prefix selects one layer's "
                          "tensors), or the config does not describe the layer they are for"
                        : "the config does not describe the layer these weights are for");
  // Every check passed: only now is anything copied.
  for (auto& p : params.list()) file.copy_f32(prefix + p.name, p.value);
}

}  // namespace ffnlab
