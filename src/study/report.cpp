// The report's own stages: "summary" (every comparison with ReLU, first), "data" (the corpus),
// "zoo" (real models), "corrections" (of the FFN-evolution tutorial) and "recommendations" (four
// rules applied to the typed results of the stages before).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/study/zoo_table.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

// ---- summary ----

namespace {

// Rule 2's cap: a per-FLOP candidate's FFN does at most this many times ReLU's forward matrix
// FLOPs per token.
constexpr double kPerFlopCap = 1.05;

// A comparison's name for a reader who has not seen the sections yet.
std::string summary_name(std::string_view variant) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"relu", "ReLU FFN (the reference)"},
      {"gelu", "GELU FFN"},
      {"glu", "GLU (sigmoid gate)"},
      {"bilinear", "bilinear GLU (no activation)"},
      {"reglu", "ReGLU"},
      {"geglu", "GEGLU"},
      {"swiglu", "SwiGLU"},
      {"gated", "gated FFN (4 branches)"},
      {"moe", "MoE 8×top-2 at ReLU's parameters"},
      {"moe_compute", "MoE 8×top-2 at ReLU's compute"},
      {"moe_fine_shared", "MoE 16×top-3 + 1 shared at ReLU's compute"}};
  for (const auto& [key, name] : kNames)
    if (key == variant) return std::string(name);
  return std::string(variant);
}

struct SummaryRow {
  std::string label;
  std::int64_t params = 0;
  double forward_flops = 0;  // NaN: not costed in this run
  const VariantOutcome* outcome = nullptr;
};

// Every comparison with ReLU, ReLU first: the training stage's dense variants, then the MoE
// rows of the moe_axes stage (at equal parameters and at equal compute), or the training
// stage's MoE when that stage did not run.
std::vector<SummaryRow> summary_rows(const Results& r) {
  std::vector<SummaryRow> rows;
  const auto flops_of = [&](std::string_view name) -> double {
    if (r.moe_axes)
      for (const auto& p : r.moe_axes->pareto)
        if (p.name == name) return p.forward_flops;
    // A run without the MoE stages: the study's LM with this FFN, costed as that stage costs it.
    LMConfig m = r.training->model;
    m.ffn = study_ffn(std::string(name), m.d_model);
    return transformer_cost(m, r.training->train.seq, true).forward_flops;
  };
  for (const VariantOutcome& o : r.training->variants) {
    if (o.variant == "moe" && r.moe_axes) continue;  // with the MoE rows below
    rows.push_back({o.variant, o.params, flops_of(o.variant), &o});
  }
  if (r.moe_axes)
    for (const MoEAxisRow& a : r.moe_axes->rows)
      if (a.name != "relu") rows.push_back({a.name, a.params, a.forward_flops, &a.outcome});
  return rows;
}

// The verdict, marked † when it holds only at 5 % for itself and ‡ when its interval is narrow
// by chance (both defined below the summary's table).
std::string verdict_words(const VariantOutcome& o, double margin) {
  const bool decided = o.verdict == Verdict::better || o.verdict == Verdict::worse ||
                       o.verdict == Verdict::equivalent;
  std::string marks;
  if (decided && o.sequential_seeds > 0 && !o.holds_for_all_comparisons) marks += "†";
  if (decided && o.narrow_by_chance) marks += "‡";
  switch (o.verdict) {
    case Verdict::reference:
      return "the reference";
    case Verdict::better:
      return "**better**" + marks;
    case Verdict::worse:
      return "worse" + marks;
    case Verdict::equivalent:
      return fmt::format("equivalent (within ±{}){}", margin, marks);
    case Verdict::one_seed:
      return "one seed: no verdict";
    default:
      return fmt::format("undecided at {} seeds", o.val_bits_per_byte.size());
  }
}

}  // namespace

std::string summary_markdown(const Study& st, const Sections& sec) {
  const Results& r = st.results;
  if (!r.training) return "";
  const TrainingResult& t = *r.training;
  const std::vector<SummaryRow> rows = summary_rows(r);
  const double relu_flops = rows.front().forward_flops;
  // The sentence: the best at equal parameters, the other comparisons by verdict.
  std::vector<std::string> better, worse, equivalent, undecided;
  for (const SummaryRow& row : rows) {
    const VariantOutcome& o = *row.outcome;
    // (Three decimals; four where a difference that is not 0 would read as 0.000.)
    const std::string what =
        o.diff_mean != 0 && std::abs(o.diff_mean) < 0.0005
            ? fmt::format("{} ({:+.4f})", summary_name(row.label), o.diff_mean)
            : fmt::format("{} ({:+.3f})", summary_name(row.label), o.diff_mean);
    // (The sentence joins names with "; " and ", ": the names hold neither.)
    if (o.verdict == Verdict::better) better.push_back(what);
    if (o.verdict == Verdict::worse) worse.push_back(summary_name(row.label));
    if (o.verdict == Verdict::equivalent) equivalent.push_back(summary_name(row.label));
    if (o.verdict == Verdict::inconclusive || o.verdict == Verdict::one_seed)
      undecided.push_back(summary_name(row.label));
  }
  std::string sentence =
      better.empty()
          ? "No FFN of this run is measurably better than ReLU's"
          : fmt::format("Measurably better than ReLU's FFN in validation bits per byte: {}",
                        fmt::join(better, "; "));
  if (!equivalent.empty())
    sentence +=
        fmt::format("; as good as ReLU within ±{}: {}", t.margin, fmt::join(equivalent, ", "));
  if (!worse.empty()) sentence += fmt::format("; worse: {}", fmt::join(worse, ", "));
  if (!undecided.empty())
    sentence += fmt::format("; not decided by these seeds: {}", fmt::join(undecided, ", "));
  std::string md = fmt::format(
      "**{}.** A negative difference is better: fewer bits per byte on held-out text.{}\n\n",
      sentence,
      st.options.quick ? " (A --quick run: its models are too small to say anything.)" : "");

  std::vector<std::vector<std::string>> table;
  for (const SummaryRow& row : rows) {
    const VariantOutcome& o = *row.outcome;
    const bool reference = o.verdict == Verdict::reference;
    table.push_back(
        {summary_name(row.label), thousands(row.params),
         std::isnan(row.forward_flops) || std::isnan(relu_flops)
             ? "—"
             : fmt::format("{:.2f}×", row.forward_flops / relu_flops),
         reference ? fmt::format("{} (its mean)", fixed(o.mean, 3)) : difference_cell(o),
         std::to_string(o.val_bits_per_byte.size()), verdict_words(o, t.margin)});
  }
  md += markdown_table({"FFN", "LM parameters", "whole LM's forward FLOPs per token (÷ ReLU's)",
                        "bits/byte − ReLU's [interval]", "seeds", "verdict"},
                       table, "lrrrrl");
  md += fmt::format(
      "\nEach row is a byte-level language model ({} layers, d_model {}) with that FFN, trained {} "
      "steps on the same text ({}). The terms:\n\n"
      "- **Paired**: seed s gives every model the same batches and initial weights but the FFN's, "
      "so each difference is taken seed by seed, and the seeds' luck cancels.\n"
      "- **Interval**: where the true difference lies, at an error of 5 % over the whole "
      "comparison; below 0 is better than ReLU, above 0 worse, within ±{} equivalent.\n"
      "- **Seeds, the looks and the cap**: each comparison trains {}, then looks; while "
      "undecided it trains one more and looks again, up to {} (the cap). The rule was fixed "
      "before the run; the appendix gives it whole.\n"
      "- **†**: the verdict holds at 5 % for itself, not with the 5 % shared over the run's {}, "
      "so one of the marked verdicts may be wrong by chance. **‡**: its "
      "seeds agree far more closely than the run's other comparisons do: its interval may be "
      "narrower than its precision.\n\n{}",
      t.model.layers, t.model.d_model, t.train.steps, sec.ref("training"), t.margin,
      counted(t.design.first, "seed"), t.design.cap, counted(t.comparisons, "comparison"),
      r.recommendations && r.recommendations->best_at_equal_parameters
          ? fmt::format("The recommendations ({}) read this table for each situation.\n\n",
                        sec.ref("recommendations"))
          : "");
  return md;
}

// ---- data ----

json data_json(const Results& res) {
  return json_if(res.data, [](const DataResult& d) {
    return json{{"source", d.source},
                {"files", d.files},
                {"bytes", d.bytes},
                {"fingerprint", d.fingerprint},
                {"validation_bytes", d.validation_bytes}};
  });
}

std::string data_markdown(const Study& st, const Sections&) {
  if (!st.results.data) return "";
  const DataResult& d = *st.results.data;
  return std::string(kDetails) + fmt::format(
                                     "The corpus: `{}`: {}, {} bytes, fingerprint `{}`. "
                                     "Byte-level tokens (vocabulary 256); the "
                                     "last {:g} % of the bytes ({}) are the validation part.\n\n",
                                     d.source, counted(d.files, "file"), thousands(d.bytes),
                                     d.fingerprint, 100 * kDefaultValFraction,
                                     thousands(d.validation_bytes));
}

// ---- real models ----

void run_zoo(Study& st) {
  st.results.zoo = true;
}

json zoo_json(const Results& r) {
  return r.zoo ? json(zoo_table_json()) : json(nullptr);
}

std::string zoo_markdown(const Study& st, const Sections&) {
  if (!st.results.zoo) return "";
  // A reference table, not a finding: the report says what it holds, and its appendix prints it
  // (`ffnlab zoo`'s table; results.json's "zoo") with the source of each row.
  const std::vector<std::string> header = zoo_table_header();
  const std::vector<std::vector<std::string>> rows = zoo_table_rows();
  std::string md = fmt::format(
      "The FFN of {} well-known models, from BERT and GPT-2 to Mixtral and DeepSeek-V3, costed "
      "by ffnlab the same way as the variants above: each one's kind, activation, widths, "
      "experts, one layer's parameters, active parameters and forward FLOPs per token. BERT, "
      "GPT-2 and GPT-3 have a plain GELU FFN and T5 v1.1 a GEGLU; the dense models from PaLM "
      "(2022) on, of 7B parameters and more, SwiGLU. Of the MoE models, Switch has plain ReLU "
      "experts and GLaM is costed with plain GELU ones (its paper does not name them); Mixtral, "
      "Qwen1.5-MoE and DeepSeek-V3 have SwiGLU experts. The appendix prints the table with the "
      "source of every row (the paper's section or the "
      "published config.json); `ffnlab zoo` prints it too, and results.json holds it "
      "(\"zoo\").\n",
      rows.size());
  std::vector<std::string> long_header(header.begin(), header.end() - 1);
  std::vector<std::vector<std::string>> long_rows;
  std::string sources;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    long_rows.emplace_back(rows[r].begin(), rows[r].end() - 1);
    long_rows.back().push_back(fmt::format("[{}]", r + 1));
    sources += fmt::format("{}. {}\n", r + 1, rows[r].back());
  }
  long_header.push_back("source");
  md += std::string(kDetails) + "The real models' FFNs, one layer each (an MoE's d_ff is one " +
        "expert's; FLOPs per token forward, matrix and elementwise; parameters include biases " +
        "where the model has them), with their sources.\n\n" +
        markdown_table(long_header, long_rows, "llrrrlrrrrrl") + "\n" + sources;
  return md;
}

// ---- corrections ----

namespace {

// The brief as a sentence: a full stop, unless it ends in one (a quotation's).
std::string sentence(const std::string& brief) {
  const bool stopped = brief.ends_with(".") || brief.ends_with(".\"");
  return stopped ? brief : brief + ".";
}

}  // namespace

void run_corrections(Study& st) {
  const Results& r = st.results;
  const Sections sec(stages());
  const FFNConfig relu = variant_config("relu", 512, 2048, true);
  const FFNConfig moe = variant_config("moe", 512, 2048, true);
  const FFNCost kr = ffn_cost(relu, 8), km = ffn_cost(moe, 8);
  const double MiB = 1024.0 * 1024.0;
  std::string dead = "not measured in this run";
  std::string dead_brief =
      "ReLU's \"about 50 % dead neurons\" is the share of exactly-zero hidden values, no count "
      "of dead units (not measured in this run)";
  if (const auto* layers = r.sparsity ? r.sparsity->find("relu") : nullptr) {
    double zi = 0;
    std::int64_t dead_units = 0, units = 0;
    for (const LayerSparsity& l : *layers) {
      zi += l.zero_init / static_cast<double>(layers->size());
      dead_units += l.dead_trained;
      units += l.units;
    }
    dead_brief = fmt::format(
        "ReLU's \"about 50 % dead neurons\" is the share of exactly-zero hidden values ({} at "
        "initialisation); after training {} of its {} hidden units are dead ({})",
        percent(zi), dead_units, units, sec.ref("sparsity"));
    dead = fmt::format(
        "the tutorial's number is the exactly-zero fraction of the hidden values, which is no "
        "count of dead units: ReLU's hidden values are zero {} of the time at initialisation, "
        "yet after training {} of its {} hidden units ({} layers of {}) are dead (zero on every "
        "census token) — {}; the smooth gates have no exact zeros at all, so GELU's ~0 % dead is "
        "true by definition{}, and MoE's 75 % is the experts a token skips by design",
        percent(zi), dead_units, units, layers->size(), layers->empty() ? 0 : layers->front().units,
        sec.ref("sparsity"), [&]() -> std::string {
          const auto* gelu = r.sparsity->find("gelu");
          if (!gelu) return "";
          std::int64_t near = 0, all = 0;
          for (const LayerSparsity& l : *gelu) near += l.near_dead_trained, all += l.units;
          return fmt::format(" (near zero, |h| < {}·rms, on every census token: {} of its {})",
                             kNearZeroRelative, near, all);
        }());
  }
  // Correction 14: the tutorial's gradient table (001: std of the gradient norm over its 100
  // iterations, "lower is more stable") against its prose, and this run's toy on the same
  // configuration (seed 42, the tutorial's own).
  std::string stability_brief =
      "\"GELU's gradient flow is the most stable\": the tutorial's own gradient table ranks "
      "GLU's lower";
  std::string stability =
      "the tutorial's own gradient table contradicts the prose by its own rule (lower standard "
      "deviation of the gradient norm, more stable): GLU's 0.0933 is below GELU's 0.1010, and "
      "Gated-FFN's 0.1741 is the second highest of the five, below only MoE's 0.2411 (the table "
      "rates it \"poor\"). ";
  if (!r.toy || r.toy->variants.empty()) {
    stability += fmt::format(
        "This run did not run the toy; it states only what its runs measured ({}, with spreads)",
        sec.ref("training"));
  } else {
    const auto& tv = r.toy->variants;
    auto by_std = [](const ToyVariant& a, const ToyVariant& b) {
      return a.first_seed.grad_std < b.first_seed.grad_std;
    };
    const ToyVariant& lowest = *std::min_element(tv.begin(), tv.end(), by_std);
    // Gated's place from the top (1: the highest), as the tutorial's table has it second.
    std::string gated = "the toy did not run gated";
    for (const ToyVariant& g : tv) {
      if (g.variant != "gated") continue;
      const auto rank = 1 + std::count_if(tv.begin(), tv.end(),
                                          [&](const ToyVariant& v) { return by_std(g, v); });
      const std::string place = rank == 1   ? ""
                                : rank == 2 ? "second "
                                : rank == 3 ? "third "
                                            : fmt::format("{}th ", rank);
      gated = fmt::format("gated's is the {}highest of the {}{}", place, tv.size(),
                          rank == 2 ? ", as in the table" : "");
    }
    stability_brief += fmt::format("; this run's toy ranks {}'s lowest", lowest.variant);
    std::string stds;
    for (const ToyVariant& v : tv)
      stds += fmt::format("{}{} {}", stds.empty() ? "" : ", ", v.variant,
                          fixed(v.first_seed.grad_std, 4));
    stability += fmt::format(
        "This run's toy on the tutorial's configuration ({}, seed 42) measures the same standard "
        "deviation: "
        "{}. {}; {}. Beyond that toy, this report states only what its runs measured ({}, with "
        "spreads)",
        sec.ref("toy"), stds,
        lowest.variant == "gelu"
            ? "Here GELU's is the lowest, as the prose says and the tutorial's table does not"
            : fmt::format("The lowest is {}'s, not GELU's: the run agrees with the table, not "
                          "the prose",
                          lowest.variant),
        gated, sec.ref("training"));
  }
  const double silu_min = r.sparsity ? r.sparsity->silu_min : NAN;
  const double moe_over_expert = r.costs ? r.costs->moe_forward_matmul_over_one_expert() : NAN;
  st.results.corrections = std::vector<Correction>{
      {"1",
       fmt::format("Linear(512, 2048) has {} parameters, not 2,097,152",
                   thousands(512 * 2048 + 2048)),
       "Linear(512, 2048) has \"512 × 2048 × 2 = 2,097,152\" parameters",
       fmt::format("{} weights + {} biases = {}", thousands(512 * 2048), thousands(2048),
                   thousands(512 * 2048 + 2048))},
      {"2",
       fmt::format("An activation costs one operation per hidden value ({} elementwise "
                   "operations a token in ReLU's forward), not 2·d_model·d_ff FLOPs",
                   thousands(static_cast<std::int64_t>(kr.forward.elementwise))),
       "an activation costs 2·d_model·d_ff FLOPs",
       fmt::format("one operation per hidden value: ReLU's forward elementwise work is {} "
                   "operations per token (activation {} + biases), against {} matrix FLOPs",
                   thousands(static_cast<std::int64_t>(kr.forward.elementwise)), 2048,
                   thousands(static_cast<std::int64_t>(kr.forward.matmul)))},
      {"3",
       fmt::format("Top-2 MoE does about 2× ReLU's forward matrix FLOPs ({}× one expert's), "
                   "not 0.25× nor +25 %; its \"efficiency ×32\" measures nothing",
                   fixed(moe_over_expert, 3)),
       "top-2 MoE against ReLU: FLOPs \"0.25x\", parameters \"8.0x\", \"efficiency\" "
       "(parameters ÷ FLOPs) \"32.0\"; \"parameters ×8, compute only +25 %, efficiency ×32!\"",
       fmt::format("its experts are ReLU FFNs of the same size, and a token runs 2 of them: "
                   "forward matrix FLOPs are {}× one expert's, about 2× ReLU's (not 0.25×, nor "
                   "+25 %); 25 % is the share of expert parameters a token touches (here {} of "
                   "all parameters with the router); parameters ÷ FLOPs would be 4, and is no "
                   "efficiency: it grows with weights a token does not use and says nothing of "
                   "quality",
                   fixed(moe_over_expert, 3),
                   percent(static_cast<double>(km.active_params) / km.params))},
      {"4",
       fmt::format("MoE's training forward saves {}× ReLU's activations, not less",
                   fixed(km.f32.activations / kr.f32.activations, 2)),
       "MoE saves activation memory",
       fmt::format("a training forward saves {} KiB for 8 tokens against ReLU's {} KiB ({}×)",
                   fixed(km.f32.activations / 1024, 1), fixed(kr.f32.activations / 1024, 1),
                   fixed(km.f32.activations / kr.f32.activations, 2))},
      {"5", dead_brief,
       "ReLU \"produces about 50 % dead neurons\" (its figure's dead-neuron demonstration; the "
       "dead-neuron table: ReLU ~49.96 %, GELU ~0 %, GLU ~25 %, gated ~20–30 %, MoE ~75 %)",
       dead},
      {"6", "LLaMA uses SwiGLU, not GELU; GPT-2 1.5B has 48 layers, not 12",
       "the real-model table: LLaMA-7B and LLaMA-70B use \"GELU\"; GPT-2 is \"1.5B\" with "
       "\"12\" layers",
       "LLaMA uses SwiGLU (LLaMA-7B: d_ff 11008 for d_model 4096; Hugging Face config.json: "
       "hidden_act silu, intermediate_size 11008); GPT-2 1.5B (gpt2-xl) has 48 layers of "
       "d_model 1600 (n_layer 48, n_embd 1600); 12 layers is GPT-2 124M"},
      {"7", "Mistral's MLP returns down_proj(silu(gate_proj(x)) · up_proj(x)), not down · up",
       "Mistral's MLP returns down · up",
       "it returns down_proj(silu(gate_proj(x)) · up_proj(x)); ffnlab's swiglu matches PyTorch "
       "to f32 rounding in the golden tests (tests/parity)"},
      {"8",
       "The tutorial's Transformer block attends across the batch and has no residual or norm "
       "around attention",
       "the Transformer block `x = self.self_attn(x, x, x)[0]; x = self.ff(x)`: no residual or "
       "norm around attention (the FFN has both, after it), and nn.MultiheadAttention (which "
       "takes (seq, batch, d) unless batch_first) given x of (batch, seq, d) = (64, 100, 512)",
       "that block attends across the batch, not along the sequence, and its attention output "
       "replaces x; ffnlab's block has a residual and a norm around both attention and FFN (pre- "
       "or post-norm), and its attention takes [batch, seq, d] and attends within each "
       "sequence"},
      {"9",
       fmt::format("The toy run memorises 8 random vectors: it ranks no FFN ({} does)",
                   sec.ref("training")),
       "the toy run shows which FFN trains best",
       fmt::format("it memorises 8 random vectors; {} trains each FFN as a language model on "
                   "real text over paired seeds",
                   sec.ref("training"))},
      {"10",
       fmt::format("ReLU's FP32 training memory is {} MiB by the tutorial's own definition, "
                   "not ~10–12 MB",
                   fixed(kr.f32.total() / MiB, 2)),
       "ReLU's FP32 training memory is ~10–12 MB, activations 2–4 MB",
       fmt::format("by the tutorial's own definition: weights {} + gradients {} + Adam {} MiB + "
                   "activations {} MiB for 8 tokens = {} MiB",
                   fixed(kr.f32.weights / MiB, 2), fixed(kr.f32.grads / MiB, 2),
                   fixed(kr.f32.adam / MiB, 2), fixed(kr.f32.activations / MiB, 3),
                   fixed(kr.f32.total() / MiB, 2))},
      {"11",
       "A 1000B MoE with 8000 experts and top-16 runs 2B expert parameters a token, not 200B: "
       "some 500× fewer FLOPs than dense, not 5×",
       "a 1000B-parameter MoE with 8000 experts and top-16 routing: \"compute: only 200B worth "
       "of FLOPs (1000 × 16/8000)\", \"inference cost 5× lower\"",
       "1000 × 16/8000 = 2, not 200: a token touches 2B expert parameters (plus attention and "
       "any shared layers), about 4 GFLOPs of expert products forward against the dense 1000B's "
       "2 TFLOPs, some 500× fewer, not 5×"},
      {"12",
       "LLaMA-7B's d_ff/d_model is 2.69, not 5.33; the 1.6T model is Switch-C; and the ratio is "
       "no constant (3.5 in Mixtral's experts, 0.29 in DeepSeek-V3's)",
       "LLaMA-7B and LLaMA-70B at d_ff/d_model \"5.33x\"; \"Switch-L, 1.6T, 32 layers, MoE "
       "(Top-1), 4x × 128 experts\"; \"GELU FFN rules models below 100B\"; \"the FFN "
       "expansion ratio is basically fixed at 4–5x\"",
       "LLaMA-7B: d_ff 11008 for d_model 4096, ratio 2.69; LLaMA-2-70B: 28672 for 8192, 3.5 (a "
       "SwiGLU FFN is narrower than 4× to hold 4×'s parameters); the 1.6T model is Switch-C, "
       "2048 experts, top-1 (Fedus et al. 2021, table 9); below 100B, LLaMA and Mistral use "
       "SwiGLU, not GELU; and the ratio is no constant: 3.5 in Mixtral's experts, 0.29 in "
       "DeepSeek-V3's (2048 for d_model 7168)"},
      {"13", "Switch Transformers is by Fedus, Zoph and Shazeer (2021), not \"Lewis et al.\"",
       "Switch Transformers by \"Lewis et al.\"",
       "by Fedus, Zoph and Shazeer (2021), arXiv:2101.03961"},
      {"14", stability_brief,
       "training-dynamics prose: \"GELU's gradient flow is the most stable (lowest standard "
       "deviation, 0.1010)\"; \"GLU and Gated-FFN have the most stable gradient flow\"",
       stability},
      {"15", "LayerNorm normalises each token over its features, not over the batch",
       "the LayerNorm example normalises over the batch",
       "LayerNorm normalises each token over its d_model features (ops/norm.hpp, checked "
       "against torch.nn.LayerNorm)"},
      {"16",
       std::isnan(silu_min)
           ? std::string("In SwiGLU the Swish branch is the gate, and Swish is no (0, 1) gate: "
                         "unbounded above, negative below 0")
           : fmt::format("In SwiGLU the Swish branch is the gate, and Swish is no (0, 1) gate: "
                         "its minimum is {:.4f}",
                         silu_min),
       "SwiGLU: xW gives values, Swish(xV) a gate in (0, 1)",
       fmt::format("SwiGLU is (Swish(xW) ⊙ xV)W₂: the Swish branch is the gate, and Swish is "
                   "no (0, 1) gate: unbounded above, and negative below 0{}",
                   std::isnan(silu_min)
                       ? std::string(" (its minimum is not measured in this run)")
                       : fmt::format(", with a minimum, measured here, of {:.4f}", silu_min))},
  };
}

json corrections_json(const Results& r) {
  return json_if(r.corrections, [](const std::vector<Correction>& rows) {
    json out = json::array();
    for (const Correction& c : rows)
      out.push_back({{"id", c.id}, {"brief", c.brief}, {"claim", c.claim}, {"finding", c.finding}});
    return out;
  });
}

std::string corrections_markdown(const Study& st, const Sections&) {
  if (!st.results.corrections) return "";
  std::vector<std::vector<std::string>> rows;
  std::string md =
      "What the FFN-evolution tutorial (the PyTorch notebook this study follows) gets wrong, one "
      "line each; the appendix quotes each claim beside its evidence.\n\n";
  for (const Correction& c : *st.results.corrections) {
    md += fmt::format("{}. {}\n", c.id, sentence(c.brief));
    rows.push_back({c.id, c.claim, c.finding});
  }
  md += kDetails;
  md += markdown_table({"#", "the tutorial says", "this run"}, rows, "rll");
  return md + "\n";
}

// ---- recommendations ----

namespace {

// a − b by seed, over the seeds both trained.
std::vector<double> shared_differences(const VariantOutcome& a, const VariantOutcome& b) {
  std::vector<double> diff;
  for (std::size_t i = 0; i < a.val_bits_per_byte.size() && i < b.val_bits_per_byte.size(); ++i)
    diff.push_back(a.val_bits_per_byte[i] - b.val_bits_per_byte[i]);
  return diff;
}

// Of the candidates, the one with the lowest validation and those these seeds cannot
// separate from it: a candidate is separated when its paired difference to the lowest
// (candidate − lowest, by seed) has a 95 % interval above 0. The lowest is the lowest paired
// difference to ReLU, or a candidate measurably lower than it on the seeds both trained. The
// lowest first; empty for none.
std::vector<const VariantOutcome*> lowest_and_ties(const std::vector<const VariantOutcome*>& c,
                                                   double margin) {
  if (c.empty()) return {};
  // By the paired difference to ReLU: under the sequential rule the variants train different
  // numbers of seeds, and means over different seeds are not comparable.
  const VariantOutcome* lowest = *std::min_element(
      c.begin(), c.end(), [](const auto* a, const auto* b) { return a->diff_mean < b->diff_mean; });
  // A candidate measurably lower than it on the seeds both trained (the interval below 0: one
  // stopped early on lucky seeds can have the lower mean over its own) takes its place, the
  // lowest of them by that difference first. (Pairs over different seeds could form a cycle:
  // the search then ends at the last candidate it reached, and the one lower than that is named
  // beside it, as a tie.)
  std::vector<const VariantOutcome*> reached{lowest};
  for (;;) {
    const VariantOutcome* lower = nullptr;
    double lower_by = 0;
    for (const VariantOutcome* o : c) {
      if (o == lowest) continue;
      const PairedComparison p = compare_paired(shared_differences(*o, *lowest), margin);
      if (p.verdict == Comparison::better && (lower == nullptr || p.ci95.mean < lower_by))
        lower = o, lower_by = p.ci95.mean;
    }
    if (lower == nullptr || std::find(reached.begin(), reached.end(), lower) != reached.end())
      break;
    reached.push_back(lowest = lower);
  }
  std::vector<const VariantOutcome*> out{lowest};
  for (const VariantOutcome* o : c)
    if (o != lowest &&
        compare_paired(shared_differences(*o, *lowest), margin).verdict != Comparison::worse)
      out.push_back(o);
  return out;
}

std::vector<std::string> names_after_first(const std::vector<const VariantOutcome*>& v) {
  std::vector<std::string> out;
  for (std::size_t i = 1; i < v.size(); ++i) out.push_back(v[i]->variant);
  return out;
}

// "fine-grained, 16 experts, top-3, 1 shared" of a moe_axes row's "equal active compute: ...".
std::string design_of(std::string_view description) {
  constexpr std::string_view kPrefix = "equal active compute: ";
  if (description.substr(0, kPrefix.size()) == kPrefix) description.remove_prefix(kPrefix.size());
  return std::string(description);
}

}  // namespace

void run_recommendations(Study& st) {
  const Results& r = st.results;
  if (!r.training) return;
  Recommendations out;
  const TrainingResult& t = *r.training;
  // Rule 1: among the variants measurably better than ReLU, the lowest paired difference, and
  // those these seeds cannot separate from it.
  std::vector<const VariantOutcome*> better;
  for (const VariantOutcome& o : t.variants) {
    if (o.verdict == Verdict::reference) continue;
    if (out.lowest.empty() || o.diff_mean < out.lowest_difference)
      out.lowest_difference = o.diff_mean, out.lowest = o.variant;
    if (o.verdict == Verdict::better) better.push_back(&o);
  }
  if (const auto best = lowest_and_ties(better, t.margin); !best.empty()) {
    out.best_at_equal_parameters = best.front()->variant;
    out.best_bits_per_byte = best.front()->mean;
    out.best_at_equal_parameters_tied = names_after_first(best);
  }
  // Rule 2: per FLOP — among every trained variant whose FFN does at most 1.05× ReLU's forward
  // matrix FLOPs per token (the training stage's and MoE at equal compute), the lowest
  // validation, and those these seeds cannot separate from it.
  const CostRow* relu_cost = r.costs ? r.costs->study_row("relu") : nullptr;
  std::vector<const VariantOutcome*> all;  // every trained comparison, ReLU first
  std::vector<double> all_flops;           // its FFN's forward matrix FLOPs per token
  for (const VariantOutcome& o : t.variants)
    if (const CostRow* c = r.costs ? r.costs->study_row(o.variant) : nullptr) {
      all.push_back(&o);
      all_flops.push_back(ffn_cost(c->config, 1).forward.matmul);
    }
  if (r.moe_axes)
    for (const MoEAxisRow& row : r.moe_axes->rows)
      if (row.name != "relu" && row.name != "moe") {
        all.push_back(&row.outcome);
        all_flops.push_back(ffn_cost(row.ffn, 1).forward.matmul);
      }
  if (relu_cost) {
    const double relu_flops = ffn_cost(relu_cost->config, 1).forward.matmul;
    std::vector<const VariantOutcome*> cheap;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const double ratio = all_flops[i] / relu_flops;
      out.flops_over_relu.emplace_back(all[i]->variant, ratio);
      if (ratio <= kPerFlopCap) cheap.push_back(all[i]);
    }
    if (const auto best = lowest_and_ties(cheap, t.margin); !best.empty()) {
      out.best_per_flop = best.front()->variant;
      out.best_per_flop_bits_per_byte = best.front()->mean;
      out.best_per_flop_tied = names_after_first(best);
    }
  }
  // Rule 3: per second — among ReLU and the variants shown to be better than or equivalent to
  // it (never merely "not shown worse"), the highest tokens/s, decided only when no candidate's
  // throughput is noisy (ReLU's included) and the pick's lowest ratio to ReLU's run of the same
  // seed is above every other candidate's highest: otherwise undecided.
  std::vector<const VariantOutcome*> qualifying;
  for (const VariantOutcome* o : all)
    if (o->verdict == Verdict::reference || o->verdict == Verdict::better ||
        o->verdict == Verdict::equivalent)
      qualifying.push_back(o);
  for (const VariantOutcome* o : qualifying)
    if (o->tokens_per_second_noisy) out.noisy_throughput.push_back(o->variant);
  if (!qualifying.empty()) {
    // The fastest by its median ratio; decided only when its slowest seed beat every other
    // candidate's fastest (ReLU: 1), so that the pick never rests on one statistic's noise.
    const VariantOutcome* fastest =
        *std::max_element(qualifying.begin(), qualifying.end(), [](const auto* a, const auto* b) {
          return a->tokens_per_second_over_relu < b->tokens_per_second_over_relu;
        });
    std::vector<std::string> overlapping;
    for (const VariantOutcome* o : qualifying)
      if (o != fastest && o->tokens_per_second_ratio_high >= fastest->tokens_per_second_ratio_low)
        overlapping.push_back(o->variant);
    out.per_second_overlapping = overlapping;
    if (out.noisy_throughput.empty() && overlapping.empty()) {
      out.best_per_second = fastest->variant;
      out.best_per_second_tokens = fastest->tokens_per_second;
      out.best_per_second_over_relu = fastest->tokens_per_second_over_relu;
    } else {
      out.per_second_candidate = fastest->variant;
    }
  }
  // Rule 4: when MoE pays off.
  const VariantOutcome* moe = t.find("moe");
  const VariantOutcome* relu = t.find("relu");
  const CostRow* moe_cost = r.costs ? r.costs->study_row("moe") : nullptr;
  if (moe && relu && moe_cost) {
    using Finding = Recommendations::MoE::Finding;
    Recommendations::MoE m;
    m.active_fraction = static_cast<double>(moe_cost->cost.active_params) /
                        static_cast<double>(moe_cost->cost.params);
    m.tokens_per_second = moe->tokens_per_second;
    m.over_relu = moe->tokens_per_second_over_relu;
    m.noisy = moe->tokens_per_second_noisy;
    m.relu_tokens_per_second = relu->tokens_per_second;
    m.diff_mean = moe->diff_mean;
    m.diff_low = moe->diff_low;
    m.diff_high = moe->diff_high;
    m.margin = t.margin;
    m.verdict = moe->verdict;
    switch (m.verdict) {
      case Verdict::better:
        m.finding = Finding::pays_off;
        break;
      case Verdict::equivalent:  // decided by throughput: not noisy, and every seed's ratio to
                                 // ReLU's run on the same side of 1
        m.finding = m.noisy                                   ? Finding::undecided
                    : moe->tokens_per_second_ratio_low > 1.0  ? Finding::pays_off_on_cost
                    : moe->tokens_per_second_ratio_high < 1.0 ? Finding::does_not_pay_off
                                                              : Finding::undecided;
        break;
      case Verdict::worse:
        m.finding = Finding::does_not_pay_off;
        break;
      default:
        m.finding = Finding::undecided;
    }
    const MoEAxisRow* relu_row = r.moe_axes ? r.moe_axes->find("relu") : nullptr;
    if (relu_row && relu_row->params > 0)
      if (const MoEAxisRow* c = r.moe_axes->find(kHeadlineMoE)) {
        m.at_equal_compute = c->outcome;
        m.at_equal_compute_design = design_of(c->description);
        m.compute_params_over_relu =
            static_cast<double>(c->params) / static_cast<double>(relu_row->params);
        for (const MoEAxisRow& other : r.moe_axes->rows)
          if (other.name != kHeadlineMoE && other.name != "relu" && other.name != "moe") {
            m.at_equal_compute_other = other.outcome;
            m.at_equal_compute_other_design = design_of(other.description);
          }
      }
    out.moe = m;
  }
  st.results.recommendations = std::move(out);
}

json recommendations_json(const Results& r) {
  return json_if(r.recommendations, [](const Recommendations& c) {
    json out{{"best_at_equal_parameters",
              c.best_at_equal_parameters ? json(*c.best_at_equal_parameters) : json(nullptr)},
             {"best_at_equal_parameters_tied", c.best_at_equal_parameters_tied}};
    if (c.best_per_flop) {
      out["best_per_flop"] = *c.best_per_flop;
      out["best_per_flop_tied"] = c.best_per_flop_tied;
    }
    out["best_per_second"] = c.best_per_second.empty() ? json(nullptr) : json(c.best_per_second);
    if (c.moe) {  // true, false, or null when undecided (inconclusive, or decided by noise)
      using Finding = Recommendations::MoE::Finding;
      const Finding f = c.moe->finding;
      out["moe_pays_off"] =
          f == Finding::undecided ? json(nullptr) : json(f != Finding::does_not_pay_off);
      if (c.moe->at_equal_compute) {
        out["moe_at_equal_compute"] = verdict_text(c.moe->at_equal_compute->verdict);
        out["moe_at_equal_compute_design"] = c.moe->at_equal_compute_design;
      }
      if (c.moe->at_equal_compute_other) {
        out["moe_at_equal_compute_other"] = verdict_text(c.moe->at_equal_compute_other->verdict);
        out["moe_at_equal_compute_other_design"] = c.moe->at_equal_compute_other_design;
      }
    }
    return out;
  });
}

std::string recommendations_markdown(const Study& st, const Sections& sec) {
  std::string md =
      "Each pick follows its rule, fixed before the run; the rules are numbered as "
      "the choices of " +
      sec.ref("evolution") + " cite them.\n\n";
  if (!st.results.recommendations) return md + "No LM training in this run: no recommendation.\n\n";
  const Recommendations& c = *st.results.recommendations;
  auto ties = [](const std::vector<std::string>& tied) {
    if (tied.empty()) return std::string(", separated from every other candidate");
    return fmt::format("; these seeds cannot separate it from {}", fmt::join(tied, ", "));
  };
  constexpr const char* kLowestRule =
      "the lowest mean paired difference to ReLU (or a candidate measurably lower than that one "
      "on the seeds both trained)";
  constexpr const char* kTieRule =
      "a candidate whose paired difference to the pick has a 95 % interval that includes 0 "
      "ties with it";
  if (!c.best_at_equal_parameters)
    md += fmt::format(
        "1. **Best validation at equal parameters:** none: no variant is measurably better than "
        "ReLU{}. *Rule:* of the variants better than ReLU, {}; {}.\n",
        c.lowest.empty() ? ""
                         : fmt::format(" (the lowest against ReLU: {}, {:+.4f} bits/byte)",
                                       c.lowest, c.lowest_difference),
        kLowestRule, kTieRule);
  else
    md += fmt::format(
        "1. **Best validation at equal parameters:** {} ({:.4f} bits/byte){}. *Rule:* of the "
        "variants better than ReLU, {}; {}.\n",
        *c.best_at_equal_parameters, c.best_bits_per_byte, ties(c.best_at_equal_parameters_tied),
        kLowestRule, kTieRule);
  if (c.best_per_flop) {
    std::string list;
    for (const auto& [v, ratio] : c.flops_over_relu)
      list += fmt::format("{}{} {:.2f}×{}", list.empty() ? "" : ", ", v, ratio,
                          ratio > kPerFlopCap ? " (over)" : "");
    md += fmt::format(
        "2. **Per FLOP:** {} ({:.4f} bits/byte){}. *Rule:* among every trained variant whose FFN "
        "does at most {}× ReLU's forward matrix FLOPs per token, whatever its verdict (MoE at "
        "equal compute too, its router's FLOPs counted: a small model's router can put it "
        "over), the lowest as in rule 1; ties as in rule 1. The FFN's matrix "
        "FLOPs, not the summary's whole LM: here {}.\n",
        *c.best_per_flop, c.best_per_flop_bits_per_byte, ties(c.best_per_flop_tied), kPerFlopCap,
        list);
  } else {
    md += "2. **Per FLOP:** no candidate in this run.\n";
  }
  constexpr const char* kPerSecondRule =
      "*Rule:* among ReLU and the variants better than or equivalent to it, the highest training "
      "tokens/s (median over seeds, ÷ ReLU's); decided only when no candidate's throughput is "
      "noisy and the pick was faster than every other candidate on every seed";
  // (A pick faster on every seed by less than half a percent would read "1.00×": a third digit.)
  const double x = c.best_per_second_over_relu;
  const std::string over_relu = fmt::format("{:.2f}", x) == "1.00" && x != 1.0
                                    ? fmt::format("{:.3f}×", x)
                                    : fmt::format("{:.2f}×", x);
  if (!c.best_per_second.empty())
    md += fmt::format(
        "3. **Per second:** {} ({} tokens/s in training, {} ReLU's). {}.\n", c.best_per_second,
        thousands(static_cast<std::int64_t>(c.best_per_second_tokens)), over_relu, kPerSecondRule);
  else if (!c.noisy_throughput.empty())
    md += fmt::format(
        "3. **Per second:** undecided: the throughput of {} was noisy (runs train two at a time "
        "and share the machine). {}.\n",
        fmt::join(c.noisy_throughput, ", "), kPerSecondRule);
  else if (!c.per_second_candidate.empty())
    md += fmt::format(
        "3. **Per second:** undecided: {} has the highest median, but on some seeds {} ran as "
        "fast. {}.\n",
        c.per_second_candidate, fmt::join(c.per_second_overlapping, ", "), kPerSecondRule);
  else
    md += fmt::format("3. **Per second:** no candidate. {}.\n", kPerSecondRule);
  if (c.moe) {
    using Finding = Recommendations::MoE::Finding;
    const auto& m = *c.moe;
    std::string finding;
    switch (m.finding) {
      case Finding::pays_off:
        finding = "it pays off here: better than the dense FFN of its total parameters";
        break;
      case Finding::pays_off_on_cost:
        finding = fmt::format(
            "it pays off here on cost: equivalent to the dense FFN within ±{} bits/byte, at more "
            "tokens per second",
            m.margin);
        break;
      case Finding::does_not_pay_off:
        finding = m.verdict == Verdict::worse
                      ? "it does not pay off in this run: its validation is worse than the dense "
                        "FFN's of the same total parameters, whatever it saves per token"
                      : "it does not pay off in this run: equivalent to the dense FFN, and no "
                        "faster in training";
        break;
      case Finding::undecided:
        if (m.verdict == Verdict::equivalent) {
          finding =
              "undecided: equivalent to ReLU within the margin, but the throughput that "
              "would decide it was noisy in this run, or faster than ReLU's on some seeds and "
              "slower on others";
          break;
        }
        finding = m.verdict == Verdict::one_seed
                      ? std::string("undecided: one seed gives no interval")
                      : std::string(
                            "undecided at the cap of seeds; a larger --max-seeds or "
                            "longer runs could decide it");
        break;
    }
    md += fmt::format(
        "4. **MoE at ReLU's parameters:** a token runs {} of its FFN's parameters; it trains at {} "
        "tokens/s against ReLU's {} ({:.2f}×{}). *Rule:* MoE pays off where it is "
        "better than the dense FFN of its total parameters, or equivalent at more tokens per "
        "second on every seed. Finding: {}.\n",
        percent(m.active_fraction), thousands(static_cast<std::int64_t>(m.tokens_per_second)),
        thousands(static_cast<std::int64_t>(m.relu_tokens_per_second)), m.over_relu,
        m.noisy ? ", noisy" : "", finding);
    if (m.at_equal_compute) {
      const VariantOutcome& o = *m.at_equal_compute;
      std::string what;
      switch (o.verdict) {
        case Verdict::better:
          what = fmt::format(
              "better than ReLU at the same FLOPs per token: its extra parameters buy quality, at "
              "{:.1f}× the memory",
              m.compute_params_over_relu);
          break;
        case Verdict::worse:
          what = fmt::format(
              "worse than ReLU at the same FLOPs per token: its {:.1f}× parameters do not make "
              "up for the routing here",
              m.compute_params_over_relu);
          break;
        case Verdict::equivalent:
          what = fmt::format(
              "equivalent to ReLU within ±{} bits/byte at the same FLOPs per token: no gain "
              "for {:.1f}× the memory",
              m.margin, m.compute_params_over_relu);
          break;
        default:
          what =
              "undecided: the seeds cannot tell it from ReLU by the cap of the sequential rule; "
              "a larger --max-seeds or longer runs could "
              "decide it";
      }
      md += fmt::format(
          "5. **MoE at equal compute** ({}): with ReLU's active FLOPs per token and {:.1f}× the "
          "LM's parameters, it trains at {} tokens/s ({:.2f}× ReLU's{}). *Rule:* the summary's "
          "verdict. Finding: {}.",
          m.at_equal_compute_design, m.compute_params_over_relu,
          thousands(static_cast<std::int64_t>(o.tokens_per_second)), o.tokens_per_second_over_relu,
          o.tokens_per_second_noisy ? ", noisy" : "", what);
      if (m.at_equal_compute_other)
        md += fmt::format(
            " The other design at that compute ({}) is {} over {} seeds ({} bits/byte): "
            "reported in {}, not a basis of this finding.",
            m.at_equal_compute_other_design, verdict_text(m.at_equal_compute_other->verdict),
            m.at_equal_compute_other->val_bits_per_byte.size(),
            difference_cell(*m.at_equal_compute_other), sec.ref("moe_axes"));
      md += "\n";
    }
  }
  return md + "\n";
}

}  // namespace ffnlab::study

namespace ffnlab::study {

std::string references_markdown(const Study&, const Sections&) {
  // The papers behind each variant and routing feature the report measures, in the order the
  // evolution meets them.
  static constexpr const char* kReferences[] = {
      "Vaswani et al. 2017, *Attention Is All You Need*, NeurIPS, arXiv:1706.03762 — the ReLU FFN "
      "(d_model 512, d_ff 2048).",
      "Hendrycks and Gimpel 2016, *Gaussian Error Linear Units (GELUs)*, arXiv:1606.08415 — GELU "
      "and its tanh and sigmoid approximations.",
      "Dauphin et al. 2017, *Language Modeling with Gated Convolutional Networks*, ICML, "
      "arXiv:1612.08083 — the gated linear unit (GLU).",
      "Ramachandran, Zoph and Le 2017, *Searching for Activation Functions*, arXiv:1710.05941 — "
      "Swish; Elfwing, Uchibe and Doya 2018, *Sigmoid-Weighted Linear Units*, Neural Networks 107, "
      "arXiv:1702.03118 — SiLU (Swish with β = 1).",
      "Shazeer 2020, *GLU Variants Improve Transformer*, arXiv:2002.05202 — bilinear, ReGLU, GEGLU "
      "and SwiGLU at equal parameters (the 2/3 width).",
      "Chowdhery et al. 2022, *PaLM*, arXiv:2204.02311, and Touvron et al. 2023, *LLaMA*, "
      "arXiv:2302.13971 — SwiGLU in large models (LLaMA at 2/3 of 4·d).",
      "So et al. 2021, *Primer*, NeurIPS, arXiv:2109.08668 — squared ReLU.",
      "Li et al. 2023, *The Lazy Neuron Phenomenon*, ICLR, arXiv:2210.06313, and Mirzadeh et al. "
      "2024, *ReLU Strikes Back*, ICLR, arXiv:2310.04564 — activation sparsity in trained "
      "Transformers.",
      "Shazeer et al. 2017, *Outrageously Large Neural Networks: The Sparsely-Gated "
      "Mixture-of-Experts Layer*, ICLR, arXiv:1701.06538 — top-k gating with noise.",
      "Lepikhin et al. 2021, *GShard*, ICLR, arXiv:2006.16668 — top-2 routing, expert capacity, "
      "the load-balancing loss.",
      "Fedus, Zoph and Shazeer 2022, *Switch Transformers*, JMLR 23 (arXiv:2101.03961, 2021, "
      "the year the text cites) — top-1 routing, the capacity factor, the balancing loss with "
      "coefficient 0.01.",
      "Zoph et al. 2022, *ST-MoE*, arXiv:2202.08906 — the router z-loss.",
      "Jiang et al. 2024, *Mixtral of Experts*, arXiv:2401.04088 — 8 SwiGLU experts, top-2.",
      "Dai et al. 2024, *DeepSeekMoE*, ACL, arXiv:2401.06066 — fine-grained experts and a shared "
      "expert.",
      "Qwen Team 2024, *Qwen1.5-MoE* (blog), and Yang et al. 2024, *Qwen2 Technical Report*, "
      "arXiv:2407.10671 — shared experts behind a sigmoid gate.",
      "Wang et al. 2024, *Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts*, "
      "arXiv:2408.15664, and DeepSeek-AI 2024, *DeepSeek-V3 Technical Report*, arXiv:2412.19437 — "
      "the balancing bias, sigmoid scores and group-limited routing.",
      "Narang et al. 2021, *Do Transformer Modifications Transfer Across Implementations and "
      "Applications?*, EMNLP, arXiv:2102.11972 — the variants compared again in one codebase.",
  };
  std::string md;
  for (const char* r : kReferences) md += fmt::format("- {}\n", r);
  return md + "\n";
}

}  // namespace ffnlab::study

namespace ffnlab::study {

namespace {

// What the sizes measured cannot reach, and what the literature says there.
std::string sizes_limitation(const Study& st, const Sections& sec) {
  const std::string literature =
      "Beyond them the evidence is the literature's: Shazeer 2020 and Narang et al. 2021 found "
      "the GLU variants ahead at about 220M parameters, Switch Transformer (Fedus et al. 2021) "
      "MoE at equal compute ahead from T5-base to over a trillion, and the largest dense models "
      "since PaLM (2022) chose SwiGLU, GPT-3 before them a plain GELU FFN (" +
      sec.ref("zoo") + ").";
  if (!st.results.scaling)
    return "- **One size, one task.** Every comparison is of one LM on next-byte prediction; "
           "`--sizes` trains a ladder of sizes and `--tasks causal,masked` adds the masked "
           "objective. " +
           literature + "\n";
  const ScalingResult& r = *st.results.scaling;
  return fmt::format(
      "- **Sizes.** The ladder of {} ran d_model {} to {} ({} to {} parameters): its largest "
      "LM is {} times smaller than the smallest the tutorial's size advice is about (100M "
      "parameters; its rows go above 100B), and a slope fitted across the ladder says nothing "
      "certain about sizes it did not reach; it cannot reach billions of parameters. {}\n",
      std::string(kScalingSection), r.sizes.front().model.d_model, r.sizes.back().model.d_model,
      thousands(r.sizes.front().params), thousands(r.sizes.back().params),
      thousands(static_cast<std::int64_t>(std::llround(
          1e8 / static_cast<double>(std::max<std::int64_t>(1, r.sizes.back().params))))),
      literature);
}

}  // namespace

std::string limitations_markdown(const Study& st, const Sections& sec) {
  if (!st.results.training) return "";
  const TrainingResult& t = *st.results.training;
  const std::int64_t tokens = t.train.steps * t.train.batch * t.train.seq;
  const VariantOutcome* relu = t.find("relu");
  // ReLU's validation at its first and last periodic evaluation, mean over its seeds: how far
  // from converged the comparison is.
  std::vector<double> first, last;
  std::int64_t first_step = 0, last_step = 0;
  for (const RunRecord& r : st.runs)
    if (r.variant == "relu" && r.evals.size() >= 2) {
      first.push_back(r.evals.front().bits_per_byte);
      last.push_back(r.evals.back().bits_per_byte);
      first_step = r.evals.front().step;
      last_step = r.evals.back().step;
    }
  std::string md = fmt::format(
      "What this run can and cannot say, from its own numbers:\n\n"
      "- **Scale.** The LM has {} parameters (with ReLU's FFN) and trains {} steps of {} × {} "
      "bytes: {} training tokens, {:.3g} passes over the {} training bytes. This measures early "
      "training: ",
      thousands(relu ? relu->params : 0), t.train.steps, t.train.batch, t.train.seq,
      thousands(tokens),
      st.results.data
          ? static_cast<double>(tokens) /
                static_cast<double>(st.results.data->bytes - st.results.data->validation_bytes)
          : 0.0,
      st.results.data ? thousands(st.results.data->bytes - st.results.data->validation_bytes)
                      : "?");
  if (!first.empty() && mean(last) < mean(first))
    md += fmt::format(
        "ReLU's validation (on {} bytes) still fell from {:.3f} bits/byte at step {} to {:.3f} "
        "at step {}, so a longer run can reorder variants whose differences are small. ",
        thousands(st.scale.eval_tokens), mean(first), first_step, mean(last), last_step);
  else if (!first.empty())
    md += fmt::format(
        "ReLU's validation (on {} bytes) did not fall from step {} ({:.3f} bits/byte) to step {} "
        "({:.3f}). ",
        thousands(st.scale.eval_tokens), first_step, mean(first), last_step, mean(last));
  // The one-seed parts, each where it ran (a run without the moe variant has neither MoE
  // section), then the run without language.
  std::string one_seed_and_toy = "**No language:**";
  if (st.results.moe)
    one_seed_and_toy =
        fmt::format("**One seed:** the MoE balancing runs ({}){}; **no language:**", sec.ref("moe"),
                    st.results.routing && st.results.routing->seeds == 1
                        ? fmt::format(" and the routing families ({})", sec.ref("routing"))
                        : "");
  md += fmt::format(
      "`--steps` makes the runs longer (the warm-up stays a quarter of them).\n"
      "- **One recipe for every variant.** AdamW at a peak learning rate of {} with a warm-up "
      "over {} steps and a cosine decay, tuned for none of them: a variant that wants another "
      "learning rate at this size loses here for that reason.\n"
      "- **Seeds.** {} to {} paired seeds a comparison, by a rule fixed before the run; a "
      "comparison undecided at the cap needs a new run with a larger `--max-seeds`. Per-seed "
      "numbers move by 0.01–0.02 bits/byte with the build and the CPU's instruction set, so a "
      "verdict is a finding only where it replicates on other machines (docs/verdicts.json).\n"
      "- **Speed** ({}) holds for {} with {} at the tutorial's shape; another CPU, "
      "shape or thread count gives other ratios. Training tokens/s were measured with runs "
      "side by side, one thread each.\n"
      "- {} the toy run ({}).\n",
      t.train.optimizer.lr, t.train.warmup, t.design.first, t.design.cap, sec.ref("speed"),
      st.results.machine.describe(), counted(st.results.threads, "thread"), one_seed_and_toy,
      sec.ref("toy"));
  md += sizes_limitation(st, sec);
  return md + "\n";
}

}  // namespace ffnlab::study
