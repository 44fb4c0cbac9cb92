// Stage "literature": this run's comparisons with ReLU beside Shazeer 2020 ("GLU Variants
// Improve Transformer", arXiv:2002.05202, Table 1), the paper the GLU family's place in today's
// models rests on. Its numbers are the paper's; the agreement column is computed from this run's
// verdicts by the rule stated in the section.
#include <fmt/format.h>

#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// Table 1 of Shazeer 2020: T5-base (d_model 768, 12 + 12 layers, no biases) on C4, every FFN at
// the parameters and computation of ReLU's (d_ff 3072; the GLU kinds 2048), held-out
// log-perplexity after 65,536 steps (run-to-run standard deviation) and 524,288 steps.
struct Published {
  const char* variant;
  double at_65k, std_65k, at_524k;
};
constexpr Published kShazeer2020[] = {
    {"relu", 1.997, 0.005, 1.677},   {"gelu", 1.983, 0.005, 1.679},
    {"glu", 1.982, 0.006, 1.663},    {"bilinear", 1.960, 0.005, 1.648},
    {"reglu", 1.953, 0.003, 1.645},  {"geglu", 1.942, 0.004, 1.633},
    {"swiglu", 1.944, 0.010, 1.636},
};

using Direction = LiteratureRow::Direction;
using Agreement = LiteratureRow::Agreement;

std::string_view direction_text(Direction d) {
  switch (d) {
    case Direction::better:
      return "better";
    case Direction::worse:
      return "worse";
    case Direction::mixed:
      return "mixed";
  }
  return "?";
}

std::string_view agreement_text(Agreement a) {
  switch (a) {
    case Agreement::agrees:
      return "agrees";
    case Agreement::disagrees:
      return "disagrees";
    case Agreement::undecided_here:
      return "this run cannot tell";
    case Agreement::mixed_there:
      return "the paper's two columns differ";
  }
  return "?";
}

}  // namespace

void run_literature(Study& st) {
  if (!st.results.training) return;
  const TrainingResult& t = *st.results.training;
  LiteratureResult out;
  const Published& relu = kShazeer2020[0];
  for (const Published& p : kShazeer2020) {
    const VariantOutcome* here = t.find(p.variant);
    if (!here) continue;
    LiteratureRow row;
    row.variant = p.variant;
    row.shazeer_65k = p.at_65k;
    row.shazeer_65k_std = p.std_65k;
    row.shazeer_524k = p.at_524k;
    row.shazeer_diff_65k = p.at_65k - relu.at_65k;
    row.shazeer_diff_524k = p.at_524k - relu.at_524k;
    row.shazeer = row.shazeer_diff_65k < 0 && row.shazeer_diff_524k < 0   ? Direction::better
                  : row.shazeer_diff_65k > 0 && row.shazeer_diff_524k > 0 ? Direction::worse
                                                                          : Direction::mixed;
    row.here = *here;
    const bool decided = here->verdict == Verdict::better || here->verdict == Verdict::worse;
    if (row.variant == "relu")
      row.agreement = Agreement::agrees;  // the reference on both sides
    else if (row.shazeer == Direction::mixed)
      row.agreement = Agreement::mixed_there;
    else if (!decided)
      row.agreement = Agreement::undecided_here;
    else
      row.agreement = (here->verdict == Verdict::better) == (row.shazeer == Direction::better)
                          ? Agreement::agrees
                          : Agreement::disagrees;
    out.rows.push_back(std::move(row));
  }
  if (out.rows.size() < 2) return;  // ReLU alone: nothing to compare
  st.results.literature = std::move(out);
}

json literature_json(const Results& res) {
  return json_if(res.literature, [](const LiteratureResult& l) {
    json out;
    out["source"] =
        "Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202, Table 1 (T5-base on "
        "C4, held-out log-perplexity)";
    for (const LiteratureRow& r : l.rows)
      out["variants"][r.variant] = {
          {"shazeer_65536_steps", r.shazeer_65k},
          {"shazeer_65536_steps_std", r.shazeer_65k_std},
          {"shazeer_524288_steps", r.shazeer_524k},
          {"shazeer_minus_relu", {r.shazeer_diff_65k, r.shazeer_diff_524k}},
          {"shazeer_direction", direction_text(r.shazeer)},
          {"verdict_here", r.here ? json(verdict_text(r.here->verdict)) : json(nullptr)},
          {"agreement", agreement_text(r.agreement)}};
    return out;
  });
}

std::string literature_markdown(const Study& st, const Sections& sec) {
  if (!st.results.literature) return "";
  const LiteratureResult& l = *st.results.literature;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> agree, disagree, undecided;
  for (const LiteratureRow& r : l.rows) {
    const bool reference = r.variant == "relu";
    rows.push_back({r.variant, fmt::format("{:.3f} ({:.3f})", r.shazeer_65k, r.shazeer_65k_std),
                    fmt::format("{:.3f}", r.shazeer_524k),
                    reference ? "—"
                              : fmt::format("{:+.3f} / {:+.3f}: {}", r.shazeer_diff_65k,
                                            r.shazeer_diff_524k, direction_text(r.shazeer)),
                    reference                                  ? "reference"
                    : r.here->verdict == Verdict::inconclusive ? "undecided"
                                                               : verdict_text(r.here->verdict),
                    reference ? "—" : std::string(agreement_text(r.agreement))});
    if (reference) continue;
    (r.agreement == Agreement::agrees      ? agree
     : r.agreement == Agreement::disagrees ? disagree
                                           : undecided)
        .push_back(r.variant);
  }
  auto list = [](const std::vector<std::string>& v) {
    return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", "));
  };
  std::string md = fmt::format(
      "Shazeer (2020, \"GLU Variants Improve Transformer\", Table 1) compared the same variants "
      "at equal parameters (the GLU kinds at 2/3 of ReLU's d_ff, as here) in T5-base (d_model "
      "768, 12 + 12 layers, no biases, C4): held-out log-perplexity in nats per token after "
      "65,536 steps, with its run-to-run standard deviation, and after 524,288. The units "
      "differ from this run's bits/byte ({}); the directions compare. **Rule:** the paper says "
      "better (worse) when both its columns put the variant below (above) ReLU; this run agrees "
      "when its verdict goes the same way, disagrees when the other, and cannot tell when it is "
      "undecided or equivalent.\n\n",
      sec.ref("training"));
  md += markdown_table({"variant", "Shazeer, 65,536 steps (std)", "524,288 steps",
                        "there: variant − ReLU", "verdict here", "agreement"},
                       rows, "lrrlll");
  md += fmt::format(
      "\nAgrees: {}. Disagrees: {}. Cannot tell, or the paper's columns differ: {}. In the paper "
      "the GLU variants lie within 0.04 nats of each other, closer than most are to ReLU; "
      "which of them this run separates is in {}'s picks.\n\n"
      "Why the two may differ (hypotheses, not findings): this run measures the first {} steps "
      "of a small byte-level LM, the paper late training of a 220M-parameter model on subword "
      "tokens; one learning rate serves every variant here; the paper's models have no biases. "
      "`--steps` and `--seeds` test the first.\n\n",
      list(agree), list(disagree), list(undecided), sec.ref("recommendations"),
      st.results.training->train.steps);
  return md;
}

}  // namespace ffnlab::study
