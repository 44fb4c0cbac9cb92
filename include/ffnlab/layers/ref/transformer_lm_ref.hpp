// Scalar reference of the Transformer language model, forward only, in any floating type,
// built from the scalar op references and the FFN references. Parameters are taken by their
// Hugging Face names, so the reference is independent of the fast model's buffer layout. The
// fast model's gradients are checked by central differences of this forward in double
// precision (tests/unit/test_transformer_lm.cpp). Dropout applies the same counter-based masks
// as the fast model (ops/dropout.hpp); MoE routing can be held fixed (see moe_ffn_ref.hpp).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/ref/dense_ffn_ref.hpp"
#include "ffnlab/layers/ref/moe_ffn_ref.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/ops/ref/attention_ref.hpp"
#include "ffnlab/ops/ref/linear_ref.hpp"
#include "ffnlab/ops/ref/loss_ref.hpp"
#include "ffnlab/ops/ref/norm_ref.hpp"
#include "ffnlab/ops/ref/positions_ref.hpp"

namespace ffnlab::ref {

template <typename T>
struct TransformerLM {
  LMConfig config;
  std::map<std::string, std::vector<T>> params;  // by full name
  std::uint64_t dropout_seed = 0, dropout_stream = 0;
  bool train = false;  // dropout on
  bool hold_routing = false;
  std::vector<MoEFFN<T>> moe;      // per layer, kept so that routing can be held
  std::vector<T> previous_logits;  // MoE++'s gating residual: the last MoE layer's router logits
  // Result of forward: cross-entropy and Σ MoE aux losses (with their coefficients).
  T cross_entropy = 0, aux = 0;

  const std::vector<T>& p(const std::string& name) const { return params.at(name); }
  const T* maybe(const std::string& name) const {
    auto it = params.find(name);
    return it == params.end() ? nullptr : it->second.data();
  }

  void dropout(std::vector<T>& x, std::uint64_t stream) const {
    if (!train || config.dropout == 0.f) return;
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = dropout_uniform(dropout_seed, stream, i) >= config.dropout
                 ? x[i] / (T(1) - T(config.dropout))
                 : T(0);
  }

  std::vector<T> norm(const std::vector<T>& x, const std::string& pre, std::int64_t tokens) const {
    std::vector<T> y(x.size());
    norm_forward<T>(config.norm == NormKind::layernorm, y.data(), x.data(),
                    p(pre + "weight").data(), maybe(pre + "bias"), tokens, config.d_model,
                    config.norm_eps);
    return y;
  }

  std::vector<T> attention(const std::vector<T>& x, const std::string& pre, std::int64_t batch,
                           std::int64_t seq) const {
    const std::int64_t D = config.d_model, tokens = batch * seq;
    std::vector<T> w, b;
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      const auto& wn = p(pre + n + ".weight");
      w.insert(w.end(), wn.begin(), wn.end());
      if (config.attn_bias) {
        const auto& bn = p(pre + n + ".bias");
        b.insert(b.end(), bn.begin(), bn.end());
      }
    }
    std::vector<T> qkv(tokens * 3 * D), a(tokens * D), y(tokens * D);
    linear_forward<T>(qkv.data(), x.data(), w.data(), config.attn_bias ? b.data() : nullptr, tokens,
                      D, 3 * D);
    if (config.positions == PositionKind::rope)
      rope<T>(qkv.data(), tokens, seq, 3 * D, 2 * D, D / config.heads, config.rope_theta);
    attention_forward<T>(a.data(), qkv.data(), batch, seq, config.heads, D, config.causal);
    linear_forward<T>(y.data(), a.data(), p(pre + "o_proj.weight").data(),
                      maybe(pre + "o_proj.bias"), tokens, D, D);
    return y;
  }

  std::vector<T> ffn(const std::vector<T>& x, int layer, const std::string& pre,
                     std::int64_t tokens) {
    const FFNConfig& c = config.ffn;
    std::vector<T> y;
    if (c.kind == FFNKind::moe) {
      if (moe.size() <= static_cast<std::size_t>(layer)) moe.resize(layer + 1);
      MoEFFN<T>& m = moe[layer];
      m.config = c;
      for (const auto& [name, v] : params)
        if (name.rfind(pre, 0) == 0) m.params[name.substr(pre.size())] = v;
      m.hold_routing = hold_routing;
      if (c.moe.gating_residual) m.gate_residual = previous_logits;
      m.forward(y, x, tokens);
      if (c.moe.gating_residual) previous_logits = m.logits;
      // Every loss of the layer's aux_loss: balance, z, top-p's entropy, and ReLU routing's L1
      // by its current coefficient (state kept with the weights, gate.l1_coef).
      aux += T(c.moe.aux_coef) * m.balance + T(c.moe.z_coef) * m.z +
             T(c.moe.entropy_coef) * m.entropy;
      if (const auto l1_coef = params.find(pre + "gate.l1_coef"); l1_coef != params.end())
        aux += l1_coef->second.at(0) * m.l1;
      return y;
    }
    DenseFFN<T> d;
    d.config = c;
    for (const auto& n : ffnlab::DenseFFN::in_names(c)) {
      const auto& w = p(pre + n + ".weight");
      d.w_in.insert(d.w_in.end(), w.begin(), w.end());
      if (c.bias) {
        const auto& b = p(pre + n + ".bias");
        d.b_in.insert(d.b_in.end(), b.begin(), b.end());
      }
    }
    d.w_out = p(pre + ffnlab::DenseFFN::out_name(c) + ".weight");
    if (c.bias) d.b_out = p(pre + ffnlab::DenseFFN::out_name(c) + ".bias");
    d.forward(y, x, tokens);
    return y;
  }

  static void add(std::vector<T>& y, const std::vector<T>& a) {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += a[i];
  }

  // Returns cross_entropy + aux for B = ids.size()/seq sequences.
  T forward(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& targets,
            std::int64_t seq) {
    const std::int64_t D = config.d_model, tokens = static_cast<std::int64_t>(ids.size());
    const std::int64_t batch = tokens / seq;
    const std::uint64_t base = dropout_stream * static_cast<std::uint64_t>(2 * config.layers + 1);
    aux = 0;
    previous_logits.clear();
    std::vector<T> x(tokens * D);
    std::vector<T> sin_table;
    const T* pos = maybe("model.embed_positions.weight");
    if (config.positions == PositionKind::sinusoidal) {
      sin_table.resize(seq * D);
      for (std::int64_t s = 0; s < seq; ++s)
        for (std::int64_t c = 0; c < D; ++c) sin_table[s * D + c] = sinusoid<T>(s, c, D);
      pos = sin_table.data();
    }
    embed<T>(x.data(), ids.data(), p("model.embed_tokens.weight").data(), pos, tokens, seq, D);
    dropout(x, base);
    for (int l = 0; l < config.layers; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      const std::uint64_t s = base + 1 + 2 * l;
      if (config.pre_norm) {
        auto a =
            attention(norm(x, pre + "input_layernorm.", tokens), pre + "self_attn.", batch, seq);
        dropout(a, s);
        add(x, a);
        auto f = ffn(norm(x, pre + "post_attention_layernorm.", tokens), l, pre + "mlp.", tokens);
        dropout(f, s + 1);
        add(x, f);
      } else {
        auto a = attention(x, pre + "self_attn.", batch, seq);
        dropout(a, s);
        add(x, a);
        x = norm(x, pre + "input_layernorm.", tokens);
        auto f = ffn(x, l, pre + "mlp.", tokens);
        dropout(f, s + 1);
        add(x, f);
        x = norm(x, pre + "post_attention_layernorm.", tokens);
      }
    }
    if (config.final_norm) x = norm(x, "model.norm.", tokens);
    const auto& head = config.tied_head ? p("model.embed_tokens.weight") : p("lm_head.weight");
    std::vector<T> logits(tokens * config.vocab);
    linear_forward<T>(logits.data(), x.data(), head.data(), nullptr, tokens, D, config.vocab);
    cross_entropy =
        ffnlab::ref::cross_entropy<T>(logits.data(), targets.data(), tokens, config.vocab);
    return cross_entropy + aux;
  }
};

}  // namespace ffnlab::ref
