// StepLog and EvalLog: one table of fields each, which to_json and the CSV rows both read.
#include "ffnlab/train/step_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

namespace ffnlab {

namespace {

// A field of a log: its name in JSON (and Python), its CSV column, how the CSV writes it.
template <class Log, class T>
struct Field {
  const char* name;
  const char* column;
  const char* format;
  T Log::*value;
};

using StepField = Field<StepLog, double>;
using EvalField = Field<EvalLog, double>;

// After "step", train_log.csv's columns in order.
constexpr StepField kStepFields[] = {
    {"loss", "loss", "{:.6f}", &StepLog::loss},
    {"aux_loss", "aux_loss", "{:.6f}", &StepLog::aux_loss},
    {"grad_norm", "grad_norm", "{:.6f}", &StepLog::grad_norm},
    {"lr", "lr", "{:.6g}", &StepLog::lr},
    {"tokens_per_second", "tokens_per_s", "{:.1f}", &StepLog::tokens_per_second},
    {"seconds", "seconds", "{:.4f}", &StepLog::seconds},
    {"load_cv", "load_cv", "{:.5f}", &StepLog::load_cv},
    {"max_over_mean", "max_over_mean", "{:.5f}", &StepLog::max_over_mean},
    {"dropped_fraction", "dropped_fraction", "{:.5f}", &StepLog::dropped_fraction},
    {"router_entropy", "router_entropy", "{:.5f}", &StepLog::router_entropy},
    {"experts_per_token", "experts_per_token", "{:.4f}", &StepLog::experts_per_token},
    {"l1_coef", "l1_coef", "{:.6g}", &StepLog::l1_coef},
};

// After "step", eval_log.csv's columns in order, then "tokens" (an integer).
constexpr EvalField kEvalFields[] = {
    {"loss", "val_loss", "{:.6f}", &EvalLog::loss},
    {"bits_per_byte", "val_bits_per_byte", "{:.6f}", &EvalLog::bits_per_byte},
};

// "step" and the fields' columns (or their JSON values, or their CSV cells) in table order.
template <class Log, std::size_t N>
std::string header_of(const Field<Log, double> (&fields)[N]) {
  std::string out = "step";
  for (const auto& f : fields) (out += ',') += f.column;
  return out;
}
template <class Log, std::size_t N>
std::string row_of(const Log& log, const Field<Log, double> (&fields)[N]) {
  std::string out = fmt::format("{}", log.step);
  for (const auto& f : fields) {
    out += ',';
    fmt::format_to(std::back_inserter(out), fmt::runtime(f.format), log.*f.value);
  }
  return out;
}
template <class Log, std::size_t N>
nlohmann::ordered_json json_of(const Log& log, const Field<Log, double> (&fields)[N]) {
  nlohmann::ordered_json j = {{"step", log.step}};
  for (const auto& f : fields) j[f.name] = log.*f.value;
  return j;
}

template <class Log, std::size_t N>
Log log_of(const nlohmann::json& j, const Field<Log, double> (&fields)[N]) {
  Log log;
  log.step = j.at("step");
  for (const auto& f : fields) log.*f.value = j.at(f.name);
  return log;
}

}  // namespace

StepLog step_from_json(const nlohmann::json& j) {
  return log_of(j, kStepFields);
}

EvalLog eval_from_json(const nlohmann::json& j) {
  EvalLog e = log_of(j, kEvalFields);
  e.tokens = j.at("tokens");
  return e;
}

nlohmann::ordered_json layer_to_json(const LayerDiagnostics& d) {
  return {{"residual_rms", d.residual_rms},
          {"attention_rms", d.attention_rms},
          {"ffn_rms", d.ffn_rms},
          {"attention_entropy", d.attention_entropy},
          {"grad_attention", d.grad_attention},
          {"grad_ffn", d.grad_ffn},
          {"grad_router", d.grad_router},
          {"router_entropy", d.ffn.router_entropy},
          {"router_top1", d.ffn.top1_prob},
          {"router_logit_std", d.ffn.router_logit_std},
          {"expert_output_rms", d.ffn.expert_output_rms}};
}

nlohmann::ordered_json to_json(const StepLog& s) {
  nlohmann::ordered_json j = json_of(s, kStepFields);
  if (!s.layers.empty()) {
    j["layers"] = nlohmann::ordered_json::array();
    for (const LayerDiagnostics& l : s.layers) j["layers"].push_back(layer_to_json(l));
  }
  return j;
}

nlohmann::ordered_json to_json(const EvalLog& e) {
  nlohmann::ordered_json j = json_of(e, kEvalFields);
  j["tokens"] = e.tokens;
  return j;
}

std::string step_csv_header() {
  return header_of(kStepFields) + "\n";
}

std::string step_csv_row(const StepLog& s) {
  return row_of(s, kStepFields) + "\n";
}

std::string eval_csv_header() {
  return header_of(kEvalFields) + ",tokens\n";
}

std::string eval_csv_row(const EvalLog& e) {
  return row_of(e, kEvalFields) + fmt::format(",{}\n", e.tokens);
}

std::string layer_csv_header() {
  return "step,layer,residual_rms,attention_rms,ffn_rms,attention_entropy,grad_attention,grad_ffn,"
         "grad_router,router_entropy,router_top1,router_logit_std,expert_output_rms_min,"
         "expert_output_rms_mean,expert_output_rms_max\n";
}

std::string layer_csv_rows(const StepLog& s) {
  std::string out;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const LayerDiagnostics& d = s.layers[l];
    // Over the experts that got rows (empty cells for a dense layer, or when none did).
    double lo = 0, hi = 0, sum = 0;
    int n = 0;
    for (double r : d.ffn.expert_output_rms) {
      if (std::isnan(r)) continue;
      lo = n ? std::min(lo, r) : r;
      hi = n ? std::max(hi, r) : r;
      sum += r;
      ++n;
    }
    const auto cell = [&](double v) { return n ? fmt::format("{:.6g}", v) : std::string(); };
    out += fmt::format(
        "{},{},{:.6g},{:.6g},{:.6g},{:.5f},{:.6g},{:.6g},{:.6g},{:.5f},{:.5f},{:.6g},{},{},{}\n",
        s.step, l, d.residual_rms, d.attention_rms, d.ffn_rms, d.attention_entropy,
        d.grad_attention, d.grad_ffn, d.grad_router, d.ffn.router_entropy, d.ffn.top1_prob,
        d.ffn.router_logit_std, cell(lo), cell(n ? sum / n : 0.0), cell(hi));
  }
  return out;
}

}  // namespace ffnlab
