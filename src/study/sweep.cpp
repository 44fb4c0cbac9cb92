// Stage "sweep" (only with Options::sweep): ReLU and SwiGLU LMs as the FFN widens,
// d_ff / d_model = 1, 2, 4, 8, SwiGLU at the parameters of the ReLU FFN of each ratio.
#include <fmt/format.h>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

std::int64_t sweep_steps(const Study& st) {
  return st.options.sweep
             ? 2 * static_cast<std::int64_t>(st.scale.sweep_ratios.size()) * st.scale.train.steps
             : 0;
}

std::vector<RunJob> sweep_jobs(const Study& st) {
  std::vector<RunJob> jobs;
  for (int ratio : st.scale.sweep_ratios) {
    const std::int64_t D = st.scale.model.d_model;
    const FFNConfig relu = variant_config("relu", D, ratio * D, true);
    const FFNConfig swiglu =
        match_params(variant_config("swiglu", D, ratio * D, true), count_params(relu));
    for (const auto& [name, ffn] : {std::pair{"relu", relu}, std::pair{"swiglu", swiglu}}) {
      RunJob job;
      job.model = st.scale.model;
      job.model.ffn = ffn;
      job.label = fmt::format("{} x{}", name, ratio);
      jobs.push_back(std::move(job));
    }
  }
  return jobs;
}

void run_sweep(Study& st) {
  if (!st.options.sweep) return;
  st.stage("sweep: d_ff / d_model = 1, 2, 4, 8 for ReLU and SwiGLU");
  SweepResult out;
  std::string csv = "ratio,relu,swiglu\n";
  std::vector<RunJob> jobs = sweep_jobs(st);
  for (std::size_t i = 0; i < st.scale.sweep_ratios.size(); ++i) {
    SweepPoint p;
    p.ratio = st.scale.sweep_ratios[i];
    p.relu_d_ff = jobs[2 * i].model.ffn.d_ff;
    p.swiglu_d_ff = jobs[2 * i + 1].model.ffn.d_ff;
    out.points.push_back(p);
  }
  const std::vector<RunRecord> runs = train_runs(st, std::move(jobs));
  for (std::size_t i = 0; i < out.points.size(); ++i) {
    SweepPoint& p = out.points[i];
    p.relu_bits_per_byte = runs[2 * i].val_bits_per_byte;
    p.swiglu_bits_per_byte = runs[2 * i + 1].val_bits_per_byte;
    csv += fmt::format("{},{:.5f},{:.5f}\n", p.ratio, p.relu_bits_per_byte, p.swiglu_bits_per_byte);
  }
  st.write("sweep.csv", csv);
  st.results.sweep = std::move(out);
}

json sweep_json(const Results& res) {
  return json_if(res.sweep, [](const SweepResult& s) {
    json out;
    for (const SweepPoint& p : s.points) {
      out["relu"].push_back(
          {{"ratio", p.ratio}, {"d_ff", p.relu_d_ff}, {"val_bits_per_byte", p.relu_bits_per_byte}});
      out["swiglu"].push_back({{"ratio", p.ratio},
                               {"d_ff", p.swiglu_d_ff},
                               {"val_bits_per_byte", p.swiglu_bits_per_byte}});
    }
    return out;
  });
}

std::string sweep_markdown(const Study& st, const Sections&) {
  if (!st.results.sweep) return "";
  std::vector<std::vector<std::string>> rows;
  for (const SweepPoint& p : st.results.sweep->points)
    rows.push_back({std::to_string(p.ratio),
                    fmt::format("{:.4f} (d_ff {})", p.relu_bits_per_byte, p.relu_d_ff),
                    fmt::format("{:.4f} (d_ff {})", p.swiglu_bits_per_byte, p.swiglu_d_ff)});
  std::string md =
      "Validation bits/byte of the study's LM (seed 1, same steps) as the FFN's width grows; "
      "SwiGLU at the width that gives it the parameters of the ReLU FFN of the same ratio "
      "(about 2/3 of it).\n\n";
  md += markdown_table({"d_ff / d_model", "relu", "swiglu"}, rows, "rrr");
  return md + "\nsweep.png draws it (the figures at the top).\n\n";
}

}  // namespace ffnlab::study
