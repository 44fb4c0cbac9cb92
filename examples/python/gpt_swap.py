"""A small PyTorch GPT trained on text, once with its own MLP blocks and once with them swapped
for ffnlab.torch.FFN (the same weights at the start), in alternating steps of the same run:
prints both losses and both speeds. Both run in the environment that puts PyTorch at its best
(bench/torch_at_best.py: the script re-executes itself with a caching allocator, the OpenBLAS
variables unset and OMP_WAIT_POLICY=PASSIVE), so that its speeds compare.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python/gpt_swap.py \
        [--text /usr/share/games/fortunes/fortunes] [--steps 60] [--mlp swiglu|moe]
"""
import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_at_best  # noqa: E402 (the repository's bench/)

torch_at_best.reexec_at_best()  # before torch is imported

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ffnlab  # noqa: E402
import ffnlab.torch as ft  # noqa: E402
from ffnlab.hf_blocks import LlamaMLP, MixtralSparseMoeBlock  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = mlp

    def forward(self, x, mask):
        h = self.n1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class GPT(nn.Module):
    def __init__(self, make_mlp, d=128, layers=4, heads=4, seq=128):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's; N(0, 1) with a tied head starts at a loss of ~100
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, make_mlp()) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask[: tokens.shape[1], : tokens.shape[1]])
        return self.norm(x) @ self.embed.weight.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="/usr/share/games/fortunes/fortunes")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--mlp", choices=["swiglu", "moe"], default="swiglu")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ffnlab.set_threads(a.threads)
    print(f"PyTorch {torch.__version__}, {a.threads} threads: {torch_at_best.runtime(torch)}",
          flush=True)

    data = torch.tensor(list(open(a.text, "rb").read()), dtype=torch.long)
    if len(data) < a.seq + 2:
        raise SystemExit(f"{a.text}: {len(data)} bytes, fewer than --seq {a.seq} + 2")
    torch.manual_seed(0)
    if a.mlp == "swiglu":
        make = lambda: LlamaMLP(128, 344)  # noqa: E731
    else:
        make = lambda: MixtralSparseMoeBlock(128, 256, experts=8, top_k=2)  # noqa: E731
    torch_model = GPT(make, seq=a.seq)
    ffn_model = copy.deepcopy(torch_model)
    for b in ffn_model.blocks:
        b.mlp = ft.from_module(b.mlp)
    models = {"pytorch": torch_model, "ffnlab": ffn_model}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=3e-3) for k, m in models.items()}
    seconds = {k: [] for k in models}
    losses = {k: [] for k in models}
    gen = torch.Generator().manual_seed(1)
    for step in range(a.steps):
        start = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=gen)
        batch = torch.stack([data[s: s + a.seq + 1] for s in start.tolist()])
        for name, model in models.items():  # alternating: drift hits both alike
            t0 = time.perf_counter()
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
            opts[name].zero_grad()
            loss.backward()
            opts[name].step()
            seconds[name].append(time.perf_counter() - t0)
            losses[name].append(loss.item())
        if step % 10 == 0 or step == a.steps - 1:
            print(f"step {step:4d}  loss pytorch {losses['pytorch'][-1]:.4f}  "
                  f"ffnlab {losses['ffnlab'][-1]:.4f}", flush=True)
    tokens = a.batch * a.seq
    med = {k: sorted(v[len(v) // 5:])[len(v[len(v) // 5:]) // 2] for k, v in seconds.items()}
    print(f"\nmedian step after warm-up ({a.mlp} MLPs, {tokens} tokens per step, "
          f"{a.threads} threads):")
    for k in models:
        print(f"  {k:8s} {med[k] * 1e3:8.1f} ms  {tokens / med[k]:9.0f} tokens/s")
    print(f"  ffnlab MLPs: {med['pytorch'] / med['ffnlab']:.2f}x the whole model's speed")


if __name__ == "__main__":
    main()
