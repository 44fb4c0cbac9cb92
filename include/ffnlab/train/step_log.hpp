// What a training run records: a StepLog per optimizer step, an EvalLog per evaluation. Each has
// one serialisation, to_json; the CSV logs of a run folder (run_folder.hpp), the step and
// evaluation dicts of `ffnlab.train` and summary.json's evaluations all derive from it, so that
// every front end carries the same fields under the same names.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ffnlab/layers/transformer_block.hpp"

namespace ffnlab {

struct StepLog {
  std::int64_t step = 0;  // 1-based: the number of updates done
  double loss = 0;        // mean cross-entropy over the step's micro-batches
  double aux_loss = 0;    // MoE aux losses (with coefficients), mean over micro-batches
  double grad_norm = 0;   // before clipping
  double lr = 0;
  double tokens_per_second = 0;
  double seconds = 0;  // wall time of the step
  // MoE (means over layers; zero for dense models)
  double load_cv = 0, max_over_mean = 0, dropped_fraction = 0, router_entropy = 0;
  double experts_per_token = 0;  // of the step's last forward
  double l1_coef = 0;            // ReLU routing: the L1 coefficient after the step
  // Per block, at the steps TrainConfig::diagnostics_every asks for (empty otherwise), gradients
  // before clipping. Data parallel: activations of this rank's share of the batch, gradients of
  // the whole batch (after the all-reduce); expert parallel: grad_ffn counts only the experts
  // this rank holds.
  std::vector<LayerDiagnostics> layers;
};

// Of the validation part; with the masked objective, of its masked bytes (the same positions in
// every run: they depend on the window alone).
struct EvalLog {
  std::int64_t step = 0;
  double loss = 0;  // nats per (masked) byte
  double bits_per_byte = 0;
  std::int64_t tokens = 0;  // bytes predicted
};

// {"step": …, "loss": …, …, "l1_coef": …} in the order of train_log.csv's columns, and
// "layers" (one object per block: layer_to_json) when the step carries diagnostics.
nlohmann::ordered_json to_json(const StepLog& step);
// {"residual_rms", "attention_rms", "ffn_rms", "attention_entropy", "grad_attention",
// "grad_ffn", "grad_router", "router_entropy", "router_top1", "router_logit_std",
// "expert_output_rms" (a list, one per expert; NaN for an expert that got no rows)}.
nlohmann::ordered_json layer_to_json(const LayerDiagnostics& layer);
// {"step", "loss", "bits_per_byte", "tokens"}.
nlohmann::ordered_json to_json(const EvalLog& eval);
// Their inverses, exact for every field (doubles round-trip); a step's "layers" are not read.
// Throws nlohmann::json's errors for a missing field.
StepLog step_from_json(const nlohmann::json& j);
EvalLog eval_from_json(const nlohmann::json& j);

// The CSV forms: a header line and a row line (each ending in '\n'), the columns those of
// to_json under the log's own names (train_log.csv's "tokens_per_s", eval_log.csv's "val_loss").
std::string step_csv_header();
std::string step_csv_row(const StepLog& step);
std::string eval_csv_header();
std::string eval_csv_row(const EvalLog& eval);
// layer_log.csv: a row per block of a step that carries diagnostics (none for the others).
std::string layer_csv_header();
std::string layer_csv_rows(const StepLog& step);

}  // namespace ffnlab
