// ffnlab run: one FFN layer on tensors from safetensors files, forward and optionally backward.
#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/layers/moe_ffn.hpp"
#include "launch.hpp"

namespace ffnlab::cli {

namespace {

namespace fs = std::filesystem;

struct RunOptions {
  std::string config, weights, prefix, input, output, grad_output, grads, dtype = "f32";
  std::uint64_t seed = 0;
  int threads = 0;
  bool first_layer = false;  // MoE++: the model's first MoE layer, without a gate_residual
  bool stochastic = true;    // with --grad-output: route as in training (--no-stochastic: not)
};

// The tensor `name` of a file as [T, D]: leading dimensions are flattened.
Tensor read_rows(const std::string& path, const std::string& name, std::int64_t d,
                 Shape& original) {
  const SafeTensors file = SafeTensors::load(path);
  if (!file.contains(name)) throw Error(fmt::format("[run] {}: no tensor named '{}'", path, name));
  Tensor t = file.f32(name);
  original = t.shape();
  if (t.rank() < 2 || t.dim(-1) != d)
    throw Error(fmt::format("[run] {}: tensor '{}' has shape {}, expected [..., {}]", path, name,
                            shape_string(t.shape()), d));
  return t.reshape({t.numel() / d, d});
}

// The MoE's routing next to y: the losses its routing defines (unweighted), its router entropy,
// the chosen experts and combine weights.
void add_routing(SafeTensorsWriter& out, const MoEFFN& moe) {
  const Routing& r = moe.routing();
  const auto routing = moe.config().moe.routing;
  const RoutingFamily& family = routing_family(routing);
  auto scalar = [&](const char* name, double v) {
    out.add(name, Tensor::from({1}, {static_cast<float>(v)}));
  };
  if (routing_reads(routing, "aux_coef")) scalar("balance_loss", r.balance_loss);
  if (routing_reads(routing, "z_coef")) scalar("z_loss", r.z_loss);
  if (family.router_linear || family.own_path) scalar("entropy", r.entropy);
  if (family.own_loss) scalar("l1_loss", r.l1_loss);
  if (moe.router_logits().defined()) out.add("logits", moe.router_logits());
  const Shape shape{r.tokens, r.k};
  out.add_ints("experts", shape, std::vector<std::int64_t>(r.expert.begin(), r.expert.end()));
  out.add("expert_weights", Tensor::from(shape, r.weight));
  std::vector<std::int64_t> kept(r.slot.size());
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = r.slot[i] >= 0;
  out.add_ints("expert_kept", shape, kept);
}

// The tensor `name` of a file, which must have `shape` when present (an empty tensor when absent).
Tensor read_optional(const std::string& path, const std::string& name, const Shape& shape) {
  const SafeTensors file = SafeTensors::load(path);
  if (!file.contains(name)) return Tensor();
  Tensor t = file.f32(name);
  if (t.shape() != shape)
    throw Error(fmt::format("[run] {}: tensor '{}' has shape {}, expected {}", path, name,
                            shape_string(t.shape()), shape_string(shape)));
  return t;
}

void run(const RunOptions& o) {
  apply_threads(o.threads);
  // Every input is read and checked, and every output place, before the layer is built. A
  // missing input file is bad input (exit 1), as for every command, not a usage error.
  for (const auto& [flag, path] : {std::pair{"--config", &o.config},
                                   {"--weights", &o.weights},
                                   {"--input", &o.input},
                                   {"--grad-output", &o.grad_output}})
    if (!path->empty()) regular_file_size(*path, "run");
  check_output_path(o.output, "run");
  const bool backward = !o.grad_output.empty();
  if (backward) check_output_path(o.grads, "run");
  // Two files of one name: the outputs with each other, or an output with an input, which it
  // would replace (the inputs are memory-mapped while read).
  const std::vector<std::pair<const char*, const std::string*>> outputs = {{"--output", &o.output},
                                                                           {"--grads", &o.grads}};
  const std::vector<std::pair<const char*, const std::string*>> others = {
      {"--grads", &o.grads},
      {"--config", &o.config},
      {"--weights", &o.weights},
      {"--input", &o.input},
      {"--grad-output", &o.grad_output}};
  for (const auto& [out_flag, out] : outputs)
    for (const auto& [other_flag, other] : others)
      if (out != other && !out->empty() && !other->empty() &&
          resolved_path(*out) == resolved_path(*other))
        throw UsageError(fmt::format("[run] {} '{}' is the {} file: writing it would replace it",
                                     out_flag, *out, other_flag));
  // The leftovers of a run into the same places that was killed while it wrote them.
  for (const auto& [out_flag, out] : outputs)
    if (!out->empty()) {
      const fs::path target(*out);
      const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
      const std::string name = target.filename().string();
      remove_stale_temporaries(dir, [&](std::string_view t) { return t == name; });
    }
  const FFNConfig config = read_ffn_config_file(o.config);
  Shape x_shape, dy_shape;
  const Tensor x = read_rows(o.input, "x", config.d_model, x_shape);
  Tensor dy;
  if (backward) {
    dy = read_rows(o.grad_output, "dy", config.d_model, dy_shape);
    if (dy_shape != x_shape)
      throw Error(fmt::format("[run] dy has shape {}, x has {}", shape_string(dy_shape),
                              shape_string(x_shape)));
  }
  // MoE++'s gating residual: the previous MoE layer's logits beside x, and with --grad-output
  // optionally the gradient the next layer hands back for this layer's logits beside dy.
  const bool residual = config.kind == FFNKind::moe && config.moe.gating_residual;
  const std::int64_t T = x.dim(0), E = config.moe.routed_experts();
  // --first-layer says that the layer takes no gate_residual: it means something only to MoE++'s
  // gating residual, and never beside one.
  if (o.first_layer && !residual)
    throw UsageError(
        "[run] --first-layer: the layer has no gating_residual (MoE++), which alone reads it");
  if (o.first_layer && SafeTensors::load(o.input).contains("gate_residual"))
    throw UsageError(fmt::format(
        "[run] --first-layer: a model's first MoE layer takes no gate_residual, and {} holds one; "
        "drop one of them",
        o.input));
  Tensor gate_residual, dlogits;
  if (residual) {
    gate_residual = read_optional(o.input, "gate_residual", {T, E});
    if (backward) dlogits = read_optional(o.grad_output, "dlogits", {T, E});
  } else if (SafeTensors::load(o.input).contains("gate_residual")) {
    throw Error(fmt::format(
        "[run] {}: holds 'gate_residual', but the layer has no gating_residual (MoE++) to take it",
        o.input));
  } else if (backward && SafeTensors::load(o.grad_output).contains("dlogits")) {
    throw Error(fmt::format(
        "[run] {}: holds 'dlogits', but the layer has no gating_residual (MoE++) to take it",
        o.grad_output));
  }
  // The tokens' ids beside x (I32 or I64, [T] or x's leading shape): routings that choose by
  // them (hash routing) read them.
  std::vector<std::int32_t> token_ids;
  if (const SafeTensors in = SafeTensors::load(o.input); in.contains("token_ids")) {
    if (!reads_token_ids(config))
      throw Error(fmt::format(
          "[run] {}: holds 'token_ids', but the layer's routing does not read them (hash routing "
          "does)",
          o.input));
    const std::vector<std::int64_t> ids = in.ints("token_ids");
    if (static_cast<std::int64_t>(ids.size()) != T)
      throw Error(
          fmt::format("[run] {}: 'token_ids' holds {} ids for {} tokens", o.input, ids.size(), T));
    for (const std::int64_t id : ids) {
      if (id < 0 || id > std::numeric_limits<std::int32_t>::max())
        throw Error(fmt::format("[run] {}: token id {} is outside [0, 2^31)", o.input, id));
      token_ids.push_back(static_cast<std::int32_t>(id));
    }
  } else if (reads_token_ids(config) && T > 0) {
    throw Error(fmt::format(
        "[run] {}: the layer's routing ({}) chooses experts by the tokens' ids: put them beside x "
        "as 'token_ids' (I32 or I64, [T] or x's leading shape)",
        o.input, enum_name(config.moe.routing)));
  }
  const SafeTensors weights = o.weights.empty() ? SafeTensors{} : SafeTensors::load(o.weights);
  const std::int64_t params = count_params(config);
  check_memory(8.0 * static_cast<double>(params), "run",
               fmt::format("a layer of {} parameters (weights and gradients)", params));

  auto ffn = make_ffn(config, o.seed);
  ffn->set_precision(parse_enum<Precision>(o.dtype));
  // x [B, S, D] holds B sequences of S tokens (what expert-choice routing routes on its own);
  // x [T, D] is one sequence.
  if (x_shape.size() >= 3) ffn->context().sequence = x_shape[x_shape.size() - 2];
  if (!o.weights.empty()) load_parameters(ffn->parameters(), weights, o.prefix);
  ffn->context().previous_logits = gate_residual.defined() ? &gate_residual : nullptr;
  ffn->context().logits_grad = dlogits.defined() ? &dlogits : nullptr;
  ffn->context().token_ids = token_ids.empty() ? nullptr : token_ids.data();
  ffn->context().first_layer = o.first_layer;
  ffn->context().stochastic = o.stochastic;
  ffn->set_random_stream(o.seed, 0);  // the training forward's jitter and noise follow --seed

  Tensor y;
  ffn->forward(y, x, backward);
  SafeTensorsWriter out;
  out.add("y", y.reshape(x_shape));
  out.set_metadata("ffnlab_config", config_to_json(config).dump());
  if (const auto* moe = dynamic_cast<const MoEFFN*>(ffn.get())) add_routing(out, *moe);
  const auto y_bytes = out.serialize();
  if (!backward) {
    write_file_atomic(o.output, y_bytes.data(), y_bytes.size());
    return;
  }
  Tensor dx;
  ffn->parameters().zero_grad();
  ffn->backward(dx, dy);
  SafeTensorsWriter g;
  g.add("dx", dx.reshape(x_shape));
  for (const auto& p : ffn->parameters().list()) g.add(o.prefix + p.name, p.grad);
  if (gate_residual.defined()) g.add("dgate_residual", ffn->previous_logits_grad());
  const auto g_bytes = g.serialize();
  // Both files or neither when a write fails (a full disk): both are written and synced before
  // either is renamed into place. (A rename failing between the two would leave the first.)
  write_files_atomic(
      {{o.grads, g_bytes.data(), g_bytes.size()}, {o.output, y_bytes.data(), y_bytes.size()}});
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand(
      "run",
      "Run one FFN layer on a tensor x from a safetensors file and write y (MoE: also "
      "experts, expert_weights, expert_kept, and those of balance_loss, z_loss, entropy, l1_loss "
      "and logits that its routing defines; a 'token_ids' tensor beside x gives hash routing the "
      "tokens' ids); "
      "with --grad-output, also write dx and every parameter gradient (MoE: of y·dy plus the "
      "weighted aux losses). A layer with MoE++'s gating_residual also takes the previous "
      "layer's logits as gate_residual [T, E] beside x, and dlogits [T, E] beside dy; the "
      "gradients then include dgate_residual.");
  cmd->add_option("--config", o->config,
                  "layer config: a Hugging Face config.json (llama, mistral, qwen2, chatglm, "
                  "mixtral, qwen2_moe, deepseek_v3) or ffnlab's own JSON (docs/config.md)")
      ->required()
      ->check(named_path());
  cmd->add_option("--weights", o->weights,
                  "safetensors with Hugging Face parameter names (without it: random init from "
                  "--seed)")
      ->check(named_path());
  cmd->add_option("--prefix", o->prefix,
                  "name prefix of the layer's tensors, e.g. model.layers.3.mlp.");
  cmd->add_option("--input", o->input,
                  "safetensors holding x [T, D] (one sequence) or [..., S, D] (sequences of S), "
                  "and gate_residual [T, E] for a layer with gating_residual")
      ->required()
      ->check(named_path());
  cmd->add_option("--output", o->output, "safetensors to write y into")
      ->required()
      ->check(named_path());
  auto* dy = cmd->add_option("--grad-output", o->grad_output,
                             "safetensors holding dy, the gradient of the loss wrt y (and "
                             "optionally dlogits, that of the router logits)")
                 ->check(named_path());
  auto* grads = cmd->add_option("--grads", o->grads,
                                "safetensors to write dx and the parameter gradients into "
                                "(names: dx, and prefix + parameter name)")
                    ->check(named_path());
  dy->needs(grads);
  grads->needs(dy);
  cmd->add_option("--dtype", o->dtype, "compute precision of the products: f32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--seed", o->seed,
                  "initialisation seed when no --weights, and the seed of the training "
                  "forward's noise with --grad-output")
      ->capture_default_str()
      ->check(any_count());
  cmd->add_flag(
         "--stochastic,!--no-stochastic", o->stochastic,
         "with --grad-output, route as in training (the default: the router's jitter and gate "
         "noise, drawn from --seed, and BASE layers' balanced assignment), or with "
         "--no-stochastic as at inference, so that y is the y of a run without --grad-output (an "
         "evaluation with gradients)")
      ->needs(dy);
  cmd->add_flag("--first-layer", o->first_layer,
                "MoE++'s gating residual: the layer is a model's first MoE layer, which takes "
                "no gate_residual (without it, a missing gate_residual is an error)");
  add_threads_option(*cmd, o->threads);
  cmd->callback([o] {
    require_one_process("run");
    run(*o);
  });
}

}  // namespace ffnlab::cli
