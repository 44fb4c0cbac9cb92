"""The PyTorch reference of ffnlab's TransformerLM (layers/transformer_lm.hpp), written from
the usual definitions: token embedding (+ learned or sinusoidal positions), pre- or post-norm
blocks of causal multi-head attention (q/k/v/o Linear layers) and an FFN, a final norm and a
tied or untied head. Parameter names are ffnlab's (Hugging Face LLaMA style), so state dicts
move between the two without renaming. Used by the golden training test and the side-by-side
benchmark (bench/torch_train.py)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


def act(name, x):
    return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
            "identity": lambda v: v}[name](x)


class DenseFFN(nn.Module):
    """plain: down(act(up(x))); glu: down(act(gate(x)) * up(x))."""

    def __init__(self, d, f, kind, act_name, bias):
        super().__init__()
        self.kind, self.act = kind, act_name
        if kind == "glu":
            self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x):
        if self.kind == "glu":
            return self.down_proj(act(self.act, self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(act(self.act, self.up_proj(x)))


class Expert(nn.Module):
    """A gated expert (gate_proj, up_proj, down_proj), or with glu=False a plain one (up_proj,
    down_proj), as ffnlab names them."""

    def __init__(self, d, f, act_name, glu=True, bias=False):
        super().__init__()
        self.act, self.glu = act_name, glu
        if glu:
            self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x):
        if not self.glu:
            return self.down_proj(act(self.act, self.up_proj(x)))
        return self.down_proj(act(self.act, self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Mixtral-style: softmax router, top-k, renormalised weights, SwiGLU experts without bias
    (or plain experts, biases and a router bias, as the study's MoE has them);
    aux loss = coef * E * sum_e f_e P_e, f_e = (choices of e) / T as in HF (ffnlab's "topk")."""

    def __init__(self, d, f, experts, top_k, act_name, aux_coef, glu=True, bias=False,
                 router_bias=False):
        super().__init__()
        self.k, self.aux_coef = top_k, aux_coef
        self.gate = nn.Linear(d, experts, bias=router_bias)
        self.experts = nn.ModuleList(Expert(d, f, act_name, glu, bias) for _ in range(experts))
        self.aux = torch.zeros(())

    def forward(self, x):
        logits = self.gate(x)
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                y.index_add_(0, rows, expert(x[rows]) * w[rows, slot, None])
        E = len(self.experts)
        f = F.one_hot(idx, E).float().sum((0, 1)) / x.shape[0]  # HF: sums to k
        self.aux = self.aux_coef * E * (f * probs.mean(0)).sum()
        return y


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, b = cfg["d_model"], cfg["attn_bias"]
        self.cfg = cfg
        self.input_layernorm = nn.LayerNorm(d, eps=cfg["norm_eps"])
        self.post_attention_layernorm = nn.LayerNorm(d, eps=cfg["norm_eps"])
        self.self_attn = nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, n, nn.Linear(d, d, bias=b))
        ffn = cfg["ffn"]
        if ffn["kind"] == "moe":
            self.mlp = MoE(d, ffn["d_ff"], ffn["experts"], ffn["top_k"], ffn["act"],
                           ffn["aux_coef"], ffn.get("glu", True), ffn.get("bias", False),
                           ffn.get("router_bias", False))
        else:
            self.mlp = DenseFFN(d, ffn["d_ff"], ffn["kind"], ffn["act"], ffn["bias"])

    def attention(self, x, B, S):
        a, H = self.self_attn, self.cfg["heads"]
        D = x.shape[-1]
        q, k, v = (p(x).view(B, S, H, D // H).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B * S, D)
        return a.o_proj(o)

    def forward(self, x, B, S):
        x = x + self.attention(self.input_layernorm(x), B, S)
        return x + self.mlp(self.post_attention_layernorm(x))


class LM(nn.Module):
    """cfg: vocab, d_model, layers, heads, context, attn_bias, norm_eps, tied_head, ffn{...}."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab"], cfg["d_model"])
        self.model.embed_positions = nn.Embedding(cfg["context"], cfg["d_model"])
        nn.init.normal_(self.model.embed_tokens.weight, std=0.02)
        nn.init.normal_(self.model.embed_positions.weight, std=0.02)
        self.model.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["layers"]))
        self.model.norm = nn.LayerNorm(cfg["d_model"], eps=cfg["norm_eps"])
        if not cfg["tied_head"]:
            self.lm_head = nn.Linear(cfg["d_model"], cfg["vocab"], bias=False)
        if cfg.get("init_std", 0) > 0:  # GPT-2: every matrix N(0, std), biases zero
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=cfg["init_std"])
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

    def forward(self, ids, targets, S):
        B = ids.numel() // S
        x = self.model.embed_tokens(ids) + self.model.embed_positions.weight[:S].repeat(B, 1)
        for blk in self.model.layers:
            x = blk(x, B, S)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.cfg["tied_head"] else self.lm_head.weight
        logits = x @ head.t()
        ce = F.cross_entropy(logits, targets)
        aux = sum((b.mlp.aux for b in self.model.layers if isinstance(b.mlp, MoE)), torch.zeros(()))
        return ce, aux


def optimizer(model, lr, betas, wd, eps=1e-8):
    """AdamW with decay on matrices (2-D parameters) only, as ffnlab does."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)


def lr_at(step, peak, warmup, steps, min_ratio):
    """ffnlab's schedule (train/schedule.hpp)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
