// The study's figures: each a gnuplot script over the CSV its stage wrote beside it
// (report/figure.hpp); moe_pareto draws its points from data inline in the script (moved apart
// where costs coincide), its CSV keeping the exact costs. The stage table (stages.cpp) names each
// figure's stage.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "check.hpp"
#include "ffnlab/report/figure.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// Ten distinguishable colours (gnuplot's default cycle repeats after eight).
const char* colour(std::size_t i) {
  static const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kColours[i % 10];
}

// Clustered bars with filled boxes and slanted variant names under them.
constexpr const char* kBars =
    "set style data histograms\nset style histogram clustered gap 1\n"
    "set style fill solid 0.8 border -1\nset xtics rotate by -30\n";

std::string preamble(const std::string& name, int width, int height) {
  return fmt::format(
      "set terminal pngcairo size {},{} font 'DejaVu Sans,11' noenhanced\n"
      "set output '{}.png'\n"
      "set datafile separator ','\n"
      "set grid lc rgb '#dddddd'\n"
      "set key noopaque\n",
      width, height, name);
}

// Wide curves: per variant, per step, the mean, min and max over seeds of a per-step value.
void write_curves(const Study& st, const std::string& path, bool eval, int smooth) {
  std::string csv = "step";
  for (const auto& v : st.options.variants)
    csv += fmt::format(",{0}_mean,{0}_min,{0}_max,{0}_grad", v);
  csv += "\n";
  std::map<std::string, std::vector<const RunRecord*>> by;
  for (const auto& r : st.runs) by[r.variant].push_back(&r);
  const std::size_t n =
      eval ? by.begin()->second.front()->evals.size() : by.begin()->second.front()->steps.size();
  for (std::size_t i = 0; i < n; i += eval ? 1 : smooth) {
    const std::int64_t step = eval ? by.begin()->second.front()->evals[i].step
                                   : by.begin()->second.front()->steps[i].step;
    csv += std::to_string(step);
    for (const auto& v : st.options.variants) {
      double mean = 0, mn = 1e300, mx = -1e300, grad = 0;
      for (const RunRecord* r : by[v]) {
        double value = 0, g = 0;
        if (eval) {
          value = r->evals[i].bits_per_byte;
        } else {  // a window of `smooth` steps
          const std::size_t end = std::min(n, i + smooth);
          for (std::size_t k = i; k < end; ++k) {
            value += r->steps[k].loss;
            g += r->steps[k].grad_norm;
          }
          value /= static_cast<double>(end - i);
          g /= static_cast<double>(end - i);
        }
        mean += value;
        grad += g;
        mn = std::min(mn, value);
        mx = std::max(mx, value);
      }
      const double k = static_cast<double>(by[v].size());
      csv += fmt::format(",{:.5f},{:.5f},{:.5f},{:.5f}", mean / k, mn, mx, grad / k);
    }
    csv += "\n";
  }
  st.write(path, csv);
}

}  // namespace

void draw_training_dynamics(const Study& st) {
  constexpr int kWindow = 10;  // training steps a point of the training panels averages
  write_curves(st, "lm_train_curves.csv", false, kWindow);
  write_curves(st, "lm_eval_curves.csv", true, 1);
  // Each variant's seeds, for its legend entry: the curves are means over them.
  std::map<std::string, int> seeds;
  for (const RunRecord& r : st.runs) ++seeds[r.variant];
  std::string s = preamble("training_dynamics", 1500, 1050);
  s += "set multiplot layout 2,2 title 'Training dynamics: the LM panels show the mean over each "
       "variant''s seeds (the legend says how many)'\n";
  // `scale` divides the column (nats to bits); `points` marks the measured steps (the
  // evaluations are a few); a dash pattern per variant tells apart curves that overlap.
  // `first` is the first data row drawn.
  auto curves = [&](const std::string& file, int col_offset, const std::string& title,
                    const std::string& ylabel, bool band, const std::string& scale, bool points,
                    std::int64_t first) {
    s += fmt::format("set title '{}'\nset xlabel 'optimizer step'\nset ylabel '{}'\n", title,
                     ylabel);
    s += "set key top right\n";
    // A 10-step mean stands at its window's middle (the CSV names the window's first step).
    const std::string x =
        file == "lm_train_curves.csv" ? fmt::format("($1+{})", (kWindow - 1) / 2.0) : "1";
    std::string plot = "plot ";
    for (std::size_t i = 0; i < st.options.variants.size(); ++i) {
      const int base = 2 + 4 * static_cast<int>(i);
      const std::string& v = st.options.variants[i];
      if (band)
        plot += fmt::format(
            "'{}' every ::{} using {}:(${}{}):(${}{}) with filledcurves lc rgb '{}' fs "
            "transparent solid 0.15 notitle, ",
            file, first, x, base + 1, scale, base + 2, scale, colour(i));
      plot += fmt::format(
          "'{}' every ::{} using {}:(${}{}) with {} lw 2 dt {} lc rgb '{}' title '{} ({} "
          "seed{})'{}",
          file, first, x, base + col_offset, scale, points ? "linespoints pt 7 ps 0.8" : "lines",
          1 + i % 5, colour(i), v, seeds[v], seeds[v] == 1 ? "" : "s",
          i + 1 < st.options.variants.size() ? ", " : "\n");
    }
    s += plot;
  };
  curves(
      "lm_eval_curves.csv", 0,
      fmt::format("LM validation on its first {} bytes (the tables use {})", st.scale.eval_tokens,
                  st.scale.validation_tokens > 0 &&
                          st.scale.validation_tokens <
                              static_cast<std::int64_t>(st.corpus.validation().size())
                      ? fmt::format("the first {}", st.scale.validation_tokens)
                      : fmt::format("all {}", st.corpus.validation().size())) +
          "; band: min to max",
      "bits per byte", true, "", true, 1);
  // The first tenth of training falls from the initial loss and would squeeze the rest: the
  // panel starts at the first 10-step window (rows at steps 1, 11, 21, ...) from there.
  const std::int64_t window =
      (std::max<std::int64_t>(1, st.scale.train.steps / 10) + kWindow - 2) / kWindow;
  const std::int64_t from = 1 + kWindow * window;  // that window's first step
  curves("lm_train_curves.csv", 0,
         fmt::format("LM training loss from step {} (10-step means; band: min to max)", from),
         "cross-entropy (bits per byte)", true, "/log(2)", false, 1 + window);
  s += "set logscale y\n";
  curves("lm_train_curves.csv", 3, "LM gradient norm before clipping (10-step means)",
         "global gradient norm", false, "", false, 1);
  s += "unset logscale y\n";
  s += "set title \"The tutorial's toy run, seed 42: one layer memorising 8 random vectors\"\n"
       "set xlabel 'iteration'\nset ylabel 'MSE (log scale)'\nset logscale y\n";
  const std::vector<std::string> toy{"relu", "gelu", "glu", "gated", "moe"};
  std::string fixed_plot;
  for (std::size_t i = 0; i < toy.size(); ++i) {
    // The same colour for a variant in every panel.
    const auto at = std::find(st.options.variants.begin(), st.options.variants.end(), toy[i]);
    const std::size_t c = at == st.options.variants.end()
                              ? st.options.variants.size() + i
                              : static_cast<std::size_t>(at - st.options.variants.begin());
    fixed_plot += fmt::format(
        "{}'toy_loss.csv' every ::1 using (strcol(1) eq '{}' ? $2 : NaN):3 "
        "with lines lw 2 lc rgb '{}' title '{}'",
        i ? ", " : "plot ", toy[i], colour(c), toy[i]);
  }
  s += fixed_plot + "\nunset multiplot\n";
  render_figure(st.dir, "training_dynamics", s);
}

void draw_activation_comparison(const Study& st) {
  std::string s = preamble("activation_comparison", 1500, 1050);
  s += "set multiplot layout 2,2 title 'Activations as ffnlab computes them (f32 kernels)'\n";
  // Columns: x, then (value, derivative) for each activation below, then the two GELU
  // approximation errors. The three GELU forms get one colour and three dash patterns: at this
  // scale they coincide, and the error panel tells them apart.
  struct Curve {
    const char* name;
    const char* colour;
    int dash;
  };
  const std::vector<Curve> curves{{"relu", "#1f77b4", 1},      {"gelu", "#d62728", 1},
                                  {"gelu_tanh", "#d62728", 2}, {"gelu_quick", "#d62728", 3},
                                  {"silu", "#2ca02c", 1},      {"sigmoid", "#9467bd", 1},
                                  {"tanh", "#8c564b", 1}};
  const int errors = 2 + 2 * static_cast<int>(curves.size());
  auto panel = [&](const std::string& title, const std::string& ylabel, int which) {
    s += fmt::format("set title \"{}\"\nset xlabel 'x'\nset ylabel '{}'\nset key top left\n", title,
                     ylabel);
    std::string plot = "plot ";
    for (std::size_t i = 0; i < curves.size(); ++i)
      plot += fmt::format(
          "'activation_curves.csv' every ::1 using 1:{} with lines lw 2 dt {} lc rgb '{}' title "
          "'{}'{}",
          2 + 2 * static_cast<int>(i) + which, curves[i].dash, curves[i].colour, curves[i].name,
          i + 1 < curves.size() ? ", " : "\n");
    s += plot;
  };
  panel("act(x) (the three GELU forms overlap here: the lower left panel separates them)", "act(x)",
        0);
  panel("act'(x)", "derivative", 1);
  s += fmt::format(
      "set title \"GELU's approximations minus exact GELU\"\nset xlabel 'x'\n"
      "set ylabel 'approximation - exact'\nset key bottom right\n"
      "plot 'activation_curves.csv' every ::1 using 1:{} with lines lw 2 dt 2 lc rgb '#d62728' "
      "title 'tanh form (gelu_new)', '' every ::1 using 1:{} with lines lw 2 dt 3 lc rgb "
      "'#ff7f0e' title 'x*sigmoid(1.702x) (quick_gelu)'\n",
      errors, errors + 1);
  s += "set title \"What the tutorial calls dead neurons, and dead and near-dead units (seed 1, "
       "all layers)\"\n"
       "set ylabel 'fraction'\nset xlabel ''\nset yrange [0:1]\n"
       "set key top right\n";
  s += kBars;
  s += fmt::format(
      "plot 'sparsity_summary.csv' every ::1 using 2:xtic(1) title 'hidden values exactly 0, "
      "at initialisation (the demonstration of the tutorial)', '' every ::1 using 3 title 'hidden "
      "values exactly 0, after training', '' every ::1 using 6 title 'units dead (0 on every "
      "census token), after training', '' every ::1 using 7 title 'units near-dead (0 or "
      "|h| < {} rms on every census token), after training'\n",
      kNearZeroRelative);
  s += "unset multiplot\n";
  render_figure(st.dir, "activation_comparison", s);
}

void draw_ffn_performance(const Study& st) {
  std::string s = preamble("ffn_performance_comparison", 1500, 1050);
  s +=
      "set multiplot layout 2,2 title \"FFN variants at the tutorial's configuration (d_model 512, "
      "d_ff 2048)\"\n";
  s += kBars;
  s += "set key top left\n";
  s += "set title 'Parameters and forward FLOPs per token, relative to ReLU'\n"
       "set ylabel 'x ReLU'\nset yrange [0:*]\n"
       "plot 'costs_tutorial.csv' every ::1 using 2:xtic(1) title 'parameters', '' every ::1 using "
       "3 title 'active parameters', '' every ::1 using 4 title 'forward FLOPs/token'\n";
  // Clustered on a log scale: the saved activations of 8 tokens are a thousandth of the weights.
  s += "set title 'Training memory, f32, 8 tokens (MiB, log scale)'\nset ylabel 'MiB'\n"
       "set yrange [*:*]\nset logscale y\n"
       "plot 'costs_tutorial.csv' every ::1 using 5:xtic(1) title 'weights', '' every ::1 using 6 "
       "title 'gradients', '' every ::1 using 7 title 'Adam moments', '' every ::1 using 8 title "
       "'saved activations'\nunset logscale y\n";
  s += "set title 'Growth with d_model (d_ff = 4 d_model; SwiGLU 8/3 d_model, the same "
       "parameters as ReLU)'\n"
       "set style data linespoints\nset yrange [*:*]\nset logscale xy\nset xlabel 'd_model'\n"
       "set ylabel 'parameters of one FFN layer'\nset xtics norotate\nset key top left\n"
       "plot 'cost_growth.csv' every ::1 using 1:2 lw 2 title 'relu (hidden under swiglu: the "
       "same parameters)', '' every ::1 using 1:4 lw 2 dt 2 title 'swiglu', '' every ::1 using "
       "1:6 lw 2 title 'gated (4 branches)', '' every ::1 using 1:8 lw 2 title 'moe (8 experts)'\n";
  s += "unset logscale\nset xlabel ''\nset style data histograms\nset xtics rotate by -30\n"
       "set title 'Speed, forward+backward: % of the bare products of its shapes'\n"
       "set ylabel '% of the bare products'\nset yrange [0:*]\nunset key\n";
  // Only the rows the measurement did not flag as noisy (speed.csv's noisy column) are drawn,
  // and only they are named; the figure says so when that is none.
  std::string drawn = "variant,percent_of_bare\n";
  for (const auto& [name, v] : st.results.speed->variants)
    if (!v.noisy()) drawn += fmt::format("{},{:.1f}\n", name, 100 * v.forward_backward_of_bare);
  st.write("speed_drawn.csv", drawn);
  if (drawn.find('\n') + 1 == drawn.size())
    s += "set yrange [0:1]\nunset ytics\nset xtics ('' 0)\n"
         "set label 'every row was noisy (see the speed table): nothing to draw' at graph 0.5, "
         "0.5 center\nplot -1 notitle\nunset label\n";
  else
    s += "plot 'speed_drawn.csv' every ::1 using 2:xtic(1) lc rgb '#1f77b4'\n";
  s += "unset multiplot\n";
  render_figure(st.dir, "ffn_performance_comparison", s);
}

void draw_moe_expert_load(const Study& st) {
  // Per setting a wide file: step, then layer l's expert e in column 2 + l·E + e. One row of
  // panels per setting, one column per layer, every panel on the same y range.
  const int E = st.results.moe->experts, L = st.scale.model.layers;
  const double top = std::max(2.0 / E, std::ceil(st.results.moe->load_peak * 20.0) / 20.0);
  std::string s = preamble("moe_expert_load", 160 + 420 * L, 1050);
  s += fmt::format(
      "set multiplot layout 3,{} title \"MoE: each expert's share of the assignments over "
      "training, every layer (dashed: uniform, 1/E)\"\n"
      "set yrange [0:{:.2f}]\nset xlabel 'optimizer step'\n",
      L, top);
  for (const std::string setting : {"none", "loss", "bias"}) {
    const std::string file = "moe_load_" + setting + ".csv";
    for (int l = 0; l < L; ++l) {
      s += fmt::format("set title '{}, layer {}'\nset ylabel '{}'\n",
                       setting == "none"   ? "no balancing"
                       : setting == "loss" ? "balancing loss 0.01"
                                           : "aux-loss-free bias",
                       l, l == 0 ? "share of assignments" : "");
      s += l + 1 == L ? "set key outside right\n" : "unset key\n";
      std::string plot = "plot ";
      for (int e = 0; e < E; ++e)
        plot +=
            fmt::format("'{}' every ::1 using 1:{} with lines lw 2 lc rgb '{}' title 'expert {}', ",
                        file, 2 + l * E + e, colour(static_cast<std::size_t>(e)), e);
      s += plot + fmt::format("{:.5f} with lines dt 2 lc rgb 'black' title '1/E'\n", 1.0 / E);
    }
  }
  s += "unset multiplot\n";
  render_figure(st.dir, "moe_expert_load", s);
}

void draw_activation_sparsity(const Study& st) {
  // Per variant, over every layer's units after training (seed 1): the share of units that
  // are dead (never non-zero on a census token) and, for the live ones, a histogram of how often
  // they are non-zero. One panel per variant on one y range, dead units in their own red bar.
  const int bins = 20;
  std::vector<std::string> names;
  std::map<std::string, std::vector<double>> hist;  // [0]: dead; [1 + b]: live, bin b
  std::map<std::string, double> near_dead;          // share of units, for the panel's title
  for (const auto& v : st.options.variants) {
    if (!st.census_trained.count(v) || st.census_trained.at(v).empty()) continue;
    std::vector<double> h(bins + 1, 0.0);
    std::size_t units = 0;
    std::int64_t near = 0;
    for (const UnitSparsity& layer : st.census_trained.at(v))
      units += layer.nonzero.size(), near += layer.near_dead_units();
    near_dead[v] = units ? static_cast<double>(near) / static_cast<double>(units) : 0.0;
    for (const UnitSparsity& layer : st.census_trained.at(v))
      for (double f : layer.frequency()) {
        const int b = f == 0.0 ? 0 : 1 + std::min(bins - 1, static_cast<int>(f * bins));
        h[static_cast<std::size_t>(b)] += 1.0 / static_cast<double>(units);
      }
    hist[v] = h;
    names.push_back(v);
  }
  std::string csv = "bin,frequency";
  for (const auto& v : names) csv += "," + v;
  csv += "\n";
  double top = 0;
  for (int b = 0; b <= bins; ++b) {
    csv += b == 0 ? "dead,-0.05" : fmt::format("live,{:.3f}", (b - 0.5) / bins);
    for (const auto& v : names) {
      csv += fmt::format(",{:.5f}", hist[v][static_cast<std::size_t>(b)]);
      top = std::max(top, hist[v][static_cast<std::size_t>(b)]);
    }
    csv += "\n";
  }
  st.write("unit_frequency_hist.csv", csv);
  // A variant whose units are all non-zero on nearly every token (the smooth gates) would be
  // one bar at the right by construction: it gets no panel, and the title names it.
  std::vector<std::size_t> drawn;
  std::vector<std::string> one_bar;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::vector<double>& h = hist[names[i]];
    if (h.back() > 0.99 && h[0] == 0.0)
      one_bar.push_back(names[i]);
    else
      drawn.push_back(i);
  }
  const int n = std::max<int>(1, static_cast<int>(drawn.size()));
  const int cols = std::min(3, n), rows = (n + cols - 1) / cols;
  std::string s = preamble("activation_sparsity", 500 * cols + 200, 80 + 330 * rows);
  s += fmt::format(
      "set multiplot layout {},{} title \"How often each hidden unit is non-zero over the census "
      "tokens\\n(seed 1, after training; red: dead units; near-dead: 0 or |h| < {} rms on "
      "every token){}\"\n"
      "set style fill solid 0.8 border -1\nset boxwidth 0.045\nset xrange [-0.1:1.02]\n"
      "set yrange [0:{:.2f}]\nunset key\n"
      "set xlabel 'fraction of its tokens on which the unit is non-zero'\n"
      "set ylabel 'fraction of units'\n",
      rows, cols, kNearZeroRelative,
      one_bar.empty()
          ? std::string()
          : fmt::format("\\nNot drawn, none dead and over 99 % of the units non-zero on more than "
                        "95 % of the tokens: {}",
                        fmt::join(one_bar, ", ")),
      std::min(1.0, std::ceil(top * 10.0) / 10.0 + 0.05));
  if (drawn.empty())
    s += "set label 'no variant has units that are zero on some tokens' at graph 0.5, 0.5 "
         "center\nplot -1 notitle\nunset label\n";
  for (std::size_t i : drawn) {
    const int column = 3 + static_cast<int>(i);
    auto share = [](double x) {
      return x > 0 && x < 0.0005 ? std::string("<0.1 %") : fmt::format("{:.1f} %", 100 * x);
    };
    s += fmt::format(
        "set title '{} ({} dead, {} near-dead)'\n"
        "plot 'unit_frequency_hist.csv' every ::1::1 using 2:{} with boxes lc rgb '#d62728', "
        "'' every ::2 using 2:{} with boxes lc rgb '#1f77b4'\n",
        names[i], share(hist[names[i]][0]), share(near_dead[names[i]]), column, column);
  }
  s += "unset multiplot\n";
  render_figure(st.dir, "activation_sparsity", s);
}

void draw_moe_specialisation(const Study& st) {
  // Per layer a heat map: expert (rows) by byte class (columns), the share of the expert's
  // assignments in that class over the class's share of all assignments, on a log2 scale
  // (0: no preference; +1: twice as often as the data has it).
  const auto& layers = st.results.moe->specialisation;
  check(!layers.empty(), "[study] the MoE specialisation figure needs the training stage's census");
  // One block per layer (gnuplot's index), the header a comment.
  std::string csv = "# layer,expert,class,share,base_share,log2_lift\n";
  for (std::size_t l = 0; l < layers.size(); ++l, csv += "\n\n")
    for (int e = 0; e < layers[l].experts; ++e)
      for (int c = 0; c < kByteClasses; ++c) {
        const double share = layers[l].share(e, c), base = layers[l].base_share(c);
        // A class the census never saw: no preference (white). A share of 0 (a class the expert
        // never takes, or an expert no token reached) is drawn grey; its lift is clamped.
        const double lift = base == 0 || layers[l].of_expert(e) == 0 ? 0.0
                            : share > 0                              ? std::log2(share / base)
                                                                     : -4.0;
        csv += fmt::format("{},{},{},{:.6g},{:.6g},{:.4f}\n", l, e, c, share, base,
                           std::max(-4.0, std::min(4.0, lift)));
      }
  st.write("moe_specialisation.csv", csv);
  const int L = static_cast<int>(layers.size());
  std::string s = preamble("moe_specialisation", 220 + 430 * L, 560);
  std::string tics;
  for (int c = 0; c < kByteClasses; ++c)
    tics += fmt::format("{}'{}' {}", c ? ", " : "", byte_class_name(c), c);
  s += fmt::format(
      "set multiplot layout 1,{} title \"Which bytes each expert takes (seed 1's MoE LM, "
      "trained)\\nlog2 of the expert's share of a class over the class's share of all "
      "assignments: red more often than the data has it, blue less, grey never\"\n"
      "set palette defined (-2 '#2166ac', 0 '#f7f7f7', 2 '#b2182b')\nset cbrange [-2:2]\n"
      "set cbtics ('≤ -2' -2, '-1' -1, '0' 0, '+1' 1, '≥ +2' 2)\n"
      "set xtics ({}) rotate by -40\nset ytics 1\nset xrange [-0.5:{}]\nunset grid\n"
      "set xlabel 'byte class'\nset ylabel 'expert'\n"
      // A class an expert never takes is drawn as no cell, over a grey ground.
      "set object 1 rect from graph 0, graph 0 to graph 1, graph 1 fc rgb '#9e9e9e' "
      "fs solid 1.0 noborder behind\n",
      std::max(1, L), tics, kByteClasses - 0.5);
  for (int l = 0; l < L; ++l)
    s += fmt::format(
        "set title 'layer {} (I(expert; class) = {:.3f} bits)'\nset yrange [-0.5:{}]\n{}"
        "plot 'moe_specialisation.csv' index {} using 3:2:($4 == 0 && $5 > 0 ? NaN : $6) "
        "with image notitle\n",
        l, layers[static_cast<std::size_t>(l)].mutual_information_bits(),
        layers[static_cast<std::size_t>(l)].experts - 0.5,
        // One colour bar, beside the last layer.
        l + 1 < L ? "unset colorbox\n" : "set colorbox\nset cblabel 'log2 lift'\nset rmargin 14\n",
        l);
  s += "unset multiplot\n";
  render_figure(st.dir, "moe_specialisation", s);
}

void draw_sweep(const Study& st) {
  std::string s = preamble("sweep", 1000, 650);
  s += "set title 'Why up-project: validation as the FFN widens (seed 1, equal steps)'\n"
       "set xlabel 'd_ff / d_model'\nset ylabel 'validation bits per byte'\nset logscale x 2\n"
       "set key top right\n"
       "plot 'sweep.csv' every ::1 using 1:2 with linespoints lw 2 lc rgb '#1f77b4' title 'relu', "
       "'' every ::1 using 1:3 with linespoints lw 2 lc rgb '#d62728' title 'swiglu (2/3 of the "
       "width: equal parameters)'\n";
  render_figure(st.dir, "sweep", s);
}

namespace {

// What a panel's names must not cover besides the points: a horizontal reference line (at
// `line_y` when `has_line`, from x_lo to x_hi).
struct Obstacles {
  bool has_line = false;
  double line_y = 0, x_lo = 0, x_hi = 0;
};

// Where each point's name goes: right of the point, or the nearest line below or above it
// where its box meets no other name, no point and not the reference line (gnuplot puts a
// label where it is told, over anything). Coordinates are the axes' units;
// `char_w` and `line_h` are a character's width and a line's height in them.
std::vector<double> label_rows(const std::vector<double>& x, const std::vector<double>& y,
                               const std::vector<std::size_t>& chars, double gap, double char_w,
                               double line_h, const Obstacles& avoid) {
  struct Box {
    double x0, x1, y0, y1;
    bool meets(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  };
  std::vector<Box> taken;
  for (std::size_t i = 0; i < x.size(); ++i)  // the points' markers
    taken.push_back({x[i] - char_w, x[i] + char_w, y[i] - line_h / 2, y[i] + line_h / 2});
  if (avoid.has_line)
    taken.push_back({avoid.x_lo, avoid.x_hi, avoid.line_y - line_h / 8, avoid.line_y + line_h / 8});
  std::vector<std::size_t> order(x.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return y[a] > y[b]; });
  std::vector<double> row(x.size());
  for (std::size_t i : order) {
    const double x0 = x[i] + gap, x1 = x0 + static_cast<double>(chars[i]) * char_w;
    for (int step = 0; step < 40; ++step) {  // 0, −1, +1, −2, +2, … lines
      const double shift = (step % 2 == 1 ? -1.0 : 1.0) * ((step + 1) / 2) * line_h;
      const Box b{x0, x1, y[i] + shift - line_h / 2, y[i] + shift + line_h / 2};
      bool clear = true;
      for (std::size_t k = 0; k < taken.size() && clear; ++k)
        clear = !b.meets(taken[k]);  // (its own marker ends left of the box: gap > char_w)
      if (clear || step == 39) {
        row[i] = y[i] + shift;
        taken.push_back(b);
        break;
      }
    }
  }
  return row;
}

}  // namespace

// A scatter panel's x range (room on the right for names) and its point labels, each where it
// meets no other name and nothing of `avoid`, as gnuplot commands ("set xrange", the labels,
// and a thin line from a name moved off its point's height back to the point; y range
// [lo, hi]).
std::string labelled_points(const std::vector<double>& x, const std::vector<double>& y,
                            const std::vector<std::string>& names, double lo, double hi,
                            Obstacles avoid = {}) {
  const double x_lo = *std::min_element(x.begin(), x.end());
  const double x_hi = *std::max_element(x.begin(), x.end());
  const double xspan = std::max(x_hi - x_lo, 0.05 * std::max(std::abs(x_hi), 1e-3));
  const double left = x_lo - 0.1 * xspan, right = x_hi + 0.35 * xspan;
  // A panel's plot area is about 600 by 440 pixels; a 9-point character about 6 by 16, and
  // a name starts 9 pixels right of its point.
  const double gap = (right - left) * 9.0 / 600;
  std::vector<std::size_t> chars;
  for (const std::string& n : names) chars.push_back(n.size());
  avoid.x_lo = left;
  avoid.x_hi = right;
  const double line_h = (hi - lo) * 16.0 / 440;
  const std::vector<double> row =
      label_rows(x, y, chars, gap, (right - left) * 6.0 / 600, line_h, avoid);
  std::string s = fmt::format("set xrange [{}:{}]\nset yrange [{}:{}]\nunset label\nunset arrow\n",
                              left, right, lo, hi);
  for (std::size_t i = 0; i < names.size(); ++i) {
    s += fmt::format("set label '{}' at {},{} left font ',9'\n", names[i], x[i] + gap, row[i]);
    if (std::abs(row[i] - y[i]) > line_h / 4)
      s += fmt::format("set arrow from {},{} to {},{} nohead lw 1 lc rgb '#909090'\n",
                       x[i] + gap * 0.9, row[i], x[i] + gap * 0.3, y[i]);
  }
  return s;
}

void draw_moe_pareto(const Study& st) {
  const auto& points = st.results.moe_axes->pareto;
  std::string s = preamble("moe_pareto", 1500, 620);
  const bool unbarred = std::any_of(points.begin(), points.end(), [](const auto& p) {
    return !std::isfinite(p.low) || !std::isfinite(p.high);
  });
  s += fmt::format(
      "set multiplot layout 1,2 title 'Each FFN against ReLU, paired by seed, against its cost "
      "(bars: the interval its verdict rests on{})'\n",
      unbarred ? "; a point without bars has one seed, and no interval" : "");
  s += "set ylabel 'validation bits/byte minus ReLU''s (below 0: better)'\nset key top right\n";
  // The y range covers every bar and 0 with a margin; each panel's x range leaves room for the
  // names.
  double lo = 0, hi = 0;
  for (const auto& p : points) {  // (a bound of NaN, one seed's, leaves them as they are)
    lo = std::min({lo, p.low, p.difference});
    hi = std::max({hi, p.high, p.difference});
  }
  const double yspan = std::max(hi - lo, 1e-3);
  lo -= 0.08 * yspan;
  hi += 0.12 * yspan;
  // Dense points blue, MoE red; each labelled with its name where it meets no other. Points
  // of one cost (the dense variants share ReLU's parameters by design) are drawn side by side,
  // a little apart, so that each bar stays its own; the CSV keeps the exact costs.
  auto panel = [&](int column, const std::string& xlabel, const std::string& title) {
    std::vector<double> x, y;
    std::vector<std::string> names;
    Obstacles zero_line;  // ReLU's dashed line at 0
    zero_line.has_line = true;
    for (const auto& p : points) {
      x.push_back((column == 2 ? static_cast<double>(p.params) : p.forward_flops) / 1e6);
      y.push_back(p.difference);
      names.push_back(p.name);
    }
    const auto [x_min, x_max] = std::minmax_element(x.begin(), x.end());
    const double span = std::max(*x_max - *x_min, 0.05 * std::max(std::abs(*x_max), 1e-3));
    // Costs within 1 % of the span would be drawn on top of each other: they are moved apart,
    // in the order of their costs (then the CSV's).
    std::vector<double> drawn = x;
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::vector<std::size_t> same;
      for (std::size_t k = 0; k < x.size(); ++k)
        if (std::abs(x[k] - x[i]) <= 0.01 * span) same.push_back(k);
      std::stable_sort(same.begin(), same.end(), [&](auto a, auto b) { return x[a] < x[b]; });
      const auto at = static_cast<double>(std::find(same.begin(), same.end(), i) - same.begin());
      drawn[i] = x[i] + (at - 0.5 * static_cast<double>(same.size() - 1)) * 0.03 * span;
    }
    const std::string block = fmt::format("$costs{}", column);
    s += block + " << EOD\n";
    // A comparison of one seed has no interval (low and high NaN): its point is drawn without
    // bars, not left out.
    for (std::size_t i = 0; i < points.size(); ++i) {
      const auto& p = points[i];
      s += fmt::format("{},{},{},{},{}\n", drawn[i], p.difference,
                       std::isfinite(p.low) ? p.low : p.difference,
                       std::isfinite(p.high) ? p.high : p.difference, p.moe ? "moe" : "dense");
    }
    s += "EOD\n";
    s += fmt::format("set title '{}'\nset xlabel '{}'\n", title, xlabel);
    s += labelled_points(drawn, y, names, lo, hi, zero_line);
    s += fmt::format(
        "plot 0 with lines lc rgb '#808080' dt 2 title 'ReLU (the reference)', "
        "{0} using 1:(strcol(5) eq 'dense' ? $2 : 1/0):3:4 "
        "with yerrorbars pt 7 ps 1.2 lc rgb '#1f77b4' title 'dense', "
        "{0} using 1:(strcol(5) eq 'moe' ? $2 : 1/0):3:4 with yerrorbars pt 5 "
        "ps 1.2 lc rgb '#d62728' title 'MoE'\n",
        block);
  };
  panel(2, "LM parameters (millions; points of one cost drawn side by side)", "Against parameters");
  panel(3, "LM forward FLOPs per token (millions; points of one cost drawn side by side)",
        "Against compute per token");
  s += "unset multiplot\n";
  render_figure(st.dir, "moe_pareto", s);
}

void draw_routing_families(const Study& st) {
  const RoutingResult& r = *st.results.routing;
  const bool masked = std::any_of(r.rows.begin(), r.rows.end(),
                                  [](const RoutingRow& row) { return row.objective == "masked"; });
  std::string s = preamble("routing_families", masked ? 1500 : 900, 620);
  s += fmt::format(
      "set multiplot layout 1,{} title 'Routing families on the MoE at equal compute: "
      "validation against the compute a token ran ({})'\nset key top right\n",
      masked ? 2 : 1,
      r.seeds == 1 ? "seed 1 alone"
                   : fmt::format("mean over {} seeds; bars: ± one standard deviation", r.seeds));
  // The grey band around top-k: ± one standard deviation of a single seed's paired difference
  // in the run's comparisons with ReLU (pooled), the scale below which one seed tells nothing
  // apart.
  const double band = st.results.training ? st.results.training->pooled_spread : 0.0;
  const bool bars = r.seeds > 1;
  // One panel an objective, each with its own ranges (bits per byte and per masked byte differ);
  // top-k red, the families blue, each labelled where it meets no other name.
  auto panel = [&](const std::string& objective, const std::string& ylabel,
                   const std::string& title) {
    std::vector<double> x, y;
    std::vector<std::string> names;
    double lo = 1e300, hi = -1e300, topk = NAN;
    for (const RoutingRow& row : r.rows) {
      if (row.objective != objective) continue;
      if (row.name == "topk") topk = row.outcome.mean;
      x.push_back(row.active_forward_flops / 1e6);
      y.push_back(row.outcome.mean);
      names.push_back(routing_family_title(row.name));  // ("relu" would read as the ReLU FFN)
      const double sd = std::isfinite(row.outcome.std) ? row.outcome.std : 0.0;
      lo = std::min(lo, row.outcome.mean - sd);
      hi = std::max(hi, row.outcome.mean + sd);
    }
    if (x.empty()) return;
    const bool banded = band > 0 && std::isfinite(topk);
    if (banded) lo = std::min(lo, topk - band), hi = std::max(hi, topk + band);
    const double yspan = std::max(hi - lo, 1e-3);
    s += "unset object 1\n";
    if (banded)
      s += fmt::format(
          "set object 1 rect from graph 0, first {} to graph 1, first {} fc rgb '#e0e0e0' "
          "fs solid 1.0 noborder behind\n",
          topk - band, topk + band);
    s += fmt::format(
        "set title '{}'\nset xlabel 'LM forward FLOPs per token as run (millions)'\n"
        "set ylabel '{}'\n",
        title, ylabel);
    s += labelled_points(x, y, names, lo - 0.1 * yspan, hi + 0.15 * yspan);
    // Bars only where there are several seeds; one seed is a point alone.
    const std::string style = bars ? ":5 with yerrorbars" : " with points";
    s += fmt::format(
        "plot 'routing_families.csv' every ::1 using ($3/1e6):(strcol(1) eq '{0}' && "
        "strcol(2) ne 'topk' ? $4 : 1/0){1} pt 7 ps 1.2 "
        "lc rgb '#1f77b4' title 'routing family', "
        "'' every ::1 using ($3/1e6):(strcol(1) eq '{0}' && strcol(2) eq 'topk' ? $4 : 1/0)"
        "{1} pt 5 ps 1.4 lc rgb '#d62728' title 'top-k (the reference)'{2}\n",
        objective, style,
        banded ? fmt::format(", NaN with filledcurves fc rgb '#e0e0e0' title 'top-k ± {:.3f}: "
                             "one seed''s paired spread'",
                             band)
               : "");
  };
  panel("causal", "validation bits per byte (lower is better)",
        "Causal LM: the families that decide per token");
  panel("masked", "validation bits per masked byte (lower is better)",
        "Masked objective: every family");
  s += "unset multiplot\n";
  render_figure(st.dir, "routing_families", s);
}

void draw_scaling(const Study& st) {
  const ScalingResult& r = *st.results.scaling;
  const std::size_t tasks = r.tasks.size();
  std::string s = preamble("scaling", tasks > 1 ? 1500 : 900, 1100);
  // Top: each variant's validation (the size effect dwarfs the variants' differences); below:
  // its paired difference to ReLU of the same size and task, where the gap's trend shows.
  s += fmt::format(
      "set multiplot layout 2,{} title 'Across model sizes: validation (mean over seeds; bars: ± "
      "one standard deviation), and the paired difference to ReLU (bars: the interval of its "
      "last look)'\n"
      "set logscale x\nset format x '1e%T'\nset key top right\n"
      "set xlabel 'training FLOPs of a run'\n",
      tasks);
  auto labels_of = [&](const std::string& task) {
    std::vector<std::string> labels;
    for (const ScalingCell& c : r.cells)
      if (c.task == task)
        for (const ScalingEntry& e : c.variants)
          if (std::find(labels.begin(), labels.end(), e.outcome.variant) == labels.end())
            labels.push_back(e.outcome.variant);
    return labels;
  };
  auto title = [](const std::string& task) {
    return task == "masked" ? "masked objective (bidirectional)" : "causal LM";
  };
  for (const std::string& task : r.tasks) {
    s += fmt::format("set title '{}'\nset ylabel '{}'\n", title(task),
                     task == "masked" ? "validation bits per masked byte"
                                      : "validation bits per byte (lower is better)");
    const std::vector<std::string> labels = labels_of(task);
    std::vector<std::string> plots;
    for (std::size_t i = 0; i < labels.size(); ++i)
      plots.push_back(fmt::format(
          "'scaling.csv' every ::1 using (strcol(1) eq '{0}' && strcol(2) eq '{1}' ? $4 : 1/0):5:6 "
          "with yerrorlines lw 2 pt 7 lc rgb '{2}' title '{1}'",
          task, labels[i], colour(i)));
    s += fmt::format("plot {}\n", fmt::join(plots, ", "));
  }
  for (const std::string& task : r.tasks) {
    s += fmt::format(
        "set title '{}: difference to ReLU (below 0: better than ReLU)'\n"
        "set ylabel 'variant − ReLU, bits per {}byte'\n",
        title(task), task == "masked" ? "masked " : "");
    const std::vector<std::string> labels = labels_of(task);
    std::vector<std::string> plots{"0 with lines dt 2 lw 2 lc rgb '#1f77b4' title 'relu'"};
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] == "relu") continue;
      plots.push_back(fmt::format(
          "'scaling.csv' every ::1 using (strcol(1) eq '{0}' && strcol(2) eq '{1}' ? $4 : "
          "1/0):8:9:10 with yerrorlines lw 2 pt 7 lc rgb '{2}' title '{1}'",
          task, labels[i], colour(i)));
    }
    s += fmt::format("plot {}\n", fmt::join(plots, ", "));
  }
  s += "unset multiplot\n";
  render_figure(st.dir, "scaling", s);
}

}  // namespace ffnlab::study
