"""PyTorch definitions of the blocks ffnlab.torch replaces, as Hugging Face writes them
(LlamaMLP; MixtralSparseMoeBlock with its MixtralBlockSparseTop2MLP experts), without needing
transformers: the references of ffnlab's Python tests, benchmark and example. Needs torch."""
import torch
from torch import nn


class LlamaMLP(nn.Module):
    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    """returns_logits: return (hidden, router_logits [tokens, experts]) as Hugging Face's block
    does (its decoder layer unpacks both and sums a balancing loss over the logits); False: the
    hidden states alone."""

    def __init__(self, d_model, d_ff, experts, top_k, returns_logits=False):
        super().__init__()
        self.top_k = top_k
        self.returns_logits = returns_logits
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(d_model, d_ff) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        weights = torch.softmax(logits, dim=1, dtype=torch.float)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = nn.functional.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            idx, top = torch.where(mask[e])
            if top.numel():
                out.index_add_(0, top, expert(x[top]) * weights[top, idx, None])
        return (out.reshape(shape), logits) if self.returns_logits else out.reshape(shape)
