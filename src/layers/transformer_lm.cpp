// The language model: embeddings, blocks, final norm, head and loss, with one parameter buffer.
#include "ffnlab/layers/transformer_lm.hpp"

#include <algorithm>
#include <random>
#include <string_view>

#include "check.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/ops/embedding.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ffnlab/ops/positions.hpp"
#include "ffnlab/scratch.hpp"
#include "hash.hpp"

namespace ffnlab {

namespace {

const char* const kEmbed = "model.embed_tokens.weight";
const char* const kPos = "model.embed_positions.weight";
const char* const kNorm = "model.norm.";
const char* const kHead = "lm_head.weight";

std::string block_prefix(int i) {
  return "model.layers." + std::to_string(i) + ".";
}

// Seeds of the sub-layers, far apart so that no two draw the same stream.
std::uint64_t sub_seed(std::uint64_t seed, int i) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i) * 1000003ull + 17;
}

}  // namespace

TransformerLM::TransformerLM(const LMConfig& config, std::uint64_t seed, HeldExperts held)
    : config_(config) {
  validate(config_);
  const std::int64_t V = config_.vocab, D = config_.d_model;
  for (int i = 0; i < config_.layers; ++i)
    blocks_.push_back(std::make_unique<TransformerBlock>(config_, sub_seed(seed, i + 1), held));
  if (config_.final_norm) final_norm_ = std::make_unique<Norm>(config_.norm, D, config_.norm_eps);

  params_.declare(kEmbed, {V, D});
  if (config_.positions == PositionKind::learned) params_.declare(kPos, {config_.context, D});
  for (int i = 0; i < config_.layers; ++i)
    params_.declare_all(blocks_[i]->parameters(), block_prefix(i));
  if (final_norm_) params_.declare_all(final_norm_->parameters(), kNorm);
  if (!config_.tied_head) params_.declare(kHead, {V, D});
  params_.allocate();
  bind_parameters();

  // torch.nn's defaults: embeddings N(0, 0.02) (GPT-2's, nn.Embedding would use N(0, 1)), Linear
  // layers as built; then, with init_std > 0, GPT-2's N(0, init_std) for every matrix. Each
  // matrix draws from a stream of its own, keyed by the seed and its name, never from what was
  // drawn before it: two models of one seed that differ only in their FFN (the study's variants)
  // start from the same embedding, attention and head, which makes their comparison paired.
  // (From one stream in declaration order, a wider FFN in layer 0 shifted every later layer's
  // draws, so variants of one seed shared little beyond the embedding and layer 0's attention.)
  const std::uint64_t base = sub_seed(seed, 0);
  auto stream = [base](std::string_view name) {
    return std::mt19937_64(splitmix64(base ^ fnv1a64(name.data(), name.size())));
  };
  std::mt19937_64 rng = stream(kEmbed);
  init_normal(embed_, 0.02f, rng);
  if (config_.positions == PositionKind::learned) {
    rng = stream(kPos);
    init_normal(pos_, 0.02f, rng);
  }
  if (!config_.tied_head) {
    rng = stream(kHead);
    init_uniform(head_, 1.f / std::sqrt(static_cast<float>(D)), rng);
  }
  if (config_.positions == PositionKind::sinusoidal) pos_ = sinusoidal_table(config_.context, D);
  if (config_.init_std > 0.f)
    for (Parameter& p : params_.list()) {
      if (!p.trainable) continue;  // state such as the MoE balancing bias keeps its zero
      if (p.shape.size() == 2) {
        rng = stream(p.name);
        init_normal(p.value, config_.init_std, rng);
      } else if (p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0) {
        p.value.zero();
      }
    }
}

void TransformerLM::bind_parameters() {
  embed_ = params_.at(kEmbed).value;
  dembed_ = params_.at(kEmbed).grad;
  if (config_.positions == PositionKind::learned) {
    pos_ = params_.at(kPos).value;
    dpos_ = params_.at(kPos).grad;
  }
  for (int i = 0; i < config_.layers; ++i) {
    auto& b = *blocks_[i];
    b.move_parameters(params_.child_values(b.parameters(), block_prefix(i)),
                      params_.child_grads(b.parameters(), block_prefix(i)));
  }
  if (final_norm_)
    final_norm_->move_parameters(params_.child_values(final_norm_->parameters(), kNorm),
                                 params_.child_grads(final_norm_->parameters(), kNorm));
  head_ = config_.tied_head ? embed_ : params_.at(kHead).value;
  dhead_ = config_.tied_head ? dembed_ : params_.at(kHead).grad;
  // The buffer holds embeddings, blocks 0..L−1, the final norm and the head, in that order;
  // backward finishes them from the back.
  auto offset_of = [&](const std::string& name) { return params_.at(name).offset; };
  block_offset_.assign(static_cast<std::size_t>(config_.layers), 0);
  for (int i = 0; i < config_.layers; ++i)
    block_offset_[i] = offset_of(block_prefix(i) + blocks_[i]->parameters().list()[0].name);
  head_offset_ = final_norm_         ? offset_of(kNorm + final_norm_->parameters().list()[0].name)
                 : config_.tied_head ? params_.grads().numel()
                                     : offset_of(kHead);
}

bool TransformerLM::is_decayed(const Parameter& p) {
  return p.shape.size() == 2;
}

void TransformerLM::set_precision(Precision p) {
  precision_ = p;
  for (auto& b : blocks_) b->set_precision(p);
}

void TransformerLM::set_data_parallel(ProcessGroup* group, std::int64_t first_token,
                                      bool expert_parallel, ProcessGroup* expert_group) {
  dropout_first_ = static_cast<std::uint64_t>(first_token * config_.d_model);
  for (auto& b : blocks_) b->set_data_parallel(group, first_token, expert_parallel, expert_group);
}

HeldExperts TransformerLM::held_experts() const {
  for (const auto& b : blocks_)
    if (b->ffn().config().kind == FFNKind::moe) return b->ffn().held_experts();
  return {};
}

std::vector<TransformerLM::ExpertSpan> TransformerLM::expert_spans() {
  std::vector<ExpertSpan> out;
  const float* base = params_.grads().f32();
  for (auto& b : blocks_)
    for (const Tensor& t : b->ffn().expert_grads()) {
      const std::int64_t begin = t.f32() - base;
      out.push_back({begin, begin + t.numel(), static_cast<int>(t.dim(0))});
    }
  std::sort(out.begin(), out.end(),
            [](const ExpertSpan& a, const ExpertSpan& b) { return a.begin < b.begin; });
  return out;
}

void TransformerLM::set_dropout_stream(std::uint64_t seed, std::uint64_t stream) {
  dropout_seed_ = seed;
  dropout_stream_ = stream;
  for (int i = 0; i < config_.layers; ++i)  // each layer its own sequence of draws
    blocks_[i]->ffn().set_random_stream(sub_seed(seed, i + 1), stream);
}

double TransformerLM::forward(std::span<const std::int32_t> ids,
                              std::span<const std::int32_t> targets, std::int64_t seq, bool train) {
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  check(seq > 0 && seq <= config_.context, "[lm] sequence length {} outside [1, context = {}]", seq,
        config_.context);
  check(T > 0 && T % seq == 0, "[lm] {} tokens are not whole sequences of {}", T, seq);
  check(targets.empty() || targets.size() == ids.size(), "[lm] {} targets for {} tokens",
        targets.size(), ids.size());
  train_ = false;  // set once this forward has finished: a failed one leaves no backward
  seq_ = seq;
  ids_.assign(ids.begin(), ids.end());
  targets_.assign(targets.begin(), targets.end());
  const int L = config_.layers;
  const std::uint64_t base = dropout_stream_ * static_cast<std::uint64_t>(2 * L + 1);
  xs_.resize(static_cast<std::size_t>(L + 1));

  embedding_forward(xs_[0], ids, embed_);
  if (pos_.defined()) position_add_forward(xs_[0], pos_, seq);
  if (train && config_.dropout > 0.f)
    dropout_forward(xs_[0], xs_[0], config_.dropout, dropout_seed_, base, dropout_first_);
  // Each FFN's context: the sequence length (set by its block), the previous layer's router
  // logits (the first layer has none), which MoE++'s gating residuals add to their own, and the
  // tokens' ids (hash routing).
  const Tensor* previous_logits = nullptr;
  for (int i = 0; i < L; ++i) {
    FeedForward& ffn = blocks_[i]->ffn();
    ffn.context().previous_logits = previous_logits;
    ffn.context().first_layer = previous_logits == nullptr;
    ffn.context().token_ids = ids_.data();
    blocks_[i]->forward(xs_[i + 1], xs_[i], seq, train, dropout_seed_, base + 1 + 2 * i);
    previous_logits = &ffn.router_logits();
  }
  const Tensor* z = &xs_[L];
  if (final_norm_) {
    final_norm_->forward(z_, xs_[L]);
    z = &z_;
  }
  logits_.ensure({T, config_.vocab});
  // Training with native bf16 products converts z and the head once, for this product and the
  // backward's two (converts_operands_once); at many rows the head is packed instead
  // (packs_weights); otherwise matmul reads them.
  head_operands_.start(train, precision_, T);
  const ProductOperands& operand = head_operands_;
  linear_forward(logits_, operand(z16_, *z), operand.weight(head_operand_, head_), nullptr,
                 precision_, nullptr, false, operand.forward_packing(head_operand_));
  const double loss = targets.empty() ? 0.0 : cross_entropy_forward(probs_, logits_, targets);
  train_ = train;
  return loss;
}

void TransformerLM::backward(float scale, float aux_scale,
                             const std::function<void(std::int64_t)>& ready) {
  check(train_ && !targets_.empty(), "[lm] backward needs a training forward with targets");
  head_operands_.check_unchanged(precision_, "[lm]");
  const int L = config_.layers;
  for (auto& b : blocks_) b->ffn().set_aux_loss_scale(aux_scale < 0.f ? scale : aux_scale);
  cross_entropy_backward(dlogits_, probs_, targets_, scale);
  const Tensor& z = final_norm_ ? z_ : xs_[L];
  dz_.ensure(z.shape());
  const ProductOperands& op = head_operands_;  // what the forward's product read
  linear_backward(&dz_, dhead_, nullptr, op.gradient(dlogits_), op.saved(z16_, z),
                  op.saved_weight(head_operand_, head_), precision_, false,
                  op.dx_packing(head_operand_));
  Tensor* d = &dz_;
  if (final_norm_) {
    final_norm_->backward(dx_a_, dz_);
    d = &dx_a_;
  }
  if (ready) ready(head_offset_);  // a tied head's gradient is the embedding's: done last
  for (int i = L - 1; i >= 0; --i) {
    Tensor& out = d == &dx_a_ ? dx_b_ : dx_a_;
    // The next layer may have read this layer's logits (gating residual): their gradient.
    blocks_[i]->ffn().context().logits_grad =
        i + 1 < L ? &blocks_[i + 1]->ffn().previous_logits_grad() : nullptr;
    blocks_[i]->backward(out, *d);
    d = &out;
    if (ready) ready(block_offset_[i]);
  }
  if (config_.dropout > 0.f)
    dropout_backward(*d, *d, config_.dropout, dropout_seed_,
                     dropout_stream_ * static_cast<std::uint64_t>(2 * L + 1), dropout_first_);
  if (dpos_.defined()) position_add_backward(dpos_, *d, seq_);
  embedding_backward(dembed_, *d, ids_);
  if (ready) ready(0);
}

double TransformerLM::aux_loss() const {
  double sum = 0;
  for (const auto& b : blocks_) sum += b->ffn().aux_loss();
  return sum;
}

const FeedForward& TransformerLM::ffn(int layer) const {
  check(layer >= 0 && layer < static_cast<int>(blocks_.size()), "[lm] no layer {} (of {})", layer,
        blocks_.size());
  return blocks_[layer]->ffn();
}

std::vector<FFNStats> TransformerLM::ffn_stats() const {
  std::vector<FFNStats> out;
  for (const auto& b : blocks_) out.push_back(b->ffn().stats());
  return out;
}

void TransformerLM::set_diagnostics(bool on) {
  for (auto& b : blocks_) b->set_diagnostics(on);
}

std::vector<LayerDiagnostics> TransformerLM::diagnostics() const {
  std::vector<LayerDiagnostics> out;
  for (const auto& b : blocks_) out.push_back(b->diagnostics());
  return out;
}

void TransformerLM::after_optimizer_step() {
  // Updates that follow the whole model read the sum of every layer's part, added in block order
  // (ReLU routing: one L1 coefficient follows the sparsity of all ReLU-routed layers together,
  // as ReMoE; each such layer holds a copy and makes the same update from the same sum).
  ModelSums all;
  for (const auto& b : blocks_) add_sums(all, b->ffn().model_sums());
  for (auto& b : blocks_) b->ffn().after_optimizer_step(&all);
}

}  // namespace ffnlab
