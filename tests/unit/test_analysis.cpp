// Measured statistics and whole-model costs: the activation census on known tensors, and the
// closed-form Transformer costs against the parameters of built models.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <fstream>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/analysis/sparsity.hpp"
#include "ffnlab/analysis/specialisation.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/layers/transformer_lm.hpp"

using namespace ffnlab;

TEST(Sparsity, CountsZerosNearZerosAndDeadUnitsSeparately) {
  // 4 tokens × 3 units: unit 0 is zero on 2 tokens, unit 1 on every token (dead), unit 2 never;
  // one value of unit 2 is tiny (near zero, not zero).
  const Tensor h = Tensor::from({4, 3}, {0.f, 0.f, 1.f,    //
                                         2.f, 0.f, 1e-7f,  //
                                         0.f, 0.f, -3.f,   //
                                         1.f, 0.f, 2.f});
  UnitSparsity s;
  add_hidden(s, h);
  EXPECT_EQ(s.tokens, 4);
  EXPECT_EQ(s.zeros, 6);
  EXPECT_EQ(s.near_zeros, 7);
  EXPECT_DOUBLE_EQ(s.zero_fraction(), 0.5);
  EXPECT_EQ(s.dead_units(), 1);
  const auto f = s.frequency();
  EXPECT_DOUBLE_EQ(f[0], 0.5);
  EXPECT_DOUBLE_EQ(f[1], 0.0);
  EXPECT_DOUBLE_EQ(f[2], 1.0);
  // A later batch where unit 1 fires: it is no longer dead; counts accumulate.
  add_hidden(s, Tensor::from({1, 3}, {1.f, 1.f, 1.f}));
  EXPECT_EQ(s.tokens, 5);
  EXPECT_EQ(s.dead_units(), 0);
  EXPECT_DOUBLE_EQ(s.frequency()[1], 0.2);
  EXPECT_THROW(add_hidden(s, Tensor({2, 4})), Error);  // another width
}

TEST(Sparsity, NearDeadUnitsAreThoseNearZeroOnEveryRow) {
  // A smooth gate is never exactly 0, so it has no dead units by definition; near-dead counts
  // the units within |h| < kNearZeroRelative·rms on every row. rms here is about 1.22, so the
  // band is |h| < 1.22e-3. Unit 0 is tiny but non-zero on every row (near-dead, not dead);
  // unit 1 is tiny on one row and large on the other (live); unit 2 is exactly 0 (dead, and so
  // near-dead); unit 3 is large (live).
  const Tensor h = Tensor::from({2, 4}, {1e-5f, 1e-5f, 0.f, 2.f,  //
                                         -2e-5f, 2.f, 0.f, -2.f});
  UnitSparsity s;
  add_hidden(s, h);
  EXPECT_EQ(s.dead_units(), 1);
  EXPECT_EQ(s.near_dead_units(), 2);
  // A value just outside the band brings unit 0 back to life.
  add_hidden(s, Tensor::from({1, 4}, {0.5f, 1.f, 0.f, 1.f}));
  EXPECT_EQ(s.near_dead_units(), 1);
  EXPECT_EQ(s.dead_units(), 1);
  // An all-zero batch has a band of width 0: its zeros are still not clear of zero.
  UnitSparsity z;
  add_hidden(z, Tensor::from({1, 2}, {0.f, 0.f}));
  EXPECT_EQ(z.near_dead_units(), 2);
}

TEST(Sparsity, CountsEachExpertsUnitsOverTheRowsRoutedToIt) {
  // 2 experts of 2 units; expert 0 gets rows 0-2, expert 1 gets row 3, expert 2 none.
  // Expert 0: unit 0 non-zero on 1 of its 3 rows, unit 1 never (dead). Expert 1: both fire.
  // Expert 2: no rows, so its units never fire: dead.
  const Tensor h = Tensor::from({4, 2}, {0.f, 0.f,  //
                                         1.f, 0.f,  //
                                         0.f, 0.f,  //
                                         2.f, 3.f});
  const std::vector<std::int64_t> offsets{0, 3, 4, 4};
  UnitSparsity s;
  add_expert_hidden(s, h, offsets);
  ASSERT_EQ(s.nonzero.size(), 6u);
  const auto f = s.frequency();
  EXPECT_DOUBLE_EQ(f[0], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(f[1], 0.0);
  EXPECT_DOUBLE_EQ(f[2], 1.0);
  EXPECT_DOUBLE_EQ(f[3], 1.0);
  EXPECT_EQ(s.dead_units(), 3);       // expert 0's unit 1 and both of expert 2's
  EXPECT_EQ(s.near_dead_units(), 3);  // the same: every non-zero value here is large
  EXPECT_DOUBLE_EQ(s.zero_fraction(), 5.0 / 8.0);
  EXPECT_THROW(add_hidden(s, Tensor({1, 6})), Error);  // dense rows into an expert census
  const std::vector<std::int64_t> wrong{0, 3, 5};
  EXPECT_THROW(add_expert_hidden(s, h, wrong), Error);  // offsets that do not end at the rows
}

TEST(Specialisation, ClassesBytesAndMeasuresWhatTheRouterKnowsOfThem) {
  EXPECT_EQ(byte_class_name(byte_class(' ', 'a')), "word start");
  EXPECT_EQ(byte_class_name(byte_class('b', 'a')), "in word");
  EXPECT_EQ(byte_class_name(byte_class('a', 'Q')), "upper case");
  EXPECT_EQ(byte_class_name(byte_class('a', '7')), "digit");
  EXPECT_EQ(byte_class_name(byte_class('a', '.')), "punctuation");
  EXPECT_EQ(byte_class_name(byte_class('a', '\n')), "newline");
  EXPECT_EQ(byte_class_name(byte_class('a', ' ')), "space");
  EXPECT_EQ(byte_class_name(byte_class('a', 0xC3)), "other");
  // "ab ab" in one window of 5, top-1: a router that sends word starts to expert 0 and the rest
  // to expert 1 knows the class completely; classes: start, in word, space, start, in word.
  const std::vector<std::int32_t> ids{'a', 'b', ' ', 'a', 'b'};
  ExpertSpecialisation perfect;
  perfect.experts = 2;
  perfect.add(std::vector<std::int32_t>{0, 1, 1, 0, 1}, 1, ids, 5);
  EXPECT_EQ(perfect.assignments(), 5);
  EXPECT_DOUBLE_EQ(perfect.share(0, byte_class(' ', 'a')), 1.0);
  EXPECT_DOUBLE_EQ(perfect.base_share(byte_class(' ', 'a')), 0.4);
  // I = H(expert) here, since the expert is a function of the class: 2/5 and 3/5.
  const double h = -(0.4 * std::log2(0.4) + 0.6 * std::log2(0.6));
  EXPECT_NEAR(perfect.mutual_information_bits(), h, 1e-12);
  // A router that ignores the class (each class split evenly, top-2 over both experts): 0.
  ExpertSpecialisation blind;
  blind.experts = 2;
  blind.add(std::vector<std::int32_t>{0, 1, 1, 0, 0, 1, 1, 0, 0, 1}, 2, ids, 5);
  EXPECT_NEAR(blind.mutual_information_bits(), 0.0, 1e-12);
  // The first byte of each window counts as after a space: with windows of 1, every letter starts
  // a word.
  ExpertSpecialisation windows;
  windows.experts = 2;
  windows.add(std::vector<std::int32_t>{0, 0, 0, 0, 0}, 1, ids, 1);
  EXPECT_DOUBLE_EQ(windows.base_share(byte_class(' ', 'a')), 0.8);
  EXPECT_THROW(windows.add(std::vector<std::int32_t>{2, 0, 0, 0, 0}, 1, ids, 5), Error);
}

TEST(TransformerCost, ParametersEqualTheBuiltModel) {
  for (const char* variant : {"relu", "swiglu", "gated", "moe"})
    for (bool tied : {true, false})
      for (PositionKind pos : {PositionKind::learned, PositionKind::rope}) {
        LMConfig c;
        c.d_model = 32;
        c.heads = 4;
        c.layers = 2;
        c.context = 16;
        c.tied_head = tied;
        c.positions = pos;
        c.norm = tied ? NormKind::layernorm : NormKind::rmsnorm;
        c.ffn = variant_config(variant, 32, 48, !tied);
        TransformerLM lm(c, 1);
        const TransformerCost t = transformer_cost(c, 16);
        EXPECT_EQ(t.params, lm.parameters().count()) << variant << " tied " << tied;
        EXPECT_EQ(t.ffn_params, 2 * count_params(c.ffn));
        EXPECT_GT(t.ffn_forward_flops, 0);
        EXPECT_NEAR(t.forward_flops,
                    t.ffn_forward_flops + t.attention_forward_flops + t.head_forward_flops,
                    0.05 * t.forward_flops);  // the rest is norms and residual adds
      }
}

TEST(TransformerCost, TheTutorialEncoderIsTwoThirdsFFN) {
  // 6 post-norm blocks of (512, 8 heads, ReLU 2048): per block the FFN has 2,099,712 parameters
  // and attention 4·512² + 4·512 = 1,050,624, so the FFN holds 2/3 of the block parameters.
  const LMConfig c = tutorial_encoder_config();
  const TransformerCost t = transformer_cost(c, 100, /*with_embeddings=*/false);
  EXPECT_EQ(t.ffn_params, 6 * 2099712);
  EXPECT_EQ(t.attention_params, 6 * 1050624);
  EXPECT_EQ(t.norm_params, 6 * 2 * 1024);
  EXPECT_EQ(t.embedding_params, 0);
  EXPECT_NEAR(static_cast<double>(t.ffn_params) / t.params, 0.666, 0.001);
  EXPECT_THROW(transformer_cost(c, 101), Error);  // longer than the context
}

// The speed measurement reports what it timed: GFLOP/s are the closed-form matrix FLOPs of the
// tokens over the measured seconds, for the layer and for the bare products (for MoE: k experts'
// products over all tokens, without the router's).
// A layer cannot beat its own bare products: tables print no ratio above 100 %.
TEST(LayerSpeed, OfBareTextNeverShowsALayerAboveItsProducts) {
  EXPECT_EQ(of_bare_text(0.974), "97%");
  EXPECT_EQ(of_bare_text(1.0), "100%");
  EXPECT_EQ(of_bare_text(1.02), "~100%");
  EXPECT_EQ(of_bare_text(kMaxOfBare + 0.01), "(>bare)");
}

TEST(LayerSpeed, RatesAreTheClosedFormFlopsOverTheMeasuredTimes) {
  for (const char* variant : {"swiglu", "moe"}) {
    const FFNConfig c = variant_config(variant, 32, 64, true);
    const std::int64_t T = 16;
    const LayerSpeed s = measure_layer_speed(c, T, 0.001);
    const FFNCost k = ffn_cost(c, T);
    ASSERT_GT(s.forward_s, 0) << variant;
    ASSERT_GT(s.forward_backward_s, 0) << variant;
    EXPECT_NEAR(s.forward_gflops * s.forward_s * 1e9, k.forward.matmul * T,
                1e-6 * k.forward.matmul * T);
    EXPECT_NEAR(s.forward_backward_gflops * s.forward_backward_s * 1e9,
                (k.forward.matmul + k.backward.matmul) * T, 1e-6 * k.forward.matmul * T);
    EXPECT_TRUE(std::isfinite(s.bare_forward_gflops) && s.bare_forward_gflops > 0) << variant;
    EXPECT_TRUE(std::isfinite(s.bare_forward_backward_gflops) && s.bare_forward_backward_gflops > 0)
        << variant;
  }
  EXPECT_THROW(measure_layer_speed(variant_config("relu", 8, 8, true), 0, 0.1), Error);
}

// The yardstick of a model's FLOP utilisation: the bare products of one training micro-batch
// count three times the forward's matrix work (projections, attention scores over the sequence,
// the FFN as costs.hpp counts it, the head) and take a measured, positive time.
TEST(ModelProducts, CountTheModelsMatrixWorkAndTimeIt) {
  for (const char* variant : {"relu", "swiglu", "moe", "noisy", "residual", "soft"}) {
    LMConfig c;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 4;
    c.context = 16;
    const std::string v = variant;
    c.ffn = variant_config(v == "relu" || v == "swiglu" ? variant : "moe", 32, 64, true);
    if (v == "moe") c.ffn.moe.num_shared = 1;
    if (v == "noisy") c.ffn.moe.noisy_topk = true;          // a second router product
    if (v == "residual") c.ffn.moe.gating_residual = true;  // MoE++'s gate map
    if (v == "soft") {  // the slots' logits, dispatch and combine
      c.ffn.moe.routing = RoutingKind::soft;
      c.ffn.moe.slots = 2;
      c.ffn.moe.aux_coef = 0.0f;
      c.ffn.moe.z_coef = 0.0f;
      c.causal = false;
    }
    const std::int64_t B = 3, S = 16, T = B * S, D = 32;
    const ModelProducts m = measure_model_products(c, B, S, Precision::f32, 0.001);
    // (Noisy top-k's noise product runs in training only; costs.hpp's per-token FLOPs leave it
    // out, a training step does it.)
    const double noise = v == "noisy" ? 2.0 * D * c.ffn.moe.routed_experts() : 0.0;
    const double forward =
        2.0 * (8.0 * D * D + 4.0 * S * D + ffn_cost(c.ffn, S).forward.matmul + noise) +
        2.0 * D * c.vocab;
    EXPECT_NEAR(m.flops, 3.0 * forward * T, 1e-9 * m.flops) << variant;
    if (c.ffn.kind == FFNKind::moe) {  // the experts' part, at the closed form's experts a token
      EXPECT_EQ(m.experts_per_token, experts_per_token(c.ffn, S)) << variant;
      const double expert =
          2.0 * 2.0 * D * c.ffn.expert_d_ff() * (c.ffn.moe.expert_kind == FFNKind::glu ? 1.5 : 1.0);
      EXPECT_NEAR(m.expert_flops, 2.0 * 3.0 * expert * m.experts_per_token * T, 1e-6 * m.flops)
          << variant;
    }
    EXPECT_GT(m.seconds, 0.0) << variant;
    EXPECT_TRUE(std::isfinite(m.gflops()) && m.gflops() > 0) << variant;
  }
  EXPECT_THROW(measure_model_products(LMConfig{}, 0, 16, Precision::f32, 0.1), Error);
}

// The machine a report names: a CPU model, one of the three ISA names, and this CPU's flags.
TEST(Machine, NamesTheCpuAndItsVectorInstructions) {
  const Machine& m = this_machine();
  EXPECT_FALSE(m.cpu.empty());
  EXPECT_TRUE(m.isa == "AVX-512" || m.isa == "AVX2" || m.isa == "other") << m.isa;
  EXPECT_GE(m.processors, 1);
  __builtin_cpu_init();
  EXPECT_EQ(m.isa == "AVX-512", __builtin_cpu_supports("avx512f") != 0);
  EXPECT_NE(m.describe().find(m.isa), std::string::npos) << m.describe();
  EXPECT_EQ(&m, &this_machine());  // read once
}

// Its family and model, as /proc/cpuinfo gives them, against the CPUID instruction's leaf 1:
// the numbers that tell a Zen 3 from a Zen 4 where a hypervisor names both "AMD EPYC".
#if defined(__x86_64__) || defined(__i386__)
TEST(Machine, NamesTheCpuFamilyAndModel) {
  const Machine& m = this_machine();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!std::ifstream("/proc/cpuinfo") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
    GTEST_SKIP() << "no /proc/cpuinfo or no CPUID leaf 1";
  const unsigned base = (eax >> 8) & 0xf;
  const unsigned family = base + (base == 0xf ? (eax >> 20) & 0xff : 0);
  // The extended model counts from family 6 on, as Linux's /proc/cpuinfo reads it.
  const unsigned model = ((eax >> 4) & 0xf) | (family >= 6 ? ((eax >> 16) & 0xf) << 4 : 0);
  EXPECT_EQ(m.family, static_cast<int>(family));
  EXPECT_EQ(m.model, static_cast<int>(model));
  EXPECT_NE(m.describe().find(fmt::format("family {} model {}", family, model)), std::string::npos)
      << m.describe();
}
#endif

// The FMA width a nominal peak counts, per CPU: Zen 3 and Zen 4 (which splits a 512-bit FMA in
// halves) retire 32 f32 FLOPs a cycle, Zen 5 64 (its probe reached 453 GFLOP/s on 2 cores of a
// 2.1 GHz base clock: 3.4 times the 32-a-cycle nominal, 1.7 times the 64), Intel's AVX-512 64.
TEST(Machine, CountsTheFmaWidthOfEachCpu) {
  const auto width = [](std::string isa, bool amd, int family, int model) {
    Machine m;
    m.isa = std::move(isa);
    m.amd = amd;
    m.family = family;
    m.model = model;
    return m.f32_flops_per_cycle();
  };
  EXPECT_EQ(width("AVX2", true, 25, 1), 32);        // Zen 3
  EXPECT_EQ(width("AVX-512", true, 25, 17), 32);    // Zen 4 (EPYC Genoa)
  EXPECT_EQ(width("AVX-512", true, 26, 2), 64);     // Zen 5 (EPYC Turin)
  EXPECT_EQ(width("AVX-512", true, 26, 0x24), 32);  // Strix Point (256-bit datapaths)
  EXPECT_EQ(width("AVX-512", true, 26, 0x60), 32);  // Krackan Point (256-bit datapaths)
  EXPECT_EQ(width("AVX-512", true, 26, 0x70), 64);  // Strix Halo (full width)
  EXPECT_EQ(width("AVX-512", true, 26, 0x44), 64);  // Granite Ridge, Fire Range
  EXPECT_EQ(width("AVX-512", false, 6, 143), 64);   // Intel Sapphire Rapids
  EXPECT_EQ(width("other", false, 0, 0), 0);
  // This machine's nominal peak is that width at its clock on its cores.
  const Machine& m = this_machine();
  if (m.mhz > 0 && m.f32_flops_per_cycle() > 0) {
    EXPECT_DOUBLE_EQ(nominal_peak_flops(1), m.f32_flops_per_cycle() * m.mhz * 1e6);
  }
}

// A peak probe holds when every thread together reached 75 % of its cores at one thread's
// rate: two vCPUs that a shared host gave one core's pipes (two threads at one thread's rate,
// the 103 against 200 GFLOP/s seen on a 2-core EPYC guest) do not.
TEST(PeakProbe, HoldsOnlyWhenTheThreadsReachTheirCores) {
  EXPECT_TRUE((PeakProbe{200e9, 106e9, 2}.held()));
  EXPECT_FALSE((PeakProbe{103e9, 103e9, 2}.held()));
  EXPECT_FALSE((PeakProbe{158e9, 106e9, 2}.held()));  // just under 75 % of 2 x 106
  EXPECT_TRUE((PeakProbe{50e9, 0, 1}.held()));        // one core: nothing to compare
  const PeakProbe here = measure_peak_flops(false, 0.02);
  EXPECT_GT(here.flops, 0.0);
  EXPECT_GE(here.cores, 1);
  EXPECT_EQ(here.one_thread > 0, omp_get_max_threads() > 1);
}

namespace ffnlab {
namespace {

// Utilisation counts the work done: the experts' products at the experts a token measured to
// take (not scaled by a closed form that can be ~1e-6), and a rate above the bare products'
// is not a utilisation.
TEST(Utilisation, CountsTheExpertsMeasuredAndRefusesTheImpossible) {
  ModelProducts moe;
  moe.flops = 100;        // at the closed form's experts per token
  moe.expert_flops = 40;  // of which the experts' products
  moe.experts_per_token = 1e-6;
  moe.expert_token_flops = 2;  // one token in one expert
  moe.tokens = 10;
  EXPECT_DOUBLE_EQ(moe.flops_at(3.0), 100 - 40 + 2 * 3.0 * 10);
  EXPECT_DOUBLE_EQ(moe.flops_at(0.0), 60);
  EXPECT_DOUBLE_EQ(moe.flops_at(-1.0), 100);  // not measured
  ModelProducts dense;
  dense.flops = 100;
  EXPECT_DOUBLE_EQ(dense.flops_at(3.0), 100);
  EXPECT_DOUBLE_EQ(flop_utilisation(50, 100), 0.5);
  EXPECT_TRUE(std::isnan(flop_utilisation(150, 100)));
  EXPECT_TRUE(std::isnan(flop_utilisation(1, 0)));
  EXPECT_TRUE(std::isnan(flop_utilisation(0, 100)));
}

}  // namespace
}  // namespace ffnlab
