// Real models' FFN configurations, with sources.
#include "ffnlab/analysis/zoo.hpp"

namespace ffnlab {

namespace {

FFNConfig dense(FFNKind kind, Activation act, std::int64_t d_model, std::int64_t d_ff, bool bias) {
  FFNConfig c;
  c.kind = kind;
  c.act = Act{act};
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.bias = bias;
  return c;
}

FFNConfig moe(Activation act, FFNKind expert, std::int64_t d_model, std::int64_t expert_d_ff,
              int experts, int top_k, int shared, std::int64_t shared_d_ff) {
  FFNConfig c = dense(FFNKind::moe, act, d_model, expert_d_ff, false);
  c.moe.num_experts = experts;
  c.moe.top_k = top_k;
  c.moe.expert_kind = expert;
  c.moe.router_bias = false;
  c.moe.num_shared = shared;
  c.moe.shared_d_ff = shared_d_ff;
  return c;
}

// Qwen1.5-MoE-A2.7B: a gated shared expert, top-k weights not renormalised (norm_topk_prob).
FFNConfig qwen_moe() {
  FFNConfig c = moe(Activation::silu, FFNKind::glu, 2048, 1408, 60, 4, 1, 5632);
  c.moe.shared_gate = true;
  c.moe.normalize = false;
  return c;
}

// DeepSeek-V3: sigmoid scores, 4 of 8 expert groups kept, scaling 2.5, the balancing bias.
FFNConfig deepseek_v3() {
  FFNConfig c = moe(Activation::silu, FFNKind::glu, 7168, 2048, 256, 8, 1, 2048);
  c.moe.score = ScoreFunc::sigmoid;
  c.moe.groups = 8;
  c.moe.topk_groups = 4;
  c.moe.scaling = 2.5f;
  c.moe.balance_bias = true;
  return c;
}

std::vector<ZooModel> build() {
  using A = Activation;
  using K = FFNKind;
  std::vector<ZooModel> z{
      {"BERT-base", "dense", 12, dense(K::plain, A::gelu, 768, 3072, true),
       "Devlin et al. 2019, section 3 (L 12, H 768, feed-forward 4H); bert-base-uncased "
       "config.json (hidden_size 768, "
       "intermediate_size 3072, hidden_act gelu)",
       ""},
      {"BERT-large", "dense", 24, dense(K::plain, A::gelu, 1024, 4096, true),
       "Devlin et al. 2019, section 3 (BERT-large: L 24, H 1024, A 16, 340M parameters; "
       "feed-forward 4H = 4096, footnote 3) and appendix A.2 (gelu)",
       ""},
      {"GPT-2 124M", "dense", 12, dense(K::plain, A::gelu_tanh, 768, 3072, true),
       "gpt2 config.json (n_embd 768, n_inner null = 4·n_embd, activation_function gelu_new)", ""},
      {"GPT-2 1.5B", "dense", 48, dense(K::plain, A::gelu_tanh, 1600, 6400, true),
       "gpt2-xl config.json (n_layer 48, n_embd 1600, n_inner null = 4·n_embd)", ""},
      {"GPT-3 175B", "dense", 96, dense(K::plain, A::gelu, 12288, 49152, true),
       "Brown et al. 2020, table 2.1 (d_model 12288, 96 layers) and section 2.1 (d_ff = 4·d_model)",
       "the paper says GELU without naming the approximation"},
      {"T5 v1.1 Base", "dense", 24, dense(K::glu, A::gelu_tanh, 768, 2048, false),
       "google/t5-v1_1-base config.json (d_model 768, d_ff 2048, feed_forward_proj gated-gelu, "
       "12 encoder + 12 decoder blocks)",
       "GEGLU with the tanh GELU; no biases"},
      {"PaLM 540B", "dense", 118, dense(K::glu, A::silu, 18432, 73728, false),
       "Chowdhery et al. 2022, section 2 (SwiGLU, no biases, d_ff = 4·d_model) and table 1 "
       "(d_model 18432, 118 layers)",
       "SwiGLU at 4·d_model, not 8/3: 1.5× the parameters of a plain FFN of that width"},
      {"LLaMA-2 7B", "dense", 32, dense(K::glu, A::silu, 4096, 11008, false),
       "meta-llama/Llama-2-7b-hf config.json (hidden_size 4096, intermediate_size 11008, "
       "hidden_act silu, 32 layers)",
       ""},
      {"LLaMA-2 70B", "dense", 80, dense(K::glu, A::silu, 8192, 28672, false),
       "meta-llama/Llama-2-70b-hf config.json (hidden_size 8192, intermediate_size 28672, 80 "
       "layers)",
       ""},
      {"Mistral 7B", "dense", 32, dense(K::glu, A::silu, 4096, 14336, false),
       "mistralai/Mistral-7B-v0.1 config.json (hidden_size 4096, intermediate_size 14336, "
       "hidden_act silu)",
       ""},
      {"Switch-Base-128", "MoE", 12, moe(A::relu, K::plain, 768, 3072, 128, 1, 0, 0),
       "google/switch-base-128 config.json (d_model 768, d_ff 3072, dense_act_fn relu, "
       "is_gated_act false, num_experts 128, num_selected_experts 1, expert_capacity 64, "
       "num_sparse_encoder_layers 6, num_sparse_decoder_layers 6)",
       "the released checkpoint: a sparse layer every other block, 6 encoder + 6 decoder MoE "
       "blocks; two-matrix ReLU experts, no biases. The paper's own configuration table may "
       "differ from the released checkpoint; this row is the checkpoint's alone"},
      {"GLaM 64B/64E", "MoE", 32, moe(A::gelu, K::plain, 8192, 32768, 64, 2, 0, 0),
       "Du et al. 2022, section 4 and the table of model sizes (64B/64E: 64 layers, d_model "
       "8192, expert hidden size 32768, 64 experts, top-2, an MoE layer every other block)",
       "the 32 other blocks have dense gated-GELU FFNs (the paper's section 4), not in this row; "
       "the paper does not say the experts' activation: two-matrix GELU experts, as here, give "
       "its 96.6 B activated parameters with the rest of the model"},
      {"Mixtral 8x7B", "MoE", 32, moe(A::silu, K::glu, 4096, 14336, 8, 2, 0, 0),
       "mistralai/Mixtral-8x7B-v0.1 config.json (hidden_size 4096, intermediate_size 14336, "
       "num_local_experts 8, num_experts_per_tok 2)",
       ""},
      {"Qwen1.5-MoE-A2.7B", "MoE", 24, qwen_moe(),
       "Qwen/Qwen1.5-MoE-A2.7B config.json (hidden_size 2048, moe_intermediate_size 1408, "
       "num_experts 60, num_experts_per_tok 4, shared_expert_intermediate_size 5632)",
       "the shared expert has a sigmoid gate; top-k weights are not renormalised"},
      {"DeepSeek-V3", "MoE", 58, deepseek_v3(),
       "deepseek-ai/DeepSeek-V3 config.json (hidden_size 7168, moe_intermediate_size 2048, "
       "n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, 61 layers, "
       "first_k_dense_replace 3)",
       "sigmoid scores, 8 groups of which 4 are kept, routed_scaling_factor 2.5; the first 3 "
       "blocks are dense SwiGLU FFNs of width 18432"},
  };
  for (auto& m : z) validate(m.ffn);
  return z;
}

}  // namespace

const std::vector<ZooModel>& zoo_models() {
  static const std::vector<ZooModel> models = build();
  return models;
}

}  // namespace ffnlab
