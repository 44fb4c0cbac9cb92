// Stage "scaling": the study across model sizes and tasks. Every variant is trained at every
// size of the ladder (size_ladder) and on every task (the causal LM, and the masked objective
// for the dense variants), each cell's comparisons against ReLU of its own size and task by the
// training stage's sequential design. The cell of the study's own LM and objective is the
// training stage's. Per task and variant, the slope of its difference to ReLU against log10 of
// the training compute says whether the gap grows or shrinks with size.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

const std::vector<ModelSize>& size_ladder(bool quick) {
  // Head width 32 up to "m", 64 at "l"; depth grows with width, as in the field's families.
  static const std::vector<ModelSize> kLadder{
      {"xs", 64, 2, 2}, {"s", 128, 4, 4}, {"m", 256, 6, 8}, {"l", 512, 8, 8}};
  static const std::vector<ModelSize> kQuick{
      {"xs", 16, 1, 1}, {"s", 32, 2, 2}, {"m", 64, 2, 2}, {"l", 128, 2, 4}};
  return quick ? kQuick : kLadder;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> kTasks{"causal", "masked"};
  return kTasks;
}

bool trains_scaling(const Options& o) {
  return !o.sizes.empty() || !o.tasks.empty();
}

std::vector<ModelSize> scaling_sizes(const Options& o) {
  std::vector<ModelSize> out;
  for (const ModelSize& s : size_ladder(o.quick))  // the ladder's order, smallest first
    if (o.sizes.empty() ? s.name == "s"
                        : std::find(o.sizes.begin(), o.sizes.end(), s.name) != o.sizes.end())
      out.push_back(s);
  return out;
}

std::vector<std::string> scaling_tasks(const Options& o) {
  std::vector<std::string> out;
  for (const std::string& t : task_names())
    if (o.tasks.empty() ? t == "causal"
                        : std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end())
      out.push_back(t);
  return out;
}

LMConfig size_model(const Scale& scale, const ModelSize& size) {
  LMConfig m = scale.model;
  m.d_model = size.d_model;
  m.layers = size.layers;
  m.heads = size.heads;
  m.ffn = study_ffn("relu", size.d_model);
  return m;
}

TrainConfig size_settings(const Scale& scale, const ModelSize& size) {
  TrainConfig t = scale.train;
  // Tokens grow with the parameters (batch and sequence stay, steps grow), from the study's own
  // LM up. A smaller LM trains the study's steps: with fewer, its runs would still be leaving
  // the loss plateau of early training (make_scale), and the comparison would read when each
  // seed leaves it.
  const auto params = [&](const LMConfig& m) {
    return static_cast<double>(transformer_cost(m, t.seq).params);
  };
  const double ratio = params(size_model(scale, size)) / params(scale.model);
  t.steps = std::max(scale.train.steps,
                     static_cast<std::int64_t>(std::llround(static_cast<double>(t.steps) * ratio)));
  t.warmup = t.steps / 4;
  t.eval_every = 0;  // the stage reads the final evaluation only
  return t;
}

LMConfig task_model(LMConfig m, bool masked) {
  set_objective_keys(m, masked ? Objective::masked : Objective::causal);
  return m;
}

std::vector<std::string> scaling_labels(const Study& st, const std::string& task) {
  std::vector<std::string> labels{"relu"};
  for (const std::string& v : st.options.variants)
    if (v != "relu" &&
        (task == "causal" || study_ffn(v, st.scale.model.d_model).kind != FFNKind::moe))
      labels.push_back(v);
  if (task == "causal" && st.has_variant("moe")) labels.emplace_back(kHeadlineMoE);
  return labels;
}

RunJob scaling_job(const Study& st, const ModelSize& size, const std::string& task,
                   const std::string& variant, int seed) {
  const bool masked = task == "masked";
  RunJob job;
  job.model = size_model(st.scale, size);
  job.model.ffn =
      variant == kHeadlineMoE ? headline_moe_ffn(size.d_model) : study_ffn(variant, size.d_model);
  job.model = task_model(job.model, masked);
  TrainConfig t = size_settings(st.scale, size);
  if (masked) t.objective = Objective::masked;
  job.settings = t;
  job.seed = static_cast<std::uint64_t>(seed);
  job.label = fmt::format("{}/{}/{}", size.name, task, variant);
  return job;
}

namespace {

bool is_study_cell(const ModelSize& size, const std::string& task) {
  return size.name == "s" && task == "causal";
}

// Per seed (seed 1 first), the validation of a cell's label.
std::vector<double> cell_values(const Study& st, const ModelSize& size, const std::string& task,
                                const std::string& label) {
  if (is_study_cell(size, task)) return per_seed(st, label, &RunRecord::val_bits_per_byte);
  const std::string full = fmt::format("{}/{}/{}", size.name, task, label);
  std::vector<std::pair<int, double>> by_seed;
  for (const RunRecord& r : st.scaling_runs)
    if (r.variant == full) by_seed.emplace_back(r.seed, r.val_bits_per_byte);
  std::sort(by_seed.begin(), by_seed.end());
  std::vector<double> out;
  for (const auto& [seed, value] : by_seed) out.push_back(value);
  return out;
}

struct Cell {
  ModelSize size;
  std::string task;
  std::vector<std::string> labels;
};

std::vector<Cell> cells_of(const Study& st) {
  std::vector<Cell> cells;
  for (const ModelSize& size : scaling_sizes(st.options))
    for (const std::string& task : scaling_tasks(st.options))
      cells.push_back({size, task, scaling_labels(st, task)});
  return cells;
}

int comparisons_of(const std::vector<Cell>& cells) {
  int n = 0;
  for (const Cell& c : cells) n += static_cast<int>(c.labels.size()) - 1;
  return n;
}

std::vector<double> paired(const std::vector<double>& v, const std::vector<double>& relu) {
  std::vector<double> d;
  for (std::size_t i = 0; i < v.size() && i < relu.size(); ++i) d.push_back(v[i] - relu[i]);
  return d;
}

// The outcomes of a cell's comparisons (ReLU's first, as the reference): the training stage's
// for the study's own cell; elsewhere by the sequential rule, narrow_by_chance against the
// cell's other comparisons (a spread in bits per byte differs between sizes and tasks) and the
// error shared over the stage's comparisons.
std::vector<VariantOutcome> cell_outcomes(const Study& st, const std::vector<Cell>& cells,
                                          std::size_t which) {
  const Cell& cell = cells[which];
  std::vector<VariantOutcome> out;
  if (is_study_cell(cell.size, cell.task)) {
    for (const std::string& l : cell.labels) out.push_back(comparison_outcome(st, l));
    return out;
  }
  const std::vector<double> relu = cell_values(st, cell.size, cell.task, "relu");
  VariantOutcome reference = paired_outcome("relu", relu, relu, st.options.margin);
  reference.verdict = Verdict::reference;
  out.push_back(std::move(reference));
  for (const std::string& l : cell.labels) {
    if (l == "relu") continue;
    std::vector<std::vector<double>> others;
    for (const std::string& o : cell.labels)
      if (o != "relu" && o != l)
        others.push_back(paired(cell_values(st, cell.size, cell.task, o), relu));
    out.push_back(sequential_outcome(l, cell_values(st, cell.size, cell.task, l), relu,
                                     st.options.margin, st.scale.design,
                                     pooled_paired_spread(others), comparisons_of(cells)));
  }
  return out;
}

// Training FLOPs of one run: a step's backward is about twice its forward.
double training_flops(const RunJob& job) {
  const TrainConfig& t = *job.settings;
  return 3.0 * transformer_cost(job.model, t.seq).forward_flops *
         static_cast<double>(t.steps * t.batch * t.seq);
}

// Trains one round's runs in one pool, the costliest first, so that the workers stay busy to
// the end (the order changes no run's numbers, only when each starts).
void train_scaling_round(Study& st, std::vector<RunJob> jobs) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const RunJob& a, const RunJob& b) {
    return training_flops(a) > training_flops(b);
  });
  for (RunRecord& r : train_runs(st, std::move(jobs))) st.scaling_runs.push_back(std::move(r));
}

bool decided(const ScalingTrend& t) {
  return t.slope.defined() && t.reading != "undecided";
}

// The trends that share the 5 %: those with an interval.
std::int64_t trends_with_interval(const std::vector<ScalingTrend>& trends) {
  return std::count_if(trends.begin(), trends.end(),
                       [](const ScalingTrend& t) { return t.slope.defined(); });
}

std::string reading_of(const SlopeInterval& s) {
  if (!s.defined()) return "no interval";
  if (s.high < 0) return "gains on ReLU with size";
  if (s.low > 0) return "loses ground to ReLU with size";
  return "undecided";
}

}  // namespace

std::int64_t scaling_steps(const Study& st) {
  if (!trains_scaling(st.options)) return 0;
  std::int64_t steps = 0;
  for (const Cell& c : cells_of(st))
    if (!is_study_cell(c.size, c.task))
      steps += size_settings(st.scale, c.size).steps * st.scale.design.cap *
               static_cast<std::int64_t>(c.labels.size());
  return steps;
}

void run_scaling(Study& st) {
  if (!trains_scaling(st.options)) return;
  const SequentialDesign& design = st.scale.design;
  const std::vector<Cell> cells = cells_of(st);
  std::vector<std::string> names;
  for (const ModelSize& s : scaling_sizes(st.options))
    names.push_back(fmt::format("{} (d_model {}, {} layers, {} steps)", s.name, s.d_model, s.layers,
                                size_settings(st.scale, s).steps));
  st.stage(fmt::format("across sizes and tasks: {} on {}, {} to {} paired seeds a comparison",
                       fmt::join(names, ", "), fmt::join(scaling_tasks(st.options), " and "),
                       design.first, design.cap));
  std::vector<RunJob> jobs;
  for (int seed = 1; seed <= design.first; ++seed)
    for (const Cell& c : cells)
      if (!is_study_cell(c.size, c.task))
        for (const std::string& l : c.labels)
          jobs.push_back(scaling_job(st, c.size, c.task, l, seed));
  train_scaling_round(st, std::move(jobs));

  // Then a round per look, over every cell at once: one more seed for each undecided
  // comparison below the cap.
  for (;;) {
    check_stop();
    jobs.clear();
    std::int64_t planned_steps = 0;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const Cell& c = cells[i];
      if (is_study_cell(c.size, c.task)) continue;
      std::vector<VariantOutcome> outcomes = cell_outcomes(st, cells, i);
      const int relu_has = static_cast<int>(outcomes.front().val_bits_per_byte.size());
      outcomes.erase(outcomes.begin());
      const NextRound next = next_round(outcomes, relu_has, design);
      planned_steps += next.planned_runs * size_settings(st.scale, c.size).steps;
      st.message(fmt::format("  {} {}, look at {}: {}", c.size.name, c.task,
                             counted(relu_has, "seed"), next.looked));
      for (const auto& [label, seed] : next.runs)
        jobs.push_back(scaling_job(st, c.size, c.task, label, seed));
    }
    std::int64_t after = 0;
    bool later = false;
    for (const Stage& s : stages()) {
      if (later) after += s.planned_steps(st);
      later = later || s.key == "scaling";
    }
    st.planned_steps = st.done_steps + after + planned_steps;
    if (jobs.empty()) break;
    train_scaling_round(st, std::move(jobs));
  }

  st.results.scaling = scaling_result(st);
  st.write("scaling.csv", st.results.scaling->figure_csv());
}

ScalingResult scaling_result(const Study& st) {
  const std::vector<Cell> cells = cells_of(st);
  ScalingResult out;
  out.design = st.scale.design;
  out.comparisons = comparisons_of(cells);
  out.tasks = scaling_tasks(st.options);
  for (const ModelSize& s : scaling_sizes(st.options)) {
    ScalingSize row;
    row.name = std::string(s.name);
    row.model = size_model(st.scale, s);
    row.train = size_settings(st.scale, s);
    row.params = transformer_cost(row.model, row.train.seq).params;
    row.training_flops = training_flops(scaling_job(st, s, "causal", "relu", 1));
    out.sizes.push_back(std::move(row));
  }
  for (std::size_t ci = 0; ci < cells.size(); ++ci) {
    const Cell& c = cells[ci];
    ScalingCell cell;
    cell.size = std::string(c.size.name);
    cell.task = c.task;
    cell.from_training = is_study_cell(c.size, c.task);
    std::vector<VariantOutcome> outcomes = cell_outcomes(st, cells, ci);
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      const RunJob job = scaling_job(st, c.size, c.task, c.labels[i], 1);
      outcomes[i].d_ff =
          job.model.ffn.kind == FFNKind::moe ? job.model.ffn.expert_d_ff() : job.model.ffn.d_ff;
      outcomes[i].params = transformer_cost(job.model, job.settings->seq).params;
      cell.variants.push_back({std::move(outcomes[i]), training_flops(job)});
    }
    out.cells.push_back(std::move(cell));
  }
  // Per task and variant: its differences to ReLU at each size against log10 of ReLU's compute.
  struct Line {
    std::vector<double> x;
    std::vector<std::vector<double>> groups;
  };
  std::vector<Line> lines;
  for (const std::string& task : out.tasks)
    for (const std::string& label : scaling_labels(st, task)) {
      if (label == "relu" || out.sizes.size() < 2) continue;
      Line line;
      for (const Cell& c : cells) {
        if (c.task != task) continue;
        line.x.push_back(std::log10(training_flops(scaling_job(st, c.size, c.task, "relu", 1))));
        line.groups.push_back(
            paired(cell_values(st, c.size, task, label), cell_values(st, c.size, task, "relu")));
      }
      ScalingTrend trend{task, label, slope_interval(line.x, line.groups), ""};
      trend.reading = reading_of(trend.slope);
      out.trends.push_back(std::move(trend));
      lines.push_back(std::move(line));
    }
  // The family of trends shares the 5 % (Bonferroni), as the comparisons' verdicts do.
  const std::int64_t k = trends_with_interval(out.trends);
  for (std::size_t i = 0; i < out.trends.size(); ++i) {
    ScalingTrend& t = out.trends[i];
    if (!decided(t) || k < 2) continue;
    const SlopeInterval shared =
        slope_interval(lines[i].x, lines[i].groups, 1.0 - 0.05 / static_cast<double>(k));
    t.holds_for_all_trends = reading_of(shared) == t.reading;
  }
  return out;
}

const ScalingCell* ScalingResult::find(std::string_view size, std::string_view task) const {
  for (const ScalingCell& c : cells)
    if (c.size == size && c.task == task) return &c;
  return nullptr;
}

namespace {

// A row of scaling.csv: the variant's validation, and its paired difference to ReLU with the
// interval of the last look (ReLU: 0; one seed: no interval, the bar has no length).
std::string csv_row(const std::string& task, const std::string& size, const ScalingEntry& e) {
  const VariantOutcome& o = e.outcome;
  const bool reference = o.verdict == Verdict::reference;
  const double d = reference ? 0.0 : o.diff_mean;
  const bool interval = !reference && !std::isnan(o.diff_low) && !std::isnan(o.diff_high);
  return fmt::format("{},{},{},{:.6e},{:.6f},{:.6f},{},{:.6f},{:.6f},{:.6f}\n", task, o.variant,
                     size, e.training_flops, o.mean, o.std, o.val_bits_per_byte.size(), d,
                     interval ? o.diff_low : d, interval ? o.diff_high : d);
}

}  // namespace

std::string ScalingResult::figure_csv() const {
  // Each line of the figure (a task and a variant) in consecutive rows, smallest size first.
  std::string csv =
      "task,variant,size,training_flops,mean,std,seeds,difference_to_relu,difference_low,"
      "difference_high\n";
  for (const std::string& task : tasks) {
    std::vector<std::string> variants;
    for (const ScalingCell& c : cells)
      if (c.task == task)
        for (const ScalingEntry& e : c.variants)
          if (std::find(variants.begin(), variants.end(), e.outcome.variant) == variants.end())
            variants.push_back(e.outcome.variant);
    for (const std::string& v : variants)
      for (const ScalingCell& c : cells)
        for (const ScalingEntry& e : c.variants)
          if (c.task == task && e.outcome.variant == v) csv += csv_row(task, c.size, e);
  }
  return csv;
}

json scaling_json(const Results& res) {
  return json_if(res.scaling, [](const ScalingResult& r) {
    json out;
    out["design"] = {{"first_seeds", r.design.first},
                     {"max_seeds", r.design.cap},
                     {"alpha", r.design.alpha},
                     {"comparisons", r.comparisons}};
    out["tasks"] = r.tasks;
    for (const ScalingSize& s : r.sizes) {
      json model = lm_config_to_json(s.model);
      model.erase("ffn");
      out["sizes"][s.name] = {{"model", std::move(model)},
                              {"steps", s.train.steps},
                              {"warmup", s.train.warmup},
                              {"batch", s.train.batch},
                              {"seq", s.train.seq},
                              {"params", s.params},
                              {"training_flops", s.training_flops}};
    }
    for (const ScalingCell& c : r.cells) {
      json cell;
      cell["from_training_stage"] = c.from_training;
      for (const ScalingEntry& e : c.variants) {
        const VariantOutcome& o = e.outcome;
        const bool reference = o.verdict == Verdict::reference;
        cell["variants"][o.variant] = {
            {"d_ff", o.d_ff},
            {"params", o.params},
            {"training_flops", e.training_flops},
            {"val_bits_per_byte", o.val_bits_per_byte},
            {"mean", o.mean},
            {"std", o.std},
            {"paired_difference_to_relu_mean", reference ? json(nullptr) : json(o.diff_mean)},
            {"paired_difference_to_relu_ci95",
             reference ? json(nullptr) : interval_json(o.diff_low, o.diff_high)},
            {"verdict", verdict_text(o.verdict)},
            {"seeds", o.val_bits_per_byte.size()},
            {"holds_for_all_comparisons", o.holds_for_all_comparisons},
            {"narrow_by_chance", o.narrow_by_chance},
            {"seeds_to_decide", o.seeds_to_decide}};
      }
      out["cells"][c.size][c.task] = std::move(cell);
    }
    out["trends"] = json::array();
    for (const ScalingTrend& t : r.trends)
      out["trends"].push_back(
          {{"task", t.task},
           {"variant", t.variant},
           {"difference_per_tenfold_compute",
            std::isnan(t.slope.slope) ? json(nullptr) : json(t.slope.slope)},
           {"ci95", interval_json(t.slope.low, t.slope.high)},
           {"degrees_of_freedom",
            t.slope.defined() ? json(t.slope.degrees_of_freedom) : json(nullptr)},
           {"reading", t.reading},
           // Only a decided reading holds or not: null for "undecided" and "no interval".
           {"holds_for_all_trends", decided(t) ? json(t.holds_for_all_trends) : json(nullptr)}});
    return out;
  });
}

namespace {

std::string size_sentence(const ScalingSize& s) {
  return fmt::format("{}: d_model {}, {} layer{}, {} head{}, {} parameters, {} steps", s.name,
                     s.model.d_model, s.model.layers, s.model.layers == 1 ? "" : "s", s.model.heads,
                     s.model.heads == 1 ? "" : "s", thousands(s.params), thousands(s.train.steps));
}

std::string tasks_text(const std::vector<std::string>& tasks) {
  std::vector<std::string> names;
  for (const std::string& t : tasks)
    names.push_back(t == "masked" ? "the masked objective" : "the causal LM");
  return fmt::format("{}", fmt::join(names, " and "));
}

std::string range_text(const ScalingResult& r) {
  const ScalingSize& lo = r.sizes.front();
  const ScalingSize& hi = r.sizes.back();
  if (r.sizes.size() == 1)
    return fmt::format("one size, d_model {} ({} parameters)", lo.model.d_model,
                       thousands(lo.params));
  return fmt::format("d_model {} to {}, {} to {} parameters", lo.model.d_model, hi.model.d_model,
                     thousands(lo.params), thousands(hi.params));
}

// The cell's choice at equal parameters: the variant decided better than ReLU with the lowest
// mean (MoE at equal compute aside: it is not at equal parameters), or ReLU.
std::string cell_choice(const ScalingCell& c) {
  const VariantOutcome* best = nullptr;
  for (const ScalingEntry& e : c.variants)
    if (e.outcome.variant != kHeadlineMoE && e.outcome.verdict == Verdict::better &&
        (best == nullptr || e.outcome.mean < best->mean))
      best = &e.outcome;
  return best != nullptr ? best->variant : "relu (nothing measurably better)";
}

std::string trend_cell(const ScalingTrend& t) {
  if (!t.slope.defined())
    return std::isnan(t.slope.slope) ? "—" : fmt::format("{:+.4f} (no interval)", t.slope.slope);
  return fmt::format("{:+.4f} [{:+.4f}, {:+.4f}]: {}{}", t.slope.slope, t.slope.low, t.slope.high,
                     t.reading, t.holds_for_all_trends ? "" : "; not across all trends");
}

}  // namespace

std::string scaling_markdown(const Study& st, const Sections& sec) {
  if (!st.results.scaling) return "";
  const ScalingResult& r = *st.results.scaling;
  std::vector<std::string> sizes;
  for (const ScalingSize& s : r.sizes) sizes.push_back(size_sentence(s));
  std::string md = fmt::format(
      "Every variant trained at every size of the ladder, {}, on {}; the sizes: {}. Each "
      "size trains as many steps as the study's LM, or more in proportion to its parameters "
      "where it is larger (batch and sequence stay: the tokens grow with the parameters), "
      "with the warm-up a quarter of the steps and the rest of {}'s recipe. The masked objective "
      "is a bidirectional LM (`ffnlab train --objective masked`: a share of the bytes replaced "
      "by [MASK], RoPE positions, bits per masked byte){}; MoE variants train on the causal LM "
      "only. In each cell (a size and a task) every "
      "variant is compared with ReLU of the same size and task, paired by seed, by {}'s "
      "sequential rule: {}, then one more per round while undecided, up to {}. The {} "
      "comparisons each hold their 5 % error; \"not across all comparisons\" marks a verdict "
      "that does not hold with the 5 % shared among all of them.{}\n\n",
      range_text(r), tasks_text(r.tasks), fmt::join(sizes, "; "), sec.ref("training"),
      st.results.routing && st.results.routing->find("masked", "topk") != nullptr
          ? fmt::format(", the LM of the routing families' masked runs ({})", sec.ref("routing"))
          : "",
      sec.ref("training"), counted(r.design.first, "seed"), r.design.cap, r.comparisons,
      r.find("s", "causal") != nullptr ? fmt::format(" The cell of the study's own LM (s, causal) "
                                                     "is {}'s runs (the summary's verdicts).",
                                                     sec.ref("training"))
                                       : "");
  std::vector<std::vector<std::string>> rows;
  for (const ScalingCell& c : r.cells)
    for (const ScalingEntry& e : c.variants) {
      const VariantOutcome& o = e.outcome;
      std::string seeds;
      for (double b : o.val_bits_per_byte) seeds += (seeds.empty() ? "" : ", ") + fixed(b, 3);
      rows.push_back({c.size, c.task, o.variant, thousands(o.params), seeds,
                      fmt::format("{} ± {}", fixed(o.mean, 4), fixed(o.std, 4)),
                      o.verdict == Verdict::reference ? "—" : difference_cell(o), verdict_cell(o)});
    }
  md += markdown_table({"size", "task", "variant", "parameters", "bits/byte per seed", "mean ± std",
                        "paired difference to ReLU [interval of the last look]", "verdict"},
                       rows, "lllrrrrl");
  if (!r.trends.empty()) {
    std::vector<std::vector<std::string>> trend_rows;
    for (const ScalingTrend& t : r.trends) trend_rows.push_back({t.task, t.variant, trend_cell(t)});
    md += fmt::format(
        "\n**Does the gap to ReLU grow with size?** Per task and variant, the slope of its "
        "paired difference to ReLU (bits/byte) against log10 of the training compute of ReLU's "
        "run at each size: the change per tenfold compute, with its 95 % interval (the line "
        "through each size's mean difference; the sizes' spreads and seed counts may differ, "
        "so the interval is Welch's, with Satterthwaite's degrees of freedom; it is a fixed "
        "interval, not adjusted for the sequential looks). Below 0 the variant gains on ReLU "
        "as the model grows; above 0 it loses ground; an interval across 0 is undecided. "
        "\"not across all trends\" marks a reading that does not hold with the 5 % shared "
        "among the {} trends with an interval (Bonferroni).\n\n",
        trends_with_interval(r.trends));
    md += markdown_table({"task", "variant", "difference to ReLU per tenfold compute [95 %]"},
                         trend_rows, "lll");
  }
  std::vector<std::string> undecided;
  for (const ScalingCell& c : r.cells)
    for (const ScalingEntry& e : c.variants)
      if (e.outcome.verdict == Verdict::inconclusive) {
        const std::vector<double> d = [&] {
          std::vector<double> out;
          const auto& relu = c.variants.front().outcome.val_bits_per_byte;
          for (std::size_t i = 0; i < e.outcome.val_bits_per_byte.size() && i < relu.size(); ++i)
            out.push_back(e.outcome.val_bits_per_byte[i] - relu[i]);
          return out;
        }();
        const int n = values_to_decide(d, st.options.margin);
        undecided.push_back(fmt::format("{} at {} ({}): {}", e.outcome.variant, c.size, c.task,
                                        n == 0     ? "no spread to plan from"
                                        : n > 1000 ? "the spread hides any difference"
                                                   : fmt::format("about {} seeds", n)));
      }
  if (!undecided.empty())
    md += fmt::format(
        "\n**What would decide the undecided cells.** If the mean difference stayed as seen and "
        "the spread were its upper 90 % bound, a fixed 95 % interval would decide at about "
        "these seeds (a planning figure; the sequential rule with a cap that large needs a few "
        "more): {}. `--max-seeds` with `--resume` trains only the seeds added.\n",
        fmt::join(undecided, "; "));
  md +=
      "\nscaling.png: each variant's validation against its training compute, one line per "
      "variant across the sizes (top), and its paired difference to ReLU with the interval of "
      "the last look (bottom), a column per task.\n";
  return md + "\n";
}

std::vector<std::vector<std::string>> scaling_choice_rows(const Study& st, const Sections& sec) {
  if (!st.results.scaling) return {};
  const ScalingResult& r = *st.results.scaling;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> by_size, trends;
  for (const ScalingSize& s : r.sizes)
    if (const ScalingCell* c = r.find(s.name, "causal"))
      by_size.push_back(
          fmt::format("{} ({} parameters): {}", s.name, thousands(s.params), cell_choice(*c)));
  for (const ScalingTrend& t : r.trends)
    if (t.task == "causal" && t.slope.defined())
      trends.push_back(
          fmt::format("{} {} ({:+.4f} [{:+.4f}, {:+.4f}] bits/byte per tenfold "
                      "compute{})",
                      t.variant, t.reading, t.slope.slope, t.slope.low, t.slope.high,
                      t.holds_for_all_trends ? "" : "; not across all trends"));
  if (!by_size.empty())
    rows.push_back(
        {"model size",
         "below 100M ReLU or GELU, 100M–1B GELU, 1B–10B GELU or GLU, 10B–100B GLU or gated, "
         "above 100B MoE",
         fmt::format(
             "measured at {}: {}{}", range_text(r), fmt::join(by_size, "; "),
             trends.empty() ? "" : fmt::format(". Across the sizes: {}", fmt::join(trends, "; "))),
         fmt::format("the causal cells and trends of {}; nothing here reaches 100M parameters, "
                     "where the tutorial's rows begin ({})",
                     std::string(kScalingSection), sec.ref("limitations"))});
  std::vector<std::string> by_task;
  for (const std::string& task : r.tasks) {
    std::vector<std::string> per_size;
    for (const ScalingSize& s : r.sizes)
      if (const ScalingCell* c = r.find(s.name, task))
        per_size.push_back(fmt::format("{} {}", s.name, cell_choice(*c)));
    by_task.push_back(fmt::format("{}: {}", task, fmt::join(per_size, ", ")));
  }
  rows.push_back(
      {"task",
       "classification ReLU, NLU and generation GELU, multi-task gated, extreme scale "
       "MoE",
       fmt::format("measured on {}: {}", fmt::join(r.tasks, " and "), fmt::join(by_task, "; ")),
       fmt::format("the cells of {}: byte-level next-byte prediction{} on one corpus; "
                   "classification and multi-task training were not run",
                   std::string(kScalingSection),
                   r.tasks.size() > 1 ? " and masked-byte prediction (a bidirectional "
                                        "LM, the pre-training of an NLU encoder)"
                                      : "")});
  return rows;
}

}  // namespace ffnlab::study
